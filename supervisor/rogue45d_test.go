package supervisor

import (
	"testing"
	"time"
)

// Forty-fifth hostile pass, the supervisor's termination (letter D).

// TestRogue45DADrainWaitsForTheCancelsItCarries: a drain that took over a
// node aborting (an agent's own abort of its child, which an operator's
// drain supersedes) carries that node's calls with their cancel orders. It
// waits for them as for a call in flight: it ends when the gate has
// answered each, and at its window it escalates and waits for them up to
// its acknowledgement timeout, no longer. It ended at once before, as soon
// as no call without a cancel order was left.
func TestRogue45DADrainWaitsForTheCancelsItCarries(t *testing.T) {
	answered := runTranscript(t, newTerm(t, ModeDrain), t0, []step{
		{0, Progress{CallsInFlight: 1, CancelsPending: 2, Unconfirmed: 2}, ActMark, PhaseDraining},
		{time.Second, Progress{CancelsPending: 2, Unconfirmed: 2}, ActWait, PhaseDraining},
		{2 * time.Second, Progress{CancelsPending: 1, Unconfirmed: 2}, ActWait, PhaseDraining},
		{3 * time.Second, Progress{Unconfirmed: 2}, ActEndDrain, PhaseReconciling},
	})
	if answered.Escalated {
		t.Fatal("a drain whose carried cancels were answered inside its window was marked escalated")
	}

	silent := runTranscript(t, newTerm(t, ModeDrain), t0, []step{
		{0, Progress{CancelsPending: 1, Unconfirmed: 1}, ActMark, PhaseDraining},
		{30*time.Second - time.Nanosecond, Progress{CancelsPending: 1, Unconfirmed: 1}, ActWait, PhaseDraining},
		{30 * time.Second, Progress{CancelsPending: 1, Unconfirmed: 1}, ActEscalate, PhaseAborting},
		{35*time.Second - time.Nanosecond, Progress{CancelsPending: 1, Unconfirmed: 1}, ActWait, PhaseAborting},
		{35 * time.Second, Progress{CancelsPending: 1, Unconfirmed: 1}, ActRevoke, PhaseReconciling},
	})
	if got := silent.StoppedWaitingAt().Sub(t0); got != 35*time.Second {
		t.Fatalf("a gate silent about the cancels the drain carried held it for %s, want its window and its acknowledgement timeout, 35s", got)
	}
}
