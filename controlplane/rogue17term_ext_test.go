package controlplane_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The seventeenth hostile pass over termination: the agent being stopped,
// or a rogue beside it, against the real server.

// TestAnEscalatedDrainWaitsForTheCancelsItOrdered: a drain that outlasts
// its window escalates, orders the calls still in flight cancelled, and
// then waits for the tool layer's acknowledgement of each, up to the
// acknowledgement timeout. The reconciler kept the calls' states in memory
// while the drain waited (they moved forward as the ledger's watch
// delivered each change), and read them again in the same pass that wrote
// the cancel orders: the kept state still said "in flight" (the order's
// event not yet delivered), an in-flight call is no pending cancel, and
// the termination went on to revoke and reconcile at once. The gate's
// prompt acknowledgement was then refused ("stopped waiting") and the
// record said cancel_unacknowledged — on a race a rogue does not even need
// to win, and one that turns the seed's required acknowledgement into a
// formality. Each round drains a node with a call in flight, escalates,
// and acknowledges the cancel at once: it is taken, and the record says
// cancelled_acked.
func TestAnEscalatedDrainWaitsForTheCancelsItOrdered(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	gate := srv.Clients(srv.ToolServerToken(t, "gate-1"))
	ctx := context.Background()
	for round := range 6 {
		node := register(t, admin, fmt.Sprintf("rogue-%d", round)).Node.NodeId
		grant := issueRoot(t, admin, node, time.Hour, "tool:*")
		begun, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: grant.token, Tool: "shell", GateId: "gate-1"}))
		if err != nil {
			t.Fatal(err)
		}
		call := begun.Msg.Call.CallId
		term := terminate(t, admin, node, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, 10*time.Second, time.Hour, time.Hour).TerminationId
		waitState(t, srv, term, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)
		clk.Advance(10 * time.Second)
		testserver.WaitFor(t, 20*time.Second, "the escalation's cancel order", func() bool {
			calls, err := admin.Tool.ListCalls(ctx, connect.NewRequest(&tetherv1.ListCallsRequest{NodeId: node}))
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range calls.Msg.Calls {
				if c.CallId == call {
					return c.State == tetherv1.CallState_CALL_STATE_CANCEL_REQUESTED
				}
			}
			return false
		})
		if _, err := gate.Tool.CancelAck(ctx, connect.NewRequest(&tetherv1.CancelAckRequest{CallId: call, GateId: "gate-1"})); err != nil {
			t.Fatalf("round %d: the gate's acknowledgement, well inside the hour's acknowledgement timeout: %v (termination %v)", round, err, getTermination(t, admin, term))
		}
		waitState(t, srv, term, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
		clk.Advance(2 * time.Hour)
		waitState(t, srv, term, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
		for _, c := range record(t, admin, term).ToolCalls {
			if c.CallId == call && c.Resolution != tetherv1.CallResolution_CALL_RESOLUTION_CANCELLED_ACKED {
				t.Fatalf("round %d: the record says the call ended %s, want cancelled_acked", round, c.Resolution)
			}
		}
	}
}
