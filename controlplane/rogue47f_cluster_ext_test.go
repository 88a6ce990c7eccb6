package controlplane_test

import (
	"context"
	"fmt"
	"strings"
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

// siblingsOnAFollower starts two replicas sharing a manual clock (a
// lineage's rate budget 5/s, bursts of 128, on each) and registers, on the
// leader, a root with two children, honest and rogue.
func siblingsOnAFollower(t *testing.T) (clk *clock.Manual, lead, follower *testserver.Server, honest, rogue *tetherv1.SpawnResponse) {
	t.Helper()
	clk = clock.NewManual(epoch)
	replicas, lead := startReplicasWith(t, 2, testserver.WithClock(clk), func(cfg *controlplane.Config) { cfg.RateLimit, cfg.RateBurst = 5, 128 })
	follower = followersOf(replicas, lead)[0]
	root := register(t, lead.AdminClients(), "planner")
	rootC := lead.Clients(root.Credential)
	honest = spawn(t, rootC, root.Node.NodeId, "honest")
	rogue = spawn(t, rootC, root.Node.NodeId, "rogue")
	return clk, lead, follower, honest, rogue
}

// offer30s offers job to holder: a 30-second lease, 10 seconds to ACK it.
func offer30s(t *testing.T, admin *testserver.Clients, job, holder string) *tetherv1.Lease {
	t.Helper()
	r, err := admin.Lease.Offer(context.Background(), connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: holder,
		LeaseDuration: durationpb.New(30 * time.Second), AckTimeout: durationpb.New(10 * time.Second)}))
	if err != nil {
		t.Fatalf("offer %s: %v", job, err)
	}
	return r.Msg.Lease
}

// The rogue spends its lineage's budget on the follower, round after
// round, while its sibling renews its sixty leases (30 s, every 10 s)
// through that follower, half unary and half on a lease channel the
// follower relays. Every renewal is admitted (the follower reads the lease
// from the store to see that the sender holds it) and judged by the
// leader, and none expires. Before, 16 of the 60 renewals of the first
// round were admitted (the node's reserve) and the rest refused.
func TestRogue47FARogueSpendingTheBudgetOnAFollowerCannotFreezeASiblingsLeases(t *testing.T) {
	clk, lead, follower, honest, rogue := siblingsOnAFollower(t)
	ctx := context.Background()
	admin := lead.AdminClients()
	honestLead := lead.Clients(honest.Credential)
	honestFollower := follower.Clients(honest.Credential)
	rogueFollower := follower.Clients(rogue.Credential)

	const jobs = 60
	leases := make([]*tetherv1.Lease, jobs)
	for i := range leases {
		leases[i], _ = unary{honestLead}.send(t, ack(offer30s(t, admin, fmt.Sprintf("r47f-%02d", i), honest.Node.NodeId)))
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

// The follower's allowance gives the rogue nothing it does not hold: its
// budget on the follower spent, its renewals through the follower of its
// sibling's lease and of made-up jobs are refused resource_exhausted once
// its node's reserve is spent, and the sibling's lease is unchanged; a
// lease it holds gives it, through the follower, that lease's allowance
// and at most its node's reserve, as on the leader.
func TestRogue47FAFollowersAllowanceGivesARogueNothingItDoesNotHold(t *testing.T) {
	clk, lead, follower, honest, rogue := siblingsOnAFollower(t)
	ctx := context.Background()
	admin := lead.AdminClients()
	rogueFollower := follower.Clients(rogue.Credential)
	victim, _ := unary{lead.Clients(honest.Credential)}.send(t, ack(offer30s(t, admin, "victim", honest.Node.NodeId)))
	own := offer30s(t, admin, "own", rogue.Node.NodeId)

	spendLineage(t, rogueFollower, rogue.Node.NodeId)
	refused := 0
	for i := range 100 {
		target := victim
		if i%2 == 1 {
			target = &tetherv1.Lease{JobId: fmt.Sprintf("made-up-%d", i), LeaseId: victim.LeaseId, LeaseGeneration: 1}
		}
		_, _, errText := unary{rogueFollower}.try(t, renew(target, uint64(i+1)))
		switch {
		case strings.HasPrefix(errText, "resource_exhausted: "):
			refused++
		case strings.HasPrefix(errText, "permission_denied: ") && refused == 0:
			// its node's reserve, while it lasts: refused by the leader
		default:
			t.Fatalf("the rogue's renewal %d, through the follower, of a lease it does not hold: %q", i+1, errText)
		}
	}
	t.Logf("the rogue's 100 renewals through the follower of leases it does not hold: %d refused resource_exhausted", refused)
	if refused < 100-controlplane.UpkeepReserveBurst {
		t.Fatalf("only %d of the rogue's 100 renewals of leases it does not hold were refused resource_exhausted", refused)
	}
	got, err := admin.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: "victim"}))
	if err != nil {
		t.Fatal(err)
	}
	if g := got.Msg.Lease; g.HolderIdentity != honest.Node.NodeId || g.State != tetherv1.LeaseState_LEASE_STATE_ACTIVE || g.OwnershipConflict || g.RenewSequence != 0 {
		t.Fatalf("the victim's lease after the rogue's renewals: %v", g)
	}

	// Its own lease, through the follower, with both reserves full again.
	clk.Advance(5 * time.Second)
	spendLineage(t, rogueFollower, rogue.Node.NodeId)
	accepted := 0
	if _, _, errText := (unary{rogueFollower}).try(t, ack(own)); errText != "" {
		t.Fatalf("the rogue's ACK of its own lease through the follower: %s", errText)
	}
	accepted++
	for i := range 100 {
		_, _, errText := unary{rogueFollower}.try(t, renew(own, uint64(i+1)))
		switch {
		case errText == "":
			accepted++
		case strings.HasPrefix(errText, "resource_exhausted: "):
		default:
			t.Fatalf("the rogue's renewal %d of its own lease through the follower: %q", i+1, errText)
		}
	}
	t.Logf("the rogue's ACK and 100 renewals of the one lease it holds, through the follower: %d accepted", accepted)
	if limit := controlplane.LeaseUpkeepAllowance + controlplane.UpkeepReserveBurst; accepted > limit || accepted < controlplane.LeaseUpkeepAllowance {
		t.Fatalf("the rogue had %d messages about its one lease accepted through the follower with its lineage's budget spent there, want the lease's allowance (%d) and at most its node's reserve (%d) more",
			accepted, controlplane.LeaseUpkeepAllowance, controlplane.UpkeepReserveBurst)
	}
}
