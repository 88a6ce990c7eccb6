package controlplane_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/internal/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The second acceptance pass over the two seeds, through the real server:
// the promises the first pass (seed_lease_ext_test.go,
// seed_term_ext_test.go) and the rogue passes left out or checked only for
// a cooperative party.

// Seed 003 (aborting): "aborting cancels those calls and requires an
// acknowledgement from the tool layer of each cancellation", and the
// record says how each call in flight was resolved. A tool server that
// reports a call's end with EndCall after the abort ordered its cancel —
// a gate that never saw the order (its watch was behind), or that let the
// tool finish — has acknowledged nothing: a call it says completed did
// its side effect, one it says failed ended on its own. The record says
// so, with no acknowledgement; only CancelAck is one. It used to record
// both cancelled_acked, acknowledged by the gate: a payment the tool
// server reported sent, recorded as a cancel the gate never acknowledged.
func TestSeed2AnEndAfterTheCancelOrderIsNotAnAcknowledgement(t *testing.T) {
	w := newSeedWorld(t)
	ctx := context.Background()
	var calls []string
	for range 3 {
		id, err := w.begin(w.gC.token)
		if err != nil {
			t.Fatal(err)
		}
		calls = append(calls, id)
	}
	completed, failed, acked := calls[0], calls[1], calls[2]
	term := terminate(t, w.admin, w.p.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Minute, time.Minute)
	testserver.WaitFor(t, 20*time.Second, "the abort's three cancel orders", func() bool {
		return getTermination(t, w.admin, term.TerminationId).Progress.GetAcksPending() == 3
	})
	for _, end := range []*tetherv1.EndCallRequest{{CallId: completed, GateId: "gate-1"}, {CallId: failed, GateId: "gate-1", Failed: true, Error: "upstream 502"}} {
		resp, err := w.gate.Tool.EndCall(ctx, connect.NewRequest(end))
		if err != nil {
			t.Fatal(err)
		}
		// The ledger's answer: the order is kept, no acknowledgement.
		if c := resp.Msg.Call; c.CancelRequestedAt == nil || c.CancelAckedAt != nil || c.AcknowledgedBy != "" {
			t.Errorf("call %s in the ledger: cancel ordered at %v, acknowledged at %v by %q; want the order kept and no acknowledgement", c.CallId, c.CancelRequestedAt, c.CancelAckedAt, c.AcknowledgedBy)
		}
	}
	if _, err := w.gate.Tool.CancelAck(ctx, connect.NewRequest(&tetherv1.CancelAckRequest{CallId: acked, GateId: "gate-1"})); err != nil {
		t.Fatal(err)
	}
	// Every call has ended: the abort goes on without waiting out its
	// acknowledgement timeout.
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	w.clk.Advance(2 * time.Minute)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, w.admin, term.TerminationId)
	got := map[string]*tetherv1.RecordToolCall{}
	for _, c := range rec.ToolCalls {
		got[c.CallId] = c
	}
	for _, want := range []struct {
		id         string
		resolution tetherv1.CallResolution
		ackedBy    string
	}{
		{completed, tetherv1.CallResolution_CALL_RESOLUTION_COMPLETED, ""},
		{failed, tetherv1.CallResolution_CALL_RESOLUTION_FAILED, ""},
		{acked, tetherv1.CallResolution_CALL_RESOLUTION_CANCELLED_ACKED, "tool:gate-1"},
	} {
		c := got[want.id]
		if c == nil {
			t.Errorf("call %s is not in the record", want.id)
			continue
		}
		if c.Resolution != want.resolution || c.AcknowledgedBy != want.ackedBy || c.EndedBy != "tool:gate-1" {
			t.Errorf("call %s: %s acknowledged by %q, ended by %q; want %s acknowledged by %q, ended by tool:gate-1",
				want.id, c.Resolution, c.AcknowledgedBy, c.EndedBy, want.resolution, want.ackedBy)
		}
	}
	if len(rec.ToolCalls) != 3 {
		t.Errorf("record lists %d calls, want 3", len(rec.ToolCalls))
	}
}
