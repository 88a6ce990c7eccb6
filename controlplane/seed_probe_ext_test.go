package controlplane_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// Seed 003, read from the document alone: "the move out of requested is
// started by an authority outside the workload, not by the agent itself",
// and "an agent never holds its own kill switch". A probe through the
// public API, played by the agent being stopped: it cannot start its own
// termination (nor its parent's), drain or abort, and once an operator
// drains it, it cannot start one of its child either — it is the workload
// now, and an abort of its own would turn the operator's drain of the
// child (calls left to finish in the window) into cancellations. Each
// refusal says why, changes no node and leaves the operator's drain as it
// was.
func TestSeedProbeNoAgentOfTheWorkloadStartsAStop(t *testing.T) {
	w := newSeedWorld(t)
	ctx := context.Background()
	p, c := w.p.Node.NodeId, w.c.Node.NodeId
	before := w.snapshot(t)
	stop := func(as *testserver.Clients, node string, mode tetherv1.TerminationMode) error {
		_, err := as.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{NodeId: node, Mode: mode, Reason: "my own call"}))
		return err
	}
	for _, mode := range []tetherv1.TerminationMode{tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, tetherv1.TerminationMode_TERMINATION_MODE_ABORT} {
		wantRefused(t, "C stops itself ("+mode.String()+")", stop(w.cAgent, c, mode), connect.CodePermissionDenied, "cannot terminate itself", "ProposeStop")
		wantRefused(t, "C stops its parent ("+mode.String()+")", stop(w.cAgent, p, mode), connect.CodePermissionDenied, "not an ancestor")
		wantRefused(t, "P stops itself ("+mode.String()+")", stop(w.pAgent, p, mode), connect.CodePermissionDenied, "cannot terminate itself")
	}
	if after := w.snapshot(t); after != before {
		t.Fatalf("refused stops changed state:\nbefore %s\nafter %s", before, after)
	}

	// An operator drains P's subtree; C's call in flight keeps it
	// draining. P, being drained, tries to abort C.
	call, err := w.begin(w.gC.token)
	if err != nil {
		t.Fatal(err)
	}
	term := terminate(t, w.admin, p, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Hour, time.Minute, time.Minute)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)
	for _, mode := range []tetherv1.TerminationMode{tetherv1.TerminationMode_TERMINATION_MODE_ABORT, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN} {
		wantRefused(t, "P, being drained, stops C ("+mode.String()+")", stop(w.pAgent, c, mode), connect.CodeFailedPrecondition, "draining", "cannot start a termination")
	}
	got := getTermination(t, w.admin, term.TerminationId)
	if got.State != tetherv1.TerminationState_TERMINATION_STATE_DRAINING || got.Mode != tetherv1.TerminationMode_TERMINATION_MODE_DRAIN {
		t.Fatalf("the operator's drain is %s %s after P's refused stops, want DRAINING in drain mode", got.State, got.Mode)
	}
	calls, err := w.admin.Tool.ListCalls(ctx, connect.NewRequest(&tetherv1.ListCallsRequest{NodeId: c}))
	if err != nil {
		t.Fatal(err)
	}
	for _, got := range calls.Msg.Calls {
		if got.CallId == call && got.State != tetherv1.CallState_CALL_STATE_IN_FLIGHT {
			t.Fatalf("C's call is %s under the operator's drain after P's refused stops, want still in flight", got.State)
		}
	}
	if len(calls.Msg.Calls) != 1 {
		t.Fatalf("C's calls: %v, want the one in flight", calls.Msg.Calls)
	}
}
