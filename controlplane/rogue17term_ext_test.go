package controlplane_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

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

// TestAnApprovedSelfProposalDoesNotShieldTheAgentFromItsAncestors: a rogue
// child C, its call in flight, proposes its own drain with a day's window
// and an operator approves it (yes, stop it). The approval's termination
// carried the operator's rank with the agent's window, so C's parent P —
// an authority outside the workload that could abort C a moment before —
// was refused its abort (failed_precondition, "only an abort ...
// supersedes it"), and C's call ran on for the day, its grants live. The
// windows are the agent's: an ancestor's abort takes the stop over, and
// C's call is ordered cancelled at once.
func TestAnApprovedSelfProposalDoesNotShieldTheAgentFromItsAncestors(t *testing.T) {
	w := newSeedWorld(t)
	ctx := context.Background()
	call, err := w.begin(w.gC.token)
	if err != nil {
		t.Fatal(err)
	}
	_, approve := proposeAndApprove(t, w, w.cAgent, 24*time.Hour)
	self, err := approve()
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, w.srv, self.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)

	aborted, err := w.pAgent.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: w.c.Node.NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT, Reason: "stop now",
		CancelAckTimeout: durationpb.New(10 * time.Second), ConfirmTimeout: durationpb.New(time.Minute),
	}))
	if err != nil {
		t.Fatalf("the parent's abort of its child under the child's own approved drain: %v, want it accepted", err)
	}
	abort := aborted.Msg.Termination.TerminationId
	done := waitState(t, w.srv, self.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	if len(done.SupersededBy) != 1 || done.SupersededBy[0] != abort {
		t.Fatalf("the approved self-proposal is superseded by %v, want the parent's abort %s", done.SupersededBy, abort)
	}
	wantCancelOrderedAt(t, w, abort, call, epoch)
}

// TestAnAncestorTakingOverAnApprovedSelfProposalLoosensNothing: the other
// side of the takeover above. C proposes its drain with 10 s, an operator
// approves; its rogue parent P then drains C with a day's window, which
// takes the stop over (a drain over a drain, from an ancestor), and a day
// to acknowledge the cancels and to confirm the exits. None of it is
// given: the approved stop's deadline binds the ancestor's drain (at 10 s
// it escalates), and its windows the waits the approved stop had not yet
// begun (the default 10 s to acknowledge, 30 s to confirm), so the record
// is written when the approved stop's would have been.
func TestAnAncestorTakingOverAnApprovedSelfProposalLoosensNothing(t *testing.T) {
	w := newSeedWorld(t)
	ctx := context.Background()
	call, err := w.begin(w.gC.token)
	if err != nil {
		t.Fatal(err)
	}
	_, approve := proposeAndApprove(t, w, w.cAgent, 10*time.Second)
	self, err := approve()
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, w.srv, self.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)
	w.clk.Advance(5 * time.Second)
	drained, err := w.pAgent.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: w.c.Node.NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, Reason: "slowly",
		DrainWindow: durationpb.New(24 * time.Hour), CancelAckTimeout: durationpb.New(24 * time.Hour), ConfirmTimeout: durationpb.New(24 * time.Hour),
	}))
	if err != nil {
		t.Fatalf("the parent's drain of its child under the child's own approved drain: %v, want it accepted", err)
	}
	term := drained.Msg.Termination.TerminationId
	waitState(t, w.srv, self.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	w.clk.Advance(5 * time.Second)
	waitState(t, w.srv, term, tetherv1.TerminationState_TERMINATION_STATE_ABORTING)
	w.clk.Advance(10 * time.Second) // the approved stop's acknowledgement timeout
	waitState(t, w.srv, term, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	w.clk.Advance(30 * time.Second) // its confirm timeout
	waitState(t, w.srv, term, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	for _, c := range record(t, w.admin, term).ToolCalls {
		if c.CallId == call && !c.CancelRequestedAt.AsTime().Equal(epoch.Add(10*time.Second)) {
			t.Errorf("the call's cancel was ordered at %s, want the approved stop's deadline %s", c.CancelRequestedAt.AsTime(), epoch.Add(10*time.Second))
		}
	}
}
