package controlplane_test

import (
	"testing"
	"time"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor"
)

// Forty-sixth hostile pass, the supervisor's termination path (letter H).

// TestRogue46HAnOwnZeroWindowAbortDoesNotSilenceTheGate: the rogue P has
// two calls of its child C in flight at an honest gate — one the gate will
// cancel, one that completes (a payment sent). Ahead of the operator's
// stop, P aborts C itself (its own stop of its own child, allowed) with no
// acknowledgement window and no confirmation window. The cancels were
// ordered and the acknowledgement deadline was the order's own instant:
// the gate's acknowledgement, sent at that very instant, and its report
// that the payment completed were both refused, P's record closed the two
// calls cancel_unacknowledged "by the termination", the gate's silence on
// the record where it had answered at once — a payment that went through
// read as a cancel nobody confirmed, the unknown state the stop exists to
// prevent, and the operator's stop that came next found C terminated by
// that record. An agent's stop now gives the gate at least the control
// plane's own acknowledgement window (supervisor.MinAgentCancelAckTimeout,
// the default), as an agent's own stop proposal always had: the agent
// orders the cancels, the witness keeps its time to answer.
func TestRogue46HAnOwnZeroWindowAbortDoesNotSilenceTheGate(t *testing.T) {
	w := newSeedWorld(t)
	c := w.c.Node.NodeId
	cancelled, paid := rogue45dBegin(t, w, w.gC.token), rogue45dBegin(t, w, w.gC.token)

	w.clk.Advance(time.Second)
	rogue := terminate(t, w.pAgent, c, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 0, 0)
	waitState(t, w.srv, rogue.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_ABORTING)

	// The gate answers at once, at the instant of the order.
	rogue45dGateAnswers(t, w, cancelled, paid, "at the instant of the order")

	waitState(t, w.srv, rogue.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	w.clk.Advance(time.Minute)
	term := waitState(t, w.srv, rogue.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	if got := term.CancelAckTimeout.AsDuration(); got != supervisor.MinAgentCancelAckTimeout {
		t.Errorf("the rogue's abort shows an acknowledgement timeout of %s, want the agents' least, %s", got, supervisor.MinAgentCancelAckTimeout)
	}

	rec := record(t, w.admin, rogue.TerminationId)
	rogue45dWantEndedByGate(t, rec, "the rogue's",
		rogue45dEnd{cancelled, "C's cancelled call", tetherv1.CallResolution_CALL_RESOLUTION_CANCELLED_ACKED},
		rogue45dEnd{paid, "C's payment", tetherv1.CallResolution_CALL_RESOLUTION_COMPLETED})
}

// TestRogue46HAnOwnAbortStillClosesASilentGatesCallAtItsWindow: the floor
// is a window, not a hold: the same zero-window abort of the rogue's child,
// its gate silent, closes the call cancel_unacknowledged as of the agents'
// least acknowledgement window after the order, and no later. An
// operator's own zero-window abort keeps its zero: the floor is the
// workload's, not the operator's.
func TestRogue46HAnOwnAbortStillClosesASilentGatesCallAtItsWindow(t *testing.T) {
	w := newSeedWorld(t)
	c := w.c.Node.NodeId
	silent := rogue45dBegin(t, w, w.gC.token)

	w.clk.Advance(time.Second)
	ordered := w.clk.Now()
	rogue := terminate(t, w.pAgent, c, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 0, 0)
	waitState(t, w.srv, rogue.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_ABORTING)
	w.clk.Advance(supervisor.MinAgentCancelAckTimeout)
	waitState(t, w.srv, rogue.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)

	rec := record(t, w.admin, rogue.TerminationId)
	found := false
	for _, call := range rec.ToolCalls {
		if call.CallId != silent {
			continue
		}
		found = true
		if want := ordered.Add(supervisor.MinAgentCancelAckTimeout); call.Resolution != tetherv1.CallResolution_CALL_RESOLUTION_CANCEL_UNACKNOWLEDGED || !call.EndedAt.AsTime().Equal(want) {
			t.Errorf("the rogue's record lists C's call %s ended at %s, want cancel_unacknowledged as of %s", call.Resolution, call.EndedAt.AsTime(), want)
		}
	}
	if !found {
		t.Error("the rogue's record does not list C's call")
	}

	// The operator's own zero-window abort of P keeps its zero.
	op := terminate(t, w.admin, w.p.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 0, 0)
	if got := op.CancelAckTimeout.AsDuration(); got != 0 {
		t.Errorf("the operator's zero-window abort shows an acknowledgement timeout of %s, want 0", got)
	}
}
