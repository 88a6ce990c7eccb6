package supervisor

import (
	"testing"
	"time"
)

// Thirty-fourth hostile pass (letter G): the stop the proposal policy
// starts on its own (a stop rule's action) and an agent's own stop
// proposal that an operator approved.

// TestRogue34GPolicyTakesOverAnAgentsOwnApprovedStopAsItSupersedesIt is
// the decision as a transcript: a rogue proposes its own drain with a
// day's window and an operator approves it (the operator's authority, the
// rogue's window); the operator's critical rule, whose action is abort,
// becomes true on the rogue while its call is in flight. The policy's
// abort takes the node over (it used to wait, pending, for an operator:
// the same authority), marks it aborting and orders the cancel at once;
// the rogue's stop, left with nothing, finishes without waiting out its
// day. Against the operator's own drain the policy still waits, and an
// agent's own rule never takes the agent's own stop.
func TestRogue34GPolicyTakesOverAnAgentsOwnApprovedStopAsItSupersedesIt(t *testing.T) {
	own := newTermBy(t, "t_own", "operator:alice", ModeDrain, MaxTerminationWindow)
	own.AgentWindows = true
	own.ProposerLineage = []string{"n_top", "n_rogue"}
	own.Counts = Counts{Listed: 1, Members: 1}
	own = runTranscript(t, own, t0, []step{
		{0, Progress{CallsInFlight: 1, Unconfirmed: 1}, ActMark, PhaseDraining},
		{time.Minute, Progress{CallsInFlight: 1, Unconfirmed: 1}, ActWait, PhaseDraining},
	})

	ruleAbort := Termination{RequestedBy: PolicyDecider + "stop-rule-action", Mode: ModeAbort}
	ruleDrain := Termination{RequestedBy: PolicyDecider + "stop-rule-action", Mode: ModeDrain}
	ancestorsRuleAbort := Termination{RequestedBy: PolicyDecider + "stop-rule-action", RequesterLineage: []string{"n_top"}, Mode: ModeAbort}
	ownRuleAbort := Termination{RequestedBy: PolicyDecider + "stop-rule-action", RequesterLineage: []string{"n_top", "n_rogue"}, Mode: ModeAbort}
	opDrain := newTermBy(t, "t_op", "operator:alice", ModeDrain, time.Hour)
	opDrain.Phase = PhaseDraining
	policyApproved := own
	policyApproved.RequestedBy = PolicyDecider + "auto-approve"
	policyApproved.RequesterLineage = own.ProposerLineage
	for _, tc := range []struct {
		name        string
		t, owner    Termination
		takesOver   bool
		supersedes  bool
		description string
	}{
		{"operator's rule abort over the rogue's own drain an operator approved", ruleAbort, own, true, true, "the rogue's window binds no one"},
		{"operator's rule drain over the rogue's own drain an operator approved", ruleDrain, own, true, true, "a drain takes over a drain"},
		{"ancestor's rule abort over the rogue's own drain an operator approved", ancestorsRuleAbort, own, true, true, "its ancestors may take it over"},
		{"the rogue's own rule abort over its own drain an operator approved", ownRuleAbort, own, false, false, "the rogue outranks nothing"},
		{"operator's rule abort over the operator's own drain", ruleAbort, opDrain, false, true, "the operator's windows are kept"},
		{"operator's rule abort over the rogue's own drain the policy approved", ruleAbort, policyApproved, true, true, "an operator's over an agent's"},
	} {
		if got := PolicyTakesOver(tc.t, tc.owner); got != tc.takesOver {
			t.Errorf("%s: PolicyTakesOver = %v, want %v (%s)", tc.name, got, tc.takesOver, tc.description)
		}
		if got := Supersedes(tc.t, tc.owner); got != tc.supersedes {
			t.Errorf("%s: Supersedes = %v, want %v", tc.name, got, tc.supersedes)
		}
	}

	// The policy's abort, written as decideIn writes it, takes the node
	// over: the rogue's drain hands it over and finishes now.
	abort := newTermBy(t, "t_rule", PolicyDecider+"stop-rule-action", ModeAbort, DefaultDrainWindow)
	if got := Inherit(abort, own); got.KeptDrainDeadline != (time.Time{}) || got.KeptCancelDeadline != (time.Time{}) {
		t.Fatalf("the policy's abort kept the rogue's deadlines: drain %s, cancel %s", got.KeptDrainDeadline, got.KeptCancelDeadline)
	}
	own = HandOver(own, map[string]bool{"n_rogue": true}, abort.ID, t0.Add(time.Minute))
	runTranscript(t, own, t0, []step{
		{time.Minute, Progress{}, ActWriteRecord, PhaseTerminated},
	})
	abort.Counts = Counts{Listed: 1, Members: 1}
	runTranscript(t, abort, t0.Add(time.Minute), []step{
		{0, Progress{CallsInFlight: 1, Unconfirmed: 1}, ActMark, PhaseAborting},
		{0, Progress{CallsInFlight: 1, Unconfirmed: 1}, ActCancelCalls, PhaseAborting},
		{5 * time.Second, Progress{Unconfirmed: 1}, ActRevoke, PhaseReconciling},
	})
}

