package controlplane_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/store"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor"
)

// Forty-fifth hostile pass, the supervisor's termination path (letter D).

// TestRogue45DAnOwnAbortDoesNotStripTheOperatorsDrainOfItsWait: the rogue
// P has two calls of its child C in flight at an honest gate — one the
// gate will cancel, one that will complete (a payment sent) — and one of
// its own. P aborts C itself (its own stop of its own child, allowed): the
// cancels of C's calls are ordered. The operator drains P's subtree with a
// ten-minute window, which takes C over (an operator's stop supersedes an
// agent's); C stays aborting and its calls, with their cancel orders, move
// to the operator's drain. The drain ended as soon as the one call with no
// cancel order (P's) ended: a cancel order pending held nothing open, so
// the drain went to reconciling a second after, closed C's calls
// cancel_unacknowledged, and refused the gate's acknowledgement and its
// report that the payment completed, both a second later, well inside
// the operator's window: the record said the gate never answered, where
// it had, and a payment that went through read as a cancel nobody
// confirmed — the unknown state a drain exists to prevent, made by the
// stopped agent's own abort. A drain now waits for the cancels it carries
// as for its calls in flight, up to its window (then it escalates and
// waits for them up to its acknowledgement timeout, as before).
func TestRogue45DAnOwnAbortDoesNotStripTheOperatorsDrainOfItsWait(t *testing.T) {
	w := newSeedWorld(t)
	ctx := context.Background()
	c, p := w.c.Node.NodeId, w.p.Node.NodeId
	cancelled, paid, own := rogue45dBegin(t, w, w.gC.token), rogue45dBegin(t, w, w.gC.token), rogue45dBegin(t, w, w.gP.token)

	// The rogue aborts its own child: C's cancels are ordered (its abort
	// waits for them, held open by them).
	w.clk.Advance(time.Second)
	rogue := terminate(t, w.pAgent, c, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, time.Minute, time.Minute, time.Minute)
	waitState(t, w.srv, rogue.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_ABORTING)

	// The operator drains P's subtree, P's own call holding it open.
	w.clk.Advance(time.Second)
	drain := terminate(t, w.admin, p, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, 10*time.Minute, 30*time.Second, time.Minute)
	waitState(t, w.srv, drain.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)

	// P's call ends; the drain observes it (stored with its progress).
	w.clk.Advance(time.Second)
	if _, err := w.gate.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: own, GateId: "gate-1"})); err != nil {
		t.Fatalf("the gate's end of P's call: %v", err)
	}
	var seen supervisor.Termination
	testserver.WaitFor(t, 20*time.Second, "the operator's drain to observe P's call ended", func() bool {
		err := w.srv.Store().View(ctx, func(tx store.ReadTxn) error {
			var err error
			seen, err = supervisor.GetTerminationIn(tx, drain.TerminationId)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return seen.Progress.CallsInFlight == 0
	})
	if seen.Phase != supervisor.PhaseDraining {
		t.Errorf("a second into its ten-minute window, with C's two cancels unanswered, the operator's drain is %s, want draining", seen.Phase)
	}

	// A second later the gate answers: one call cancelled, the payment
	// completed.
	w.clk.Advance(time.Second)
	rogue45dGateAnswers(t, w, cancelled, paid, "a second into the drain's window")

	waitState(t, w.srv, drain.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	w.clk.Advance(2 * time.Minute)
	waitState(t, w.srv, drain.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)

	rec := record(t, w.admin, drain.TerminationId)
	rogue45dWantEndedByGate(t, rec, "the operator's",
		rogue45dEnd{cancelled, "C's cancelled call", tetherv1.CallResolution_CALL_RESOLUTION_CANCELLED_ACKED},
		rogue45dEnd{paid, "C's payment", tetherv1.CallResolution_CALL_RESOLUTION_COMPLETED},
		rogue45dEnd{own, "P's own call", tetherv1.CallResolution_CALL_RESOLUTION_COMPLETED})
}

func rogue45dBegin(t *testing.T, w *seedWorld, token string) string {
	t.Helper()
	call, err := w.begin(token)
	if err != nil {
		t.Fatalf("begin a call: %v", err)
	}
	return call
}

// rogue45dGateAnswers has the honest gate answer at once, when (the
// moment, for the errors): it acknowledges the cancel of C's call
// cancelled and reports C's payment paid completed. An answer refused is
// an error of the test.
func rogue45dGateAnswers(t *testing.T, w *seedWorld, cancelled, paid, when string) {
	t.Helper()
	ctx := context.Background()
	accepted := 0
	if _, err := w.gate.Tool.CancelAck(ctx, connect.NewRequest(&tetherv1.CancelAckRequest{CallId: cancelled, GateId: "gate-1"})); err != nil {
		t.Errorf("the gate's acknowledgement of C's cancelled call, %s: %v", when, err)
	} else {
		accepted++
	}
	if _, err := w.gate.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: paid, GateId: "gate-1"})); err != nil {
		t.Errorf("the gate's report that C's payment completed, %s: %v", when, err)
	} else {
		accepted++
	}
	t.Logf("the gate's reports accepted: %d of 2", accepted)
}

