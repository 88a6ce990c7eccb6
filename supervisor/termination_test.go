package supervisor

import (
	"strings"
	"testing"
	"time"
)

// step is one line of a termination transcript: observe progress at an
// offset, expect an action, and (unless waiting) perform it.
type step struct {
	at       time.Duration
	progress Progress
	want     Action
	phase    Phase // the phase after the action
}

func runTranscript(t *testing.T, term Termination, start time.Time, steps []step) Termination {
	t.Helper()
	for i, s := range steps {
		now := start.Add(s.at)
		got, _ := Next(term, s.progress, now)
		if got != s.want {
			t.Fatalf("step %d at +%s in %s: Next = %s, want %s", i, s.at, term.Phase, got, s.want)
		}
		var err error
		term, err = Advance(term, got, s.progress, now)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if term.Phase != s.phase {
			t.Fatalf("step %d: phase %s, want %s", i, term.Phase, s.phase)
		}
	}
	return term
}

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func newTerm(t *testing.T, mode Mode) Termination {
	t.Helper()
	term, err := NewTermination("t_1", "n_1", mode, 30*time.Second, 5*time.Second, 10*time.Second, "test", "operator:alice", t0)
	if err != nil {
		t.Fatal(err)
	}
	return term
}

func TestDrainLetsCallsFinishInsideTheWindow(t *testing.T) {
	term := runTranscript(t, newTerm(t, ModeDrain), t0, []step{
		{0, Progress{CallsInFlight: 2, Unconfirmed: 3}, ActMark, PhaseDraining},
		{10 * time.Second, Progress{CallsInFlight: 1, Unconfirmed: 3}, ActWait, PhaseDraining},
		{20 * time.Second, Progress{CallsInFlight: 0, Unconfirmed: 3}, ActEndDrain, PhaseReconciling},
		{20 * time.Second, Progress{Unconfirmed: 3}, ActRevoke, PhaseReconciling},
		{25 * time.Second, Progress{Unconfirmed: 1}, ActWait, PhaseReconciling},
		{26 * time.Second, Progress{Unconfirmed: 0}, ActWriteRecord, PhaseTerminated},
	})
	if term.Escalated {
		t.Fatal("a drain that finished in its window was marked escalated")
	}
	if got := phaseNames(term); got != "requested,draining,reconciling" {
		t.Fatalf("phases %s", got)
	}
	if term.Phases[1].Duration != 20*time.Second {
		t.Fatalf("draining lasted %s, want 20s", term.Phases[1].Duration)
	}
}

func TestDrainOutlastingItsWindowEscalatesToAbort(t *testing.T) {
	term := runTranscript(t, newTerm(t, ModeDrain), t0, []step{
		{0, Progress{CallsInFlight: 1, Unconfirmed: 1}, ActMark, PhaseDraining},
		{29 * time.Second, Progress{CallsInFlight: 1, Unconfirmed: 1}, ActWait, PhaseDraining},
		{30 * time.Second, Progress{CallsInFlight: 1, Unconfirmed: 1}, ActEscalate, PhaseAborting},
		{31 * time.Second, Progress{CancelsPending: 1, Unconfirmed: 1}, ActWait, PhaseAborting},
		{32 * time.Second, Progress{CancelsPending: 0, Unconfirmed: 1}, ActRevoke, PhaseReconciling},
	})
	if !term.Escalated {
		t.Fatal("escalation not recorded")
	}
}

func TestAbortGivesUpOnUnacknowledgedCancelsAtTheTimeout(t *testing.T) {
	runTranscript(t, newTerm(t, ModeAbort), t0, []step{
		{0, Progress{CallsInFlight: 1, Unconfirmed: 1}, ActMark, PhaseAborting},
		{0, Progress{CallsInFlight: 1, Unconfirmed: 1}, ActCancelCalls, PhaseAborting},
		{4 * time.Second, Progress{CancelsPending: 1, Unconfirmed: 1}, ActWait, PhaseAborting},
		{5 * time.Second, Progress{CancelsPending: 1, Unconfirmed: 1}, ActRevoke, PhaseReconciling},
		// The rogue never confirms: the record is written at the confirm timeout.
		{14 * time.Second, Progress{Unconfirmed: 1}, ActWait, PhaseReconciling},
		{15 * time.Second, Progress{Unconfirmed: 1}, ActWriteRecord, PhaseTerminated},
	})
}

func TestAdvanceRefusesIllegalEdges(t *testing.T) {
	term := newTerm(t, ModeDrain)
	for _, a := range []Action{ActEndDrain, ActEscalate, ActRevoke, ActWriteRecord, ActCancelCalls} {
		if _, err := Advance(term, a, Progress{}, t0); err == nil || !strings.Contains(err.Error(), "not allowed") {
			t.Errorf("%s from requested: err = %v", a, err)
		}
	}
	done := runTranscript(t, newTerm(t, ModeAbort), t0, []step{
		{0, Progress{}, ActMark, PhaseAborting},
		{0, Progress{}, ActCancelCalls, PhaseAborting},
		{0, Progress{}, ActRevoke, PhaseReconciling},
		{0, Progress{}, ActWriteRecord, PhaseTerminated},
	})
	if a, _ := Next(done, Progress{}, t0); a != ActNone {
		t.Fatalf("terminated: Next = %s", a)
	}
	if _, err := Advance(done, ActMark, Progress{}, t0); err == nil {
		t.Fatal("a terminated termination was marked again")
	}
}

func TestNewTerminationValidates(t *testing.T) {
	for _, tc := range []struct {
		mode  Mode
		drain time.Duration
		field string
	}{{0, time.Second, "mode"}, {ModeDrain, -time.Second, "drain_window"}, {ModeDrain, 48 * time.Hour, "drain_window"}} {
		_, err := NewTermination("t", "n", tc.mode, tc.drain, 0, 0, "", "x", t0)
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%+v: err = %v, want one naming %s", tc, err, tc.field)
		}
	}
}

func phaseNames(t Termination) string {
	var names []string
	for _, p := range t.Phases {
		names = append(names, p.Phase.String())
	}
	return strings.Join(names, ",")
}
