package coordinator_test

import (
	"context"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/supervisor/lease"
	"github.com/tetherhq/tether/supervisor/lease/coordinator"
)

// movedDuringTheStop starts a coordinator over a gated Badger store with
// two jobs held by w1, "a" and "b", and returns it with a function that
// runs stop (a termination's CancelHeldBy or FinalizeHeldBy of w1) so that
// job "b" is reassigned to w2 after stop listed w1's jobs and before it
// judged anything for "b": the lineage (or an operator, or a rollout's
// handover) moving the job to an agent the termination does not stop.
func movedDuringTheStop(t *testing.T) (*harness, func(stop func() error)) {
	st := &gatedStore{Store: openStore(t, t.TempDir())}
	t.Cleanup(func() { st.Store.Close() })
	clk := clock.NewManual(t0)
	h := start(t, st, clk, lease.DefaultPolicy())
	h.active("a", "w1", time.Minute)
	h.active("b", "w1", time.Minute)
	// One job at a time: "b" is judged only once "a"'s commit returned.
	coordinator.SetApplyWindow(t, 1)
	return h, func(stop func() error) {
		t.Helper()
		st.hold()
		stopped := make(chan error, 1)
		go func() { stopped <- stop() }()
		<-st.entered // "a" is being committed; "b" was listed and waits
		moved := make(chan coordinator.Result, 1)
		h.c.Submit(lease.Reassign{JobID: "b", LeaseID: "L-b2", HolderIdentity: "w2", LeaseDuration: time.Minute, Reason: "operator: w1 is being stopped, w2 takes b"},
			nil, func(r coordinator.Result, err error) {
				if err != nil {
					t.Errorf("reassign: %v", err)
				}
				moved <- r
			})
		st.release()
		if err := <-stopped; err != nil {
			t.Fatal(err)
		}
		if r := <-moved; r.Decision.Outcome != lease.OutcomeAccepted {
			t.Fatalf("the reassignment to w2: %s", r.Decision)
		}
	}
}

// wantUntouchedSuccessor checks that job "b", moved to w2, is generation 2
// OFFERED to w2 as the reassignment left it.
func wantUntouchedSuccessor(t *testing.T, h *harness) {
	t.Helper()
	l := h.get("b")
	if l.Generation != 2 || l.HolderIdentity != "w2" || l.State != lease.StateOffered || l.CancelRequested || l.TerminalResult != lease.ResultUnspecified {
		t.Fatalf("job b, moved to w2 during w1's stop, is generation %d held by %s, %s, cancel requested %v, result %s; want generation 2 OFFERED to w2 as the reassignment left it",
			l.Generation, l.HolderIdentity, l.State, l.CancelRequested, l.TerminalResult)
	}
}

// TestRogue23AStopsCancelDoesNotFollowAJobToItsNewHolder: a termination's
// CancelHeldBy listed the stopped holder's jobs, then requested the
// cancellation of each whoever held it when it was judged. A job moved to
// an agent the termination does not stop between the two (a reassignment
// in the same instant, or with thousands of jobs a few commits later) had
// its new generation cancelled: w2's work halted by w1's stop, its renewals
// refused (seen failing: job b, generation 2 OFFERED to w2, cancel
// requested). The request is now made only while the job is still held by
// one of the stopped holders.
func TestRogue23AStopsCancelDoesNotFollowAJobToItsNewHolder(t *testing.T) {
	h, during := movedDuringTheStop(t)
	during(func() error { return h.c.CancelHeldBy(context.Background(), []string{"w1"}, "terminated") })
	if !h.get("a").CancelRequested {
		t.Fatal("job a, still held by w1, has no cancel request")
	}
	wantUntouchedSuccessor(t, h)
}

// TestRogue23AStopsReconciliationDoesNotEndAJobItsHolderLost: the same
// for FinalizeHeldBy, the termination's terminal reconciliation: the job
// moved to w2 was cancelled and resolved CANCELLED ("the holder never
// acknowledged the offer") in w1's name, and reported in w1's record (seen
// failing: b TERMINAL CANCELLED, held by w2, in the record). It now ends
// only the jobs the stopped holders still hold, and reports only those.
func TestRogue23AStopsReconciliationDoesNotEndAJobItsHolderLost(t *testing.T) {
	h, during := movedDuringTheStop(t)
	var got []lease.Lease
	during(func() (err error) {
		got, err = h.c.FinalizeHeldBy(context.Background(), []string{"w1"}, "terminated")
		return err
	})
	var reported []string
	for _, l := range got {
		reported = append(reported, l.JobID+" held by "+l.HolderIdentity+" "+l.State.String()+" "+l.TerminalResult.String())
	}
	if len(got) != 1 || got[0].JobID != "a" || got[0].State != lease.StateTerminal {
		t.Fatalf("the reconciliation reports %q; want only job a, terminal", reported)
	}
	wantUntouchedSuccessor(t, h)
}
