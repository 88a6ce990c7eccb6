package testserver

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// WaitTermination waits (30 s at the most) for termination id to reach
// state, and, for TERMINATION_STATE_TERMINATED, for its record to be
// written; it returns the termination as last read.
func WaitTermination(t testing.TB, admin *Clients, id string, state tetherv1.TerminationState) *tetherv1.Termination {
	t.Helper()
	var last *tetherv1.Termination
	WaitFor(t, 30*time.Second, "termination "+id+" to reach "+state.String(), func() bool {
		resp, err := admin.Supervisor.GetTermination(context.Background(), connect.NewRequest(&tetherv1.GetTerminationRequest{TerminationId: id}))
		if err != nil {
			t.Fatal(err)
		}
		last = resp.Msg.Termination
		return last.State == state && (state != tetherv1.TerminationState_TERMINATION_STATE_TERMINATED || last.RecordId != "")
	})
	return last
}

// DrainLeftToAnotherStop plays a rogue (rogue, its clients) that drains
// its own child childID on a day's window, and the operator (admin) who,
// once the child's drain is over and the rogue's stop waits a day for the
// child's exit to be confirmed, aborts the rogue's node rogueID, taking
// the child over. It waits for the rogue's stop to finish (at once, the
// child left to the operator's abort) and returns it, with its record
// written, and the id of the operator's abort.
func DrainLeftToAnotherStop(t testing.TB, admin, rogue *Clients, rogueID, childID string) (done *tetherv1.Termination, outerID string) {
	t.Helper()
	ctx := context.Background()
	inner, err := rogue.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: childID, Mode: tetherv1.TerminationMode_TERMINATION_MODE_DRAIN,
		DrainWindow: durationpb.New(24 * time.Hour), CancelAckTimeout: durationpb.New(24 * time.Hour), ConfirmTimeout: durationpb.New(24 * time.Hour),
		Reason: "routine cleanup",
	}))
	if err != nil {
		t.Fatalf("the rogue's drain of its child: %v", err)
	}
	innerID := inner.Msg.Termination.TerminationId
	// The child has no call in flight: its drain is over at once, and the
	// rogue's stop waits a day for the child's exit to be confirmed.
	WaitTermination(t, admin, innerID, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	outer, err := admin.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: rogueID, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT,
		CancelAckTimeout: durationpb.New(time.Hour), ConfirmTimeout: durationpb.New(time.Hour),
	}))
	if err != nil {
		t.Fatalf("the operator's abort: %v", err)
	}
	done = WaitTermination(t, admin, innerID, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	return done, outer.Msg.Termination.TerminationId
}

// AbortWithACallRunOn plays the operator (admin) who aborts node nodeID,
// whose call callID (begun by the gate gateID, its clients gate) is in
// flight, and a rogue tool server that, the call's cancel ordered, lets
// the tool run on for ranFor on clk and then reports the call completed
// instead of acknowledging the cancel; nobody confirms the node's exit.
// It returns the abort once terminated, its record written.
func AbortWithACallRunOn(t testing.TB, admin, gate *Clients, clk *clock.Manual, nodeID, gateID, callID string, ranFor time.Duration) *tetherv1.Termination {
	t.Helper()
	ctx := context.Background()
	stop, err := admin.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: nodeID, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT,
		CancelAckTimeout: durationpb.New(time.Hour), ConfirmTimeout: durationpb.New(time.Minute), Reason: "stop the rogue",
	}))
	if err != nil {
		t.Fatal(err)
	}
	id := stop.Msg.Termination.TerminationId
	WaitFor(t, 30*time.Second, "the abort to order the call's cancel", func() bool {
		got, err := admin.Supervisor.GetTermination(ctx, connect.NewRequest(&tetherv1.GetTerminationRequest{TerminationId: id}))
		if err != nil {
			t.Fatal(err)
		}
		return got.Msg.Termination.Progress.GetAcksPending() == 1
	})
	if ranFor > 0 {
		clk.Advance(ranFor) // the tool runs on
	}
	if _, err := gate.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: callID, GateId: gateID})); err != nil {
		t.Fatalf("the rogue tool server's report of the call completed: %v", err)
	}
	WaitTermination(t, admin, id, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	clk.Advance(2 * time.Minute) // past the confirm timeout: nobody confirms
	return WaitTermination(t, admin, id, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
}
