package controlplane_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The twenty-seventh hostile pass on termination and the reconciliation
// record: the agent being stopped asks what it can fake, delay or dodge.
// Each test plays one rogue through the real server (Badger on disk, or
// etcd with TETHER_TEST_STORE=etcd; real HTTP/2, real JWTs, the manual
// clock where time matters).

// TestRogue27AReadyNodeUnderAStopIsNotToldItIsReadyAgain: a node that
// reported ready before its stop was requested reports ready again while
// the stop is requested and its mark has not reached it (or has marked its
// root only). The first report under the stop is refused (twenty-sixth
// pass), but a repeat of one made before it was answered OK: the node was
// told it is ready to take work by the control plane that is stopping it,
// the answer depending on whether it had spoken before. It is refused
// failed_precondition naming the termination, as a first report is, and
// the node keeps the ready time of its report before the stop.
func TestRogue27AReadyNodeUnderAStopIsNotToldItIsReadyAgain(t *testing.T) {
	for _, tc := range []struct {
		name   string
		marked bool // the roots' chunk of the mark has committed
	}{{"requested", false}, {"roots marked", true}} {
		t.Run(tc.name, func(t *testing.T) {
			held, holdOpt := newHeldStops(t)
			mark, srv := startMarkHeld(t, 1, holdOpt)
			t.Cleanup(held.free)
			admin := srv.AdminClients()
			ctx := context.Background()
			r := register(t, admin, "pool")
			c := spawn(t, srv.Clients(r.Credential), r.Node.NodeId, "worker")
			self := c.Node.NodeId
			rogue := srv.Clients(c.Credential)
			reportReady(t, rogue, self)
			readyAt := getNode(t, admin, self).ReadyAt.AsTime()
			if tc.marked {
				mark.arm()
			} else {
				held.hold()
			}
			term := terminate(t, admin, r.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Minute, time.Second, 0)
			if tc.marked {
				<-mark.reached
			}
			if n := getNode(t, admin, self); n.State != tetherv1.NodeState_NODE_STATE_RUNNING {
				t.Fatalf("the child is %s before the mark reaches it, want running", n.State)
			}
			_, err := rogue.Agent.ReportReady(ctx, connect.NewRequest(&tetherv1.ReportReadyRequest{NodeId: self}))
			if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), term.TerminationId) {
				t.Fatalf("a repeated ready report of a node under a requested stop: %v, want failed_precondition naming termination %s", err, term.TerminationId)
			}
			if n := getNode(t, admin, self); n.ReadyAt == nil || !n.ReadyAt.AsTime().Equal(readyAt) {
				t.Fatalf("the child's ready time after the refused repeat: %v, want %s (its report before the stop)", n.ReadyAt, readyAt)
			}
			held.free()
			mark.free()
			waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
		})
	}
}