// rogue45dEnd is a call a record must list, ended by the gate.
type rogue45dEnd struct {
	call, what string
	res        tetherv1.CallResolution
}

// rogue45dWantEndedByGate fails the test unless rec (whose: the
// termination's issuer, for the errors) lists each call of want with its
// resolution, ended by tool:gate-1.
func rogue45dWantEndedByGate(t *testing.T, rec *tetherv1.ReconciliationRecord, whose string, want ...rogue45dEnd) {
	t.Helper()
	got := map[string]*tetherv1.RecordToolCall{}
	for _, call := range rec.ToolCalls {
		got[call.CallId] = call
	}
	for _, want := range want {
		call := got[want.call]
		switch {
		case call == nil:
			t.Errorf("%s record does not list %s", whose, want.what)
		case call.Resolution != want.res || call.EndedBy != "tool:gate-1":
			t.Errorf("%s record lists %s as %s ended by %q, want %s ended by tool:gate-1", whose, want.what, call.Resolution, call.EndedBy, want.res)
		}
	}
}

// TestRogue45DACarriedCancelHoldsTheDrainNoLongerThanItsWindows: the same
// rogue, its gate silent about C's cancelled call. The operator's drain
// waits for it up to its window, then escalates and waits up to its
// acknowledgement timeout, and closes it cancel_unacknowledged then: the
// cancel a drain carries holds it no longer than a call in flight would.
func TestRogue45DACarriedCancelHoldsTheDrainNoLongerThanItsWindows(t *testing.T) {
	w := newSeedWorld(t)
	c, p := w.c.Node.NodeId, w.p.Node.NodeId
	silent := rogue45dBegin(t, w, w.gC.token)

	w.clk.Advance(time.Second)
	rogue := terminate(t, w.pAgent, c, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, time.Minute, time.Hour, time.Minute)
	waitState(t, w.srv, rogue.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_ABORTING)

	w.clk.Advance(time.Second)
	drain := terminate(t, w.admin, p, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, 10*time.Minute, 30*time.Second, time.Minute)
	waitState(t, w.srv, drain.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)
	w.clk.Advance(10 * time.Minute)
	waitState(t, w.srv, drain.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_ABORTING)
	w.clk.Advance(30 * time.Second)
	waitState(t, w.srv, drain.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	w.clk.Advance(2 * time.Minute)
	waitState(t, w.srv, drain.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)

	rec := record(t, w.admin, drain.TerminationId)
	if !rec.Escalated {
		t.Error("the operator's record does not say its drain escalated")
	}
	var reconciling time.Time
	for _, ph := range rec.Phases {
		if ph.Name == "reconciling" {
			reconciling = ph.StartedAt.AsTime()
		}
	}
	if want := epoch.Add(2*time.Second + 10*time.Minute + 30*time.Second); !reconciling.Equal(want) {
		t.Errorf("the operator's drain stopped waiting at %s, want its window and its acknowledgement timeout after its mark, %s", reconciling, want)
	}
	for _, call := range rec.ToolCalls {
		if call.CallId != silent {
			continue
		}
		if call.Resolution != tetherv1.CallResolution_CALL_RESOLUTION_CANCEL_UNACKNOWLEDGED || !call.EndedAt.AsTime().Equal(reconciling) {
			t.Errorf("the operator's record lists C's call %s ended at %s, want cancel_unacknowledged as of %s", call.Resolution, call.EndedAt.AsTime(), reconciling)
		}
		return
	}
	t.Error("the operator's record does not list C's call")
}
