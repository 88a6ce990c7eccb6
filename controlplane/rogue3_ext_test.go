package controlplane_test

import (
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The rogue agent, third round: what the first two (rogue_ext_test.go,
// rogue2_ext_test.go) did not cover, after the domain types moved out of
// the wire messages, terminations became chunked and etcd batched.

// TestARogueThatDrainsItsChildForADayDoesNotStallAnOperatorsDrain: the
// rogue parent drains its own child with a 24 h window while the child
// keeps a call open, then the operator drains the parent with a window of
// a second. An operator's drain outranks an agent's, so it takes the child
// over with its own window: a second later the drain escalates, the
// child's call gets its cancel order, and the operator's termination ends
// without the clock reaching anything near the agent's day.
func TestARogueThatDrainsItsChildForADayDoesNotStallAnOperatorsDrain(t *testing.T) {
	w := newComposeWorld(t)
	childCall := w.beginCall(t, w.child.Node.NodeId)
	agent := w.srv.Clients(w.parent.Credential)
	inner := terminate(t, agent, w.child.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, 24*time.Hour, 24*time.Hour, 24*time.Hour)
	waitState(t, w.srv, inner.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)

	outer := terminate(t, w.admin, w.parent.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Second, time.Second, time.Second)
	waitState(t, w.srv, inner.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	for _, id := range []string{w.child.Node.NodeId, w.grandchild.Node.NodeId} {
		if n := w.node(t, id); n.TerminationId != outer.TerminationId {
			t.Fatalf("node %s is %s under %s, want it taken over by the operator's %s", id, n.State, n.TerminationId, outer.TerminationId)
		}
	}
	w.clk.Advance(2 * time.Second) // past the operator's drain window: it escalates
	testWaitAcks(t, w, outer.TerminationId)
	w.clk.Advance(2 * time.Second) // past the cancel-ack timeout: nobody acks
	waitState(t, w.srv, outer.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	w.clk.Advance(2 * time.Second) // past the confirm timeout
	waitState(t, w.srv, outer.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, w.admin, outer.TerminationId)
	if got := callIDs(rec)[childCall]; got != tetherv1.CallResolution_CALL_RESOLUTION_CANCEL_UNACKNOWLEDGED {
		t.Fatalf("the child's call in the operator's record: %v, want cancel_unacknowledged (escalated at the operator's window)", got)
	}
	if len(recordNodes(t, rec)) != 3 {
		t.Fatalf("the operator's record lists %d nodes, want 3", len(rec.Nodes))
	}
}

func testWaitAcks(t *testing.T, w *composeWorld, termID string) {
	t.Helper()
	testserver.WaitFor(t, 20*time.Second, "the escalation's cancel order", func() bool {
		return getTermination(t, w.admin, termID).Progress.GetAcksPending() > 0
	})
}
