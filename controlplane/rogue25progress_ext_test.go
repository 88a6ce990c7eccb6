package controlplane_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestAStopWhoseMarkIsUnderWayShowsNoExitConfirmed: an operator stops an
// agent and its child; the mark commits its roots' chunk and has not
// walked to the child. The termination's progress said every node marked
// so far had its exit confirmed ("requested · nodes 1/1 marked ·
// confirmed 1/1" in `tether terminate --wait`, the same in the console)
// before anyone had confirmed anything: confirmations were the members
// less a count of unconfirmed nodes that only the finished mark sets. Now
// a termination whose mark is under way shows no confirmation.
func TestAStopWhoseMarkIsUnderWayShowsNoExitConfirmed(t *testing.T) {
	mark, srv := startMarkHeld(t, 1)
	admin := srv.AdminClients()
	rogue := register(t, admin, "rogue")
	spawn(t, srv.Clients(rogue.Credential), rogue.Node.NodeId, "child")

	mark.arm()
	term := terminate(t, admin, rogue.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Minute, time.Second, 0)
	<-mark.reached
	got := getTermination(t, admin, term.TerminationId)
	if got.State != tetherv1.TerminationState_TERMINATION_STATE_REQUESTED {
		t.Fatalf("the termination is %s while its mark is held after the roots' chunk, want requested", got.State)
	}
	p := got.Progress
	if p.GetNodesMarked() == 0 {
		t.Fatalf("the roots' chunk committed and the termination shows no node marked (%v)", p)
	}
	if p.GetConfirmations() != 0 {
		t.Fatalf("a termination whose mark is under way shows %d of %d exits confirmed; nobody has confirmed any", p.GetConfirmations(), p.GetNodesTotal())
	}

	mark.free()
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	p = getTermination(t, admin, term.TerminationId).Progress
	if p.GetNodesMarked() != 2 || p.GetNodesTotal() != 2 {
		t.Fatalf("the terminated stop shows %d of %d nodes marked, want 2 of 2", p.GetNodesMarked(), p.GetNodesTotal())
	}
}

// TestAStopShowsItsCallsInFlightFromItsFirstDrainingSnapshot: an agent
// has a tool call in flight when an operator drains it. The termination
// the mark moved to draining showed 0 calls in flight ("draining · 0 tool
// call(s) in flight" in `tether terminate --wait`, the console and `make
// demo`) until the reconciler's next pass counted them, though the mark
// had just put the call on the stop's account. Now the mark counts the
// calls it takes that have no cancel order, as it counts the cancel
// orders an abort sends, and the first snapshot shows them.
func TestAStopShowsItsCallsInFlightFromItsFirstDrainingSnapshot(t *testing.T) {
	for _, tc := range []struct {
		mode             tetherv1.TerminationMode
		state            tetherv1.TerminationState
		inFlight, cancel uint32
	}{
		{tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, tetherv1.TerminationState_TERMINATION_STATE_DRAINING, 1, 0},
		{tetherv1.TerminationMode_TERMINATION_MODE_ABORT, tetherv1.TerminationState_TERMINATION_STATE_ABORTING, 0, 1},
	} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			mark, srv := startMarkHeld(t, 2) // the roots', then the walk that finds no child and moves on
			admin := srv.AdminClients()
			ctx := context.Background()
			agent := register(t, admin, "worker")
			issued, err := admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: agent.Node.NodeId, Scopes: []string{"tool:*"}, Ttl: durationpb.New(time.Hour)}))
			if err != nil {
				t.Fatal(err)
			}
			gate := srv.Clients(srv.ToolServerToken(t, "gate-1"))
			if _, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: issued.Msg.Token, Tool: "shell", GateId: "gate-1"})); err != nil {
				t.Fatal(err)
			}

			mark.arm()
			term := terminate(t, admin, agent.Node.NodeId, tc.mode, time.Minute, time.Minute, 0)
			<-mark.reached
			got := getTermination(t, admin, term.TerminationId)
			if got.State != tc.state {
				t.Fatalf("the termination is %s once its mark moved it on, want %s", got.State, tc.state)
			}
			if p := got.Progress; p.GetCallsInFlight() != tc.inFlight || p.GetAcksPending() != tc.cancel {
				t.Fatalf("the first %s snapshot shows %d call(s) in flight and %d cancel(s) pending; the agent had one call in flight, want %d and %d", got.State, p.GetCallsInFlight(), p.GetAcksPending(), tc.inFlight, tc.cancel)
			}
		})
	}
}
