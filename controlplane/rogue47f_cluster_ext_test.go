package controlplane_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The forty-seventh hostile pass, the job leases through a follower. A
// lineage's rate budget is each replica's, and the upkeep of a lease its
// sender holds is admitted from that lease's allowance once the budget is
// spent (lease_allowance.go) — but only by the replica whose coordinator
// serves the leases: a follower, which forwards every worker message to
// the leader, admitted none that way, so a sibling reaching the control
// plane through a follower (a load balancer chose it) had only its node's
// reserve (2/s, bursts of 16) once a rogue of its lineage spent the
// lineage's budget on that follower. A rogue could so freeze its sibling's
// jobs: their renewals, sent in time, refused resource_exhausted at the
// follower until the leases expired.

// The rogue spends its lineage's budget on the follower, round after
// round, while its sibling renews its sixty leases (30 s, every 10 s)
// through that follower, half unary and half on a lease channel the
// follower relays. Every renewal is admitted (the follower reads the lease
// from the store to see that the sender holds it) and judged by the
// leader, and none expires. Before, 16 of the 60 renewals of the first
// round were admitted (the node's reserve) and the rest refused.
func TestRogue47FARogueSpendingTheBudgetOnAFollowerCannotFreezeASiblingsLeases(t *testing.T) {
	clk := clock.NewManual(epoch)
	replicas, lead := startReplicasWith(t, 2, testserver.WithClock(clk), func(cfg *controlplane.Config) { cfg.RateLimit, cfg.RateBurst = 5, 128 })
	follower := followersOf(replicas, lead)[0]
	ctx := context.Background()
	admin := lead.AdminClients()
	root := register(t, admin, "planner")
	rootC := lead.Clients(root.Credential)
	honest := spawn(t, rootC, root.Node.NodeId, "honest")
	rogue := spawn(t, rootC, root.Node.NodeId, "rogue")
	honestLead := lead.Clients(honest.Credential)
	honestFollower := follower.Clients(honest.Credential)
	rogueFollower := follower.Clients(rogue.Credential)

	const jobs = 60
	leases := make([]*tetherv1.Lease, jobs)
	for i := range leases {
		r, err := admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: fmt.Sprintf("r47f-%02d", i), HolderIdentity: honest.Node.NodeId,
			LeaseDuration: durationpb.New(30 * time.Second), AckTimeout: durationpb.New(10 * time.Second)}))
		if err != nil {
			t.Fatalf("offer %d: %v", i, err)
		}
		leases[i], _ = unary{honestLead}.send(t, ack(r.Msg.Lease))
	}
	channel := openChannel(t, honestFollower)

	for round := uint64(1); round <= 4; round++ {
		clk.Advance(10 * time.Second)
		// The rogue spends what the follower's budget of the lineage
		// refilled (a read the follower serves itself).
		spendLineage(t, rogueFollower, rogue.Node.NodeId)
		if _, err := rogueFollower.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: rogue.Node.NodeId})); connect.CodeOf(err) != connect.CodeResourceExhausted {
			t.Fatalf("round %d: the rogue's next call on the follower: %v, want resource_exhausted", round, err)
		}
		want := clk.Now().Add(30 * time.Second)
		accepted, refused := 0, []string{}
		for i, l := range leases {
			var (
				got     *tetherv1.Lease
				d       *tetherv1.Decision
				errText string
			)
			if i%2 == 0 {
				got, d, errText = unary{honestFollower}.try(t, renew(l, round))
			} else {
				got, d, errText = channel.tryOrEnded(t, renew(l, round))
				if errText != "" {
					// A refusal may end the stream: the next on a new one.
					channel = openChannel(t, honestFollower)
				}
			}
			if errText != "" {
				refused = append(refused, errText)
				continue
			}
			wantDecision(t, "the sibling's renewal through the follower", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RENEWED)
			if !got.ExpiresAt.AsTime().Equal(want) {
				t.Fatalf("round %d: lease %d renewed to %s, want %s", round, i+1, got.ExpiresAt.AsTime(), want)
			}
			leases[i] = got
			accepted++
		}
		if accepted != jobs {
			t.Fatalf("round %d: %d of the sibling's %d renewals through the follower admitted, once the rogue spent the lineage's budget there; first refusal: %s",
				round, accepted, jobs, refused[0])
		}
	}
	clk.Advance(10 * time.Second)
	for _, l := range leases {
		got, err := admin.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: l.JobId}))
		if err != nil {
			t.Fatal(err)
		}
		if g := got.Msg.Lease; g.State != tetherv1.LeaseState_LEASE_STATE_ACTIVE || g.RenewSequence != 4 || g.LeaseExpired {
			t.Fatalf("a lease the sibling renewed in time through the follower, 50 s in: %v", g)
		}
	}
}