// TestRogue34GARolloutsBatchTakesOverAnAgentsOwnApprovedStop: the same
// agent's own drain, approved by an operator (the operator's rank, the
// agent's window), is taken over by a rollout's batch as by an ancestor's
// stop (a drain a drain, an abort never by a drain), bound by its
// deadlines (Inherit): a rollout used to leave the agent out, draining on
// its own day-long window.
func TestRogue34GARolloutsBatchTakesOverAnAgentsOwnApprovedStop(t *testing.T) {
	own := newTermBy(t, "t_own", "operator:alice", ModeDrain, MaxTerminationWindow)
	own.AgentWindows = true
	own.ProposerLineage = []string{"n_top", "n_rogue"}
	own.Counts = Counts{Listed: 1, Members: 1}
	own = runTranscript(t, own, t0, []step{
		{0, Progress{CallsInFlight: 1, Unconfirmed: 1}, ActMark, PhaseDraining},
	})
	ownAbort := newTermBy(t, "t_own_abort", "operator:alice", ModeAbort, 0)
	ownAbort.AgentWindows = true
	ownAbort.ProposerLineage = own.ProposerLineage
	opDrain := newTermBy(t, "t_op", "operator:alice", ModeDrain, MaxTerminationWindow)
	batch := newTermBy(t, "t_batch", "operator:bob", ModeDrain, time.Second)
	batch.RolloutID = "ro_1"
	for _, tc := range []struct {
		name  string
		owner Termination
		want  bool
	}{
		{"a batch over the agent's own drain an operator approved", own, true},
		{"a batch never slows the agent's own abort an operator approved", ownAbort, false},
		{"a batch never takes an operator's own drain", opDrain, false},
	} {
		if got := Supersedes(batch, tc.owner); got != tc.want {
			t.Errorf("%s: Supersedes = %v, want %v", tc.name, got, tc.want)
		}
	}
	kept := Inherit(batch, own)
	if !kept.KeptDrainDeadline.Equal(own.DrainDeadline) || kept.CancelAckTimeout > own.CancelAckTimeout || kept.ConfirmTimeout > own.ConfirmTimeout {
		t.Fatalf("the batch over the approved stop keeps drain deadline %s (want %s), windows %s/%s (want at most %s/%s)",
			kept.KeptDrainDeadline, own.DrainDeadline, kept.CancelAckTimeout, kept.ConfirmTimeout, own.CancelAckTimeout, own.ConfirmTimeout)
	}
	// The batch's own one-second window is the earlier bound: the mark's
	// drain deadline is the batch's, not the agent's day.
	kept.Counts = Counts{Listed: 1, Members: 1}
	runTranscript(t, kept, t0, []step{
		{0, Progress{CallsInFlight: 1, Unconfirmed: 1}, ActMark, PhaseDraining},
		{time.Second, Progress{CallsInFlight: 1, Unconfirmed: 1}, ActEscalate, PhaseAborting},
	})
}
