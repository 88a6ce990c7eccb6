package supervisor

import (
	"strings"
	"testing"
	"time"

	"github.com/tetherhq/tether/supervisor/tree"
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
	if got := phasesOf(term); got != "requested,draining,reconciling" {
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

// TestAnUnacknowledgedCallIsClosedWhereTheTerminationStoppedWaiting: the
// termination stops waiting for its gates when it enters reconciling —
// at the acknowledgement deadline here, at the escalation's own deadline
// after a drain — and that instant, not the record's (written ten seconds
// later, at the confirm timeout), dates a call closed
// cancel_unacknowledged. Before reconciling there is none.
func TestAnUnacknowledgedCallIsClosedWhereTheTerminationStoppedWaiting(t *testing.T) {
	abort := newTerm(t, ModeAbort)
	if at := abort.StoppedWaitingAt(); !at.IsZero() {
		t.Fatalf("a requested termination stopped waiting at %s", at)
	}
	aborting := runTranscript(t, abort, t0, []step{
		{0, Progress{CallsInFlight: 1, Unconfirmed: 1}, ActMark, PhaseAborting},
		{0, Progress{CallsInFlight: 1, Unconfirmed: 1}, ActCancelCalls, PhaseAborting},
	})
	if at := aborting.StoppedWaitingAt(); !at.IsZero() {
		t.Fatalf("an aborting termination stopped waiting at %s", at)
	}
	done := runTranscript(t, aborting, t0, []step{
		{5 * time.Second, Progress{CancelsPending: 1, Unconfirmed: 1}, ActRevoke, PhaseReconciling},
		{15 * time.Second, Progress{Unconfirmed: 1}, ActWriteRecord, PhaseTerminated},
	})
	if at := done.StoppedWaitingAt(); !at.Equal(t0.Add(5 * time.Second)) {
		t.Fatalf("the abort stopped waiting at %s, want its acknowledgement deadline %s", at, t0.Add(5*time.Second))
	}
	drained := runTranscript(t, newTerm(t, ModeDrain), t0, []step{
		{0, Progress{CallsInFlight: 1, Unconfirmed: 1}, ActMark, PhaseDraining},
		{30 * time.Second, Progress{CallsInFlight: 1, Unconfirmed: 1}, ActEscalate, PhaseAborting},
		{35 * time.Second, Progress{CancelsPending: 1, Unconfirmed: 1}, ActRevoke, PhaseReconciling},
		{45 * time.Second, Progress{Unconfirmed: 1}, ActWriteRecord, PhaseTerminated},
	})
	if at := drained.StoppedWaitingAt(); !at.Equal(t0.Add(35 * time.Second)) {
		t.Fatalf("the escalated drain stopped waiting at %s, want the escalation's deadline %s", at, t0.Add(35*time.Second))
	}
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

func phasesOf(t Termination) string {
	var names []string
	for _, p := range t.Phases {
		names = append(names, p.Phase.String())
	}
	return strings.Join(names, ",")
}

func newTermBy(t *testing.T, id, by string, mode Mode, drain time.Duration) Termination {
	t.Helper()
	term, err := NewTermination(id, "n_root", mode, drain, 5*time.Second, 10*time.Second, "test", by, t0)
	if err != nil {
		t.Fatal(err)
	}
	return term
}

func TestSupersedesRanksAuthorityThenAbortOverDrain(t *testing.T) {
	agentDrain := newTermBy(t, "t_a", "agent:n_parent", ModeDrain, 24*time.Hour)
	agentDrain.RequesterLineage = []string{"n_top", "n_parent"}
	agentAbort := newTermBy(t, "t_b", "agent:n_parent", ModeAbort, 0)
	agentAbort.RequesterLineage = agentDrain.RequesterLineage
	ancestorDrain := newTermBy(t, "t_f", "agent:n_top", ModeDrain, time.Hour)
	ancestorDrain.RequesterLineage = []string{"n_top"}
	descendantAbort := newTermBy(t, "t_g", "agent:n_child", ModeAbort, 0)
	descendantAbort.RequesterLineage = []string{"n_top", "n_parent", "n_child"}
	opDrain := newTermBy(t, "t_c", "operator:alice", ModeDrain, time.Minute)
	opAbort := newTermBy(t, "t_d", "operator:alice", ModeAbort, 0)
	rollout := newTermBy(t, "t_e", "operator:alice", ModeDrain, time.Minute)
	rollout.RolloutID = "ro_1"
	escalated := agentDrain
	escalated.Escalated = true
	for _, tc := range []struct {
		name       string
		t, other   Termination
		supersedes bool
	}{
		{"operator abort over an agent's long drain", opAbort, agentDrain, true},
		{"operator drain over an agent's abort (a higher authority is never held back)", opDrain, agentAbort, true},
		{"agent abort over an agent's drain (abort supersedes drain)", agentAbort, agentDrain, true},
		{"agent drain over an agent's drain (the outer covers its subtree)", agentDrain, agentDrain, true},
		{"agent drain never slows an agent's abort", agentDrain, agentAbort, false},
		{"agent drain never slows an escalated drain", agentDrain, escalated, false},
		{"agent abort never takes an operator's drain", agentAbort, opDrain, false},
		{"agent drain never takes an operator's drain", agentDrain, opDrain, false},
		{"operator drain never slows an operator's abort", opDrain, opAbort, false},
		{"operator abort over an operator's abort", opAbort, opAbort, true},
		{"rollout batch over an agent's abort", rollout, agentAbort, true},
		{"an ancestor agent's drain over its descendant's drain", ancestorDrain, agentDrain, true},
		{"a descendant agent's drain never takes its ancestor's drain", agentDrain, ancestorDrain, false},
		{"a descendant agent's abort never takes its ancestor's drain", descendantAbort, agentDrain, false},
		{"rollout batch never takes an operator's drain", rollout, opDrain, false},
	} {
		if got := Supersedes(tc.t, tc.other); got != tc.supersedes {
			t.Errorf("%s: Supersedes = %v, want %v", tc.name, got, tc.supersedes)
		}
	}
}

func TestReachNode(t *testing.T) {
	outer := newTermBy(t, "t_outer", "operator:alice", ModeAbort, 0)
	inner := newTermBy(t, "t_inner", "agent:n_parent", ModeDrain, 24*time.Hour)
	inner.Phase = PhaseDraining
	inner.RequesterLineage = []string{"n_top", "n_parent"}
	opAbort := newTermBy(t, "t_op", "operator:bob", ModeAbort, 0)
	opAbort.Phase = PhaseAborting
	done := inner
	done.Phase = PhaseTerminated
	agentOuter := newTermBy(t, "t_agent", "agent:n_top", ModeDrain, time.Hour)
	for _, tc := range []struct {
		t     Termination
		state tree.NodeState
		owner Termination
		want  Reach
	}{
		{outer, tree.NodeStateRunning, Termination{}, ReachMark},
		{outer, tree.NodeStateDraining, inner, ReachTakeOver},
		{outer, tree.NodeStateTerminated, done, ReachPrior},
		{agentOuter, tree.NodeStateAborting, opAbort, ReachLeave},
		{agentOuter, tree.NodeStateDraining, inner, ReachTakeOver},
	} {
		if got := ReachNode(tc.t, tc.state, tc.owner); got != tc.want {
			t.Errorf("%s reaching a %s node of %s: %d, want %d", tc.t.ID, tc.state, tc.owner.ID, got, tc.want)
		}
	}
	if s := MarkedState(newTermBy(t, "t_x", "operator:a", ModeDrain, time.Minute), tree.NodeStateAborting); s != tree.NodeStateAborting {
		t.Fatalf("a drain taking over an aborting node made it %s: a node never goes back to draining", s)
	}
}

// TestAnOperatorAbortSupersedesAnAgentsLongDrain is the composition as a
// transcript: an agent drains its child's subtree with a 24 h window; an
// operator's abort of the parent takes every node over. The inner
// termination, left with nothing, finishes at once with a record naming
// the outer one; the outer runs its abort to the end.
func TestAnOperatorAbortSupersedesAnAgentsLongDrain(t *testing.T) {
	inner := runTranscript(t, newTermBy(t, "t_inner", "agent:n_parent", ModeDrain, 24*time.Hour), t0, []step{
		{0, Progress{CallsInFlight: 1, Unconfirmed: 2}, ActMark, PhaseDraining},
		{time.Second, Progress{CallsInFlight: 1, Unconfirmed: 2}, ActWait, PhaseDraining},
	})
	inner.Counts = Counts{Listed: 2, Members: 2} // the index lists n_child, n_grandchild
	outer := newTermBy(t, "t_outer", "operator:alice", ModeAbort, 0)
	if !Supersedes(outer, inner) {
		t.Fatal("an operator's abort does not supersede an agent's drain")
	}
	// The outer's mark takes both nodes over: the inner hands them over.
	inner = HandOver(inner, map[string]bool{"n_child": true, "n_grandchild": true}, outer.ID, t0.Add(2*time.Second))
	if inner.MemberCount() != 0 || inner.HandedOverCount() != 2 || len(inner.SupersededByIDs()) != 1 || inner.SupersededByIDs()[0] != "t_outer" {
		t.Fatalf("after the handover: %d members, %d handed over to %v", inner.MemberCount(), inner.HandedOverCount(), inner.SupersededByIDs())
	}
	if !inner.Superseded() {
		t.Fatal("a termination with every node taken over is not superseded")
	}
	// It does not wait out its 24 h window: the record is written now.
	inner = runTranscript(t, inner, t0, []step{
		{2 * time.Second, Progress{}, ActWriteRecord, PhaseTerminated},
	})
	if a, _ := Next(inner, Progress{}, t0.Add(3*time.Second)); a != ActNone {
		t.Fatalf("a superseded termination, finished: Next = %s", a)
	}
	outer.Counts = Counts{Listed: 3, Members: 3}
	runTranscript(t, outer, t0.Add(2*time.Second), []step{
		{0, Progress{CallsInFlight: 1, Unconfirmed: 3}, ActMark, PhaseAborting},
		{0, Progress{CallsInFlight: 1, Unconfirmed: 3}, ActCancelCalls, PhaseAborting},
		{time.Second, Progress{CancelsPending: 0, Unconfirmed: 3}, ActRevoke, PhaseReconciling},
		{2 * time.Second, Progress{Unconfirmed: 0}, ActWriteRecord, PhaseTerminated},
	})
}

// TestAPartlyTakenOverTerminationGoesOn: a termination that keeps some
// members (a rollout batch of several roots, one of them taken over) runs
// its phases for the rest and is not superseded.
func TestAPartlyTakenOverTerminationGoesOn(t *testing.T) {
	term := newTerm(t, ModeDrain)
	term.Counts = Counts{Listed: 2, Members: 2}
	term = runTranscript(t, term, t0, []step{{0, Progress{CallsInFlight: 1, Unconfirmed: 2}, ActMark, PhaseDraining}})
	term = HandOver(term, map[string]bool{"n_b": true}, "t_other", t0.Add(time.Second))
	if term.Superseded() || term.MemberCount() != 1 || term.Progress.Unconfirmed != 1 {
		t.Fatalf("after handing one of two over: superseded=%v members=%d unconfirmed=%d", term.Superseded(), term.MemberCount(), term.Progress.Unconfirmed)
	}
	runTranscript(t, term, t0, []step{
		{5 * time.Second, Progress{CallsInFlight: 1, Unconfirmed: 1}, ActWait, PhaseDraining},
		{6 * time.Second, Progress{Unconfirmed: 1}, ActEndDrain, PhaseReconciling},
	})
	if _, err := Advance(term, ActWriteRecord, Progress{}, t0); err == nil {
		t.Fatal("a draining termination that still has members wrote its record")
	}
}

// TestHangingHooksBecomeRevokeFailedAtTheHookDeadline: the record waits for
// the privilege revocations only up to the hook deadline, on the injected
// clock, whatever the confirmations do.
func TestHangingHooksBecomeRevokeFailedAtTheHookDeadline(t *testing.T) {
	term := newTerm(t, ModeAbort) // confirm timeout 10 s
	term.HookTimeout = 3 * time.Second
	term = runTranscript(t, term, t0, []step{
		{0, Progress{Unconfirmed: 1}, ActMark, PhaseAborting},
		{0, Progress{Unconfirmed: 1}, ActCancelCalls, PhaseAborting},
		{0, Progress{Unconfirmed: 1}, ActRevoke, PhaseReconciling},
	})
	if !term.HookDeadline.Equal(t0.Add(3 * time.Second)) {
		t.Fatalf("hook deadline %s, want revoke + 3s", term.HookDeadline)
	}
	// Confirmed at once, hooks hanging: the record waits for the hooks...
	if a, wake := Next(term, Progress{HooksPending: 12}, t0.Add(time.Second)); a != ActWait || !wake.Equal(term.HookDeadline) {
		t.Fatalf("hooks pending before their deadline: %s until %s", a, wake)
	}
	// ...only until their deadline.
	runTranscript(t, term, t0, []step{{3 * time.Second, Progress{HooksPending: 12}, ActWriteRecord, PhaseTerminated}})
	// Hooks answered, confirmations pending: the confirm deadline rules.
	if a, wake := Next(term, Progress{Unconfirmed: 1}, t0.Add(time.Second)); a != ActWait || !wake.Equal(term.ConfirmDeadline) {
		t.Fatalf("confirmations pending: %s until %s", a, wake)
	}
	// Both pending: wake at the earlier deadline.
	if _, wake := Next(term, Progress{Unconfirmed: 1, HooksPending: 1}, t0.Add(time.Second)); !wake.Equal(term.HookDeadline) {
		t.Fatalf("both pending: wake %s, want the hook deadline", wake)
	}
}
