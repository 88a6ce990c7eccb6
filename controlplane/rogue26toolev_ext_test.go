package controlplane_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue26DoorToolServersEvidencePastTheDeadlineShowsTheExpiry: a read
// of a job's evidence past a deadline answers what the clock decided
// (1e17cc0), on every replica: a follower forwards such a read to the
// leader, but only an agent's or an operator's (leaseForwarder's
// settlesElsewhere leaves a tool server's GetLease to forFence). A tool
// server's Evidence on a follower past the deadline would have been
// answered from the store as the last commit left it — the quiet holder's
// last row its ACK, licence to act, until the leader's sweep. It is not:
// a tool server may not call Evidence at all (policy: auth.Read), on any
// replica, and is refused before the forwarder. A guard (nothing found):
// it fails if a tool server's Evidence is ever answered without the
// expiry's row (etcd, two replicas; and Badger) — as it did, on the
// follower, with the policy opened to tool servers, until the forwarder
// sent every caller's Evidence past a deadline to the leader.
func TestRogue26DoorToolServersEvidencePastTheDeadlineShowsTheExpiry(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the etcd replicas; make test and CI run them.")
	}
	clk := clock.NewManual(epoch)
	onEachStoreLeading(t, clk, func(t *testing.T, replicas []*testserver.Server, lead *testserver.Server) {
		ctx := context.Background()
		admin := lead.AdminClients()
		root := register(t, admin, "planner")
		w1 := spawn(t, lead.Clients(root.Credential), root.Node.NodeId, "w1")
		job := "r26-tool-quiet-" + t.Name()
		resp, err := admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: w1.Node.NodeId,
			LeaseDuration: durationpb.New(30 * time.Second), AckTimeout: durationpb.New(10 * time.Second)}))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := lead.Clients(w1.Credential).Lease.Ack(ctx, connect.NewRequest(ack(resp.Msg.Lease).GetAck())); err != nil {
			t.Fatal(err)
		}
		clk.Advance(31 * time.Second) // past the expiry
		// The followers first: the leader's reads settle what they read.
		for i, r := range append(followersOf(replicas, lead), lead) {
			tool := r.Clients(r.ToolServerToken(t, "fence-tool"))
			ev, err := tool.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: job}))
			if err != nil {
				if connect.CodeOf(err) != connect.CodePermissionDenied || strings.Contains(err.Error(), w1.Node.NodeId) {
					t.Errorf("replica %d, the tool server's Evidence: %v; want permission_denied, naming nothing of the job", i, err)
				}
				continue
			}
			if len(ev.Msg.Rows) == 0 {
				t.Fatalf("replica %d, the tool server's Evidence: no rows", i)
			}
			last := ev.Msg.Rows[len(ev.Msg.Rows)-1]
			if last.Decision.GetAuditEvent() != tetherv1.AuditEvent_AUDIT_EVENT_LEASE_EXPIRED || !last.LeaseExpired {
				t.Errorf("replica %d: the tool server reads the quiet lease's last evidence row, 1s past its expiry, as %s %s (%s); want the expiry's",
					i, last.Message, last.Decision.GetAuditEvent(), last.Decision.GetReason())
			}
		}
	})
}
