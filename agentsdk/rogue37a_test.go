package agentsdk_test

import (
	"testing"
	"time"

	"github.com/tetherhq/tether/agentsdk"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The thirty-seventh hostile pass on the agent SDKs' side of a stop.

// TestRogue37ACallbackRegisteredAsTheDrainArrivesRunsAfterDraining: an
// OnDrain registered at the instant the drain arrives (the SDK has noted
// the drain, not yet closed Draining) is one registered after its signal,
// and runs at once — it must still run after Draining is closed, as
// OnDrain promises: an agent whose callback checks Draining (or starts
// work only while it is open) read "not draining" from inside its own
// drain callback.
func TestRogue37ACallbackRegisteredAsTheDrainArrivesRunsAfterDraining(t *testing.T) {
	a, operator, run := rogue36aAgent(t, "rogue37a-drain-instant")
	ranAfter, undo := agentsdk.RegisterAsTheSignalIsNoted(a, false)
	defer undo()
	run(func(*agentsdk.Agent) {})
	rogue36aTerminate(t, operator, a.NodeID(), tetherv1.TerminationMode_TERMINATION_MODE_DRAIN)
	select {
	case closed := <-ranAfter:
		if !closed {
			t.Fatal("an OnDrain registered as the drain arrived ran before Draining was closed")
		}
	case <-time.After(time.Minute):
		t.Fatal("the OnDrain registered as the drain arrived never ran")
	}
}

// TestRogue37ACallbackRegisteredAsTheAbortArrivesRunsAfterContextEnds: the
// same for OnAbort and Context: a callback run "after Context has ended"
// that found it still live let the work it guards start.
func TestRogue37ACallbackRegisteredAsTheAbortArrivesRunsAfterContextEnds(t *testing.T) {
	a, operator, run := rogue36aAgent(t, "rogue37a-abort-instant")
	ranAfter, undo := agentsdk.RegisterAsTheSignalIsNoted(a, true)
	defer undo()
	run(func(*agentsdk.Agent) {})
	rogue36aTerminate(t, operator, a.NodeID(), tetherv1.TerminationMode_TERMINATION_MODE_ABORT)
	select {
	case ended := <-ranAfter:
		if !ended {
			t.Fatal("an OnAbort registered as the abort arrived ran before Context ended")
		}
	case <-time.After(time.Minute):
		t.Fatal("the OnAbort registered as the abort arrived never ran")
	}
}
