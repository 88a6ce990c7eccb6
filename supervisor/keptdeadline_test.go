package supervisor

import (
	"testing"
	"time"
)

// TestARepeatedStopKeepsTheDeadlineItTakesOver is a transcript: an
// operator drains a node with a 10 s window; at 9 s the same request
// again (a client's retry) takes the node over. Its drain escalates at the
// first one's deadline, not 10 s after its own mark.
func TestARepeatedStopKeepsTheDeadlineItTakesOver(t *testing.T) {
	first := runTranscript(t, newTermBy(t, "t_first", "operator:alice", ModeDrain, 10*time.Second), t0, []step{
		{0, Progress{CallsInFlight: 1, Unconfirmed: 1}, ActMark, PhaseDraining},
	})
	again := newTermBy(t, "t_again", "operator:alice", ModeDrain, 10*time.Second)
	if !Supersedes(again, first) {
		t.Fatal("a repeated drain does not take the node over")
	}
	again = Inherit(again, first)
	runTranscript(t, again, t0, []step{
		{9 * time.Second, Progress{CallsInFlight: 1, Unconfirmed: 1}, ActMark, PhaseDraining},
		{10*time.Second - time.Nanosecond, Progress{CallsInFlight: 1, Unconfirmed: 1}, ActWait, PhaseDraining},
		{10 * time.Second, Progress{CallsInFlight: 1, Unconfirmed: 1}, ActEscalate, PhaseAborting},
	})
}

// TestARepeatedAbortKeepsTheAcknowledgementDeadline: an operator aborts
// with a 5 s acknowledgement timeout, and again at 4 s; the second abort,
// taking the node and its call over, stops waiting at 5 s.
func TestARepeatedAbortKeepsTheAcknowledgementDeadline(t *testing.T) {
	first := runTranscript(t, newTermBy(t, "t_first", "operator:alice", ModeAbort, 0), t0, []step{
		{0, Progress{CallsInFlight: 1, Unconfirmed: 1}, ActMark, PhaseAborting},
		{0, Progress{CallsInFlight: 1, Unconfirmed: 1}, ActCancelCalls, PhaseAborting},
	})
	again := Inherit(newTermBy(t, "t_again", "operator:bob", ModeAbort, 0), first)
	again = runTranscript(t, again, t0, []step{
		{4 * time.Second, Progress{CancelsPending: 1, Unconfirmed: 1}, ActMark, PhaseAborting},
		{4 * time.Second, Progress{CancelsPending: 1, Unconfirmed: 1}, ActCancelCalls, PhaseAborting},
		{5*time.Second - time.Nanosecond, Progress{CancelsPending: 1, Unconfirmed: 1}, ActWait, PhaseAborting},
		{5 * time.Second, Progress{CancelsPending: 1, Unconfirmed: 1}, ActRevoke, PhaseReconciling},
	})
	if !again.CancelDeadline.Equal(t0.Add(5 * time.Second)) {
		t.Fatalf("the repeated abort's acknowledgement deadline is %s, want the first's %s", again.CancelDeadline, t0.Add(5*time.Second))
	}
}

// TestOnlyTheSameAuthorityBindsATakeOverToItsDeadlines: an agent's drain
// of its own child with no window does not shorten an operator's drain
// that takes the child over (the agent would otherwise turn the
// operator's drain of its siblings into an abort); an agent's own repeat
// keeps its deadline; another agent's (an ancestor's) does not inherit it.
func TestOnlyTheSameAuthorityBindsATakeOverToItsDeadlines(t *testing.T) {
	agentDrain := newTermBy(t, "t_agent", "agent:n_parent", ModeDrain, 0)
	agentDrain.RequesterLineage = []string{"n_top", "n_parent"}
	agentDrain = runTranscript(t, agentDrain, t0, []step{{0, Progress{CallsInFlight: 1}, ActMark, PhaseDraining}})
	op := Inherit(newTermBy(t, "t_op", "operator:alice", ModeDrain, time.Minute), agentDrain)
	if !op.KeptDrainDeadline.IsZero() {
		t.Fatalf("an operator's drain kept an agent's deadline %s", op.KeptDrainDeadline)
	}
	same := newTermBy(t, "t_same", "agent:n_parent", ModeDrain, time.Minute)
	same.RequesterLineage = agentDrain.RequesterLineage
	if got := Inherit(same, agentDrain).KeptDrainDeadline; !got.Equal(t0) {
		t.Fatalf("the agent's own repeat kept %s, want its first deadline %s", got, t0)
	}
	// An agent's own stop proposal, approved by an operator, runs with the
	// agent's window: an operator's later drain of the agent's parent,
	// taking the agent over, keeps its own.
	proposed := runTranscript(t, newTermBy(t, "t_prop", "operator:alice", ModeAbort, 0), t0, []step{{0, Progress{CallsInFlight: 1}, ActMark, PhaseAborting}})
	proposed.ProposalID, proposed.AgentWindows = "p_1", true
	if got := Inherit(newTermBy(t, "t_op2", "operator:alice", ModeAbort, 0), proposed).KeptCancelDeadline; !got.IsZero() {
		t.Fatalf("an operator's abort kept the deadline %s of an agent's approved proposal", got)
	}
	// The agent's own later proposal (a decoy with a longer window),
	// approved after the first, keeps the first one's deadline.
	decoy := newTermBy(t, "t_decoy", "operator:alice", ModeAbort, 0)
	decoy.ProposalID, decoy.AgentWindows = "p_2", true
	if got := Inherit(decoy, proposed).KeptCancelDeadline; got.IsZero() {
		t.Fatal("the agent's second approved proposal did not keep the first one's deadline")
	}
	// Another agent's proposal (its parent's, covering the proposer) is
	// not bound by the child's choice.
	parents := decoy
	parents.NodeID = "n_parent"
	if got := Inherit(parents, proposed).KeptCancelDeadline; !got.IsZero() {
		t.Fatalf("the parent's approved proposal kept its child's proposed deadline %s", got)
	}
	// A stop rule's windows are its setter's: an operator's rule binds the
	// operator's later stop like the operator's own.
	ruled := proposed
	ruled.AgentWindows = false
	if got := Inherit(newTermBy(t, "t_op3", "operator:alice", ModeAbort, 0), ruled).KeptCancelDeadline; got.IsZero() {
		t.Fatal("an operator's abort did not keep the deadline of the abort an operator's stop rule started")
	}
	ancestor := newTermBy(t, "t_anc", "agent:n_top", ModeDrain, time.Minute)
	ancestor.RequesterLineage = []string{"n_top"}
	if got := Inherit(ancestor, agentDrain).KeptDrainDeadline; !got.IsZero() {
		t.Fatalf("an ancestor agent's drain kept its descendant's deadline %s", got)
	}
}

// TestARepeatedStopDoesNotPostponeTheRecord: a drain reconciling, its
// record waiting up to 10 s for confirmations, is taken over at 5 s by the
// same request again; the record is due at the first one's deadline.
func TestARepeatedStopDoesNotPostponeTheRecord(t *testing.T) {
	first := runTranscript(t, newTermBy(t, "t_first", "operator:alice", ModeDrain, time.Second), t0, []step{
		{0, Progress{Unconfirmed: 1}, ActMark, PhaseDraining},
		{0, Progress{Unconfirmed: 1}, ActEndDrain, PhaseReconciling},
		{0, Progress{Unconfirmed: 1}, ActRevoke, PhaseReconciling},
	})
	again := Inherit(newTermBy(t, "t_again", "operator:alice", ModeDrain, time.Second), first)
	runTranscript(t, again, t0, []step{
		{5 * time.Second, Progress{Unconfirmed: 1}, ActMark, PhaseDraining},
		{5 * time.Second, Progress{Unconfirmed: 1}, ActEndDrain, PhaseReconciling},
		{5 * time.Second, Progress{Unconfirmed: 1}, ActRevoke, PhaseReconciling},
		{10*time.Second - time.Nanosecond, Progress{Unconfirmed: 1}, ActWait, PhaseReconciling},
		{10 * time.Second, Progress{Unconfirmed: 1}, ActWriteRecord, PhaseTerminated},
	})
}

// TestABoundIsKeptOnlyWhileItsOwnerWaitsOnIt: a drain that ended (its
// node had no call left) and is reconciling binds a later drain's
// confirmation wait, not its drain window: the later drain, an hour on,
// does not escalate at once on the first one's long-past drain deadline.
func TestABoundIsKeptOnlyWhileItsOwnerWaitsOnIt(t *testing.T) {
	first := runTranscript(t, newTermBy(t, "t_first", "operator:alice", ModeDrain, time.Second), t0, []step{
		{0, Progress{Unconfirmed: 1}, ActMark, PhaseDraining},
		{0, Progress{Unconfirmed: 1}, ActEndDrain, PhaseReconciling},
		{0, Progress{Unconfirmed: 1}, ActRevoke, PhaseReconciling},
	})
	outer := Inherit(newTermBy(t, "t_outer", "operator:alice", ModeDrain, time.Minute), first)
	if !outer.KeptDrainDeadline.IsZero() || !outer.KeptConfirmDeadline.Equal(first.ConfirmDeadline) {
		t.Fatalf("kept drain deadline %s and confirm deadline %s; want none, and %s", outer.KeptDrainDeadline, outer.KeptConfirmDeadline, first.ConfirmDeadline)
	}
	runTranscript(t, outer, t0, []step{
		{time.Hour, Progress{CallsInFlight: 1, Unconfirmed: 2}, ActMark, PhaseDraining},
		{time.Hour + time.Second, Progress{CallsInFlight: 1, Unconfirmed: 2}, ActWait, PhaseDraining},
	})
}

// TestOnlyTheProposersAncestorsTakeOverItsApprovedStop: an agent's own stop
// proposal an operator approved keeps the operator's rank against
// everyone but the proposer's strict ancestors: their abort takes it over
// (and their drain a drain), bound by its deadline and its acknowledgement
// and confirm windows; the proposer's own descendants (stopping, but not
// yet marked when the mark walks down) do not. A rollout batch takes it
// over as the ancestors do (since the thirty-fourth pass: it was left out
// of the rollout, rogue34g test), and its drain never an approved abort.
func TestOnlyTheProposersAncestorsTakeOverItsApprovedStop(t *testing.T) {
	approved := newTermBy(t, "t_approved", "operator:alice", ModeDrain, 10*time.Second)
	approved.AgentWindows = true
	approved.ProposerLineage = []string{"n_top", "n_parent", "n_rogue"}
	approved.CancelAckTimeout, approved.ConfirmTimeout = 10*time.Second, 30*time.Second
	approved = runTranscript(t, approved, t0, []step{{0, Progress{CallsInFlight: 1}, ActMark, PhaseDraining}})
	by := func(id, node string, lineage []string, mode Mode) Termination {
		x := newTermBy(t, id, "agent:"+node, mode, 24*time.Hour)
		x.RequesterLineage = lineage
		x.CancelAckTimeout, x.ConfirmTimeout = 24*time.Hour, 24*time.Hour
		return x
	}
	parentAbort := by("t_parent", "n_parent", []string{"n_top", "n_parent"}, ModeAbort)
	if !Supersedes(parentAbort, approved) {
		t.Fatal("the proposer's parent's abort does not take its approved drain over")
	}
	topDrain := by("t_top", "n_top", []string{"n_top"}, ModeDrain)
	if !Supersedes(topDrain, approved) {
		t.Fatal("the proposer's root's drain does not take its approved drain over")
	}
	kept := Inherit(topDrain, approved)
	if !kept.KeptDrainDeadline.Equal(t0.Add(10*time.Second)) || kept.CancelAckTimeout != 10*time.Second || kept.ConfirmTimeout != 30*time.Second {
		t.Fatalf("the root's drain over the approved one keeps drain deadline %s, acknowledgement %s, confirm %s; want the approved stop's 10 s deadline and its 10 s and 30 s windows",
			kept.KeptDrainDeadline, kept.CancelAckTimeout, kept.ConfirmTimeout)
	}
	if Supersedes(by("t_child", "n_child", []string{"n_top", "n_parent", "n_rogue", "n_child"}, ModeAbort), approved) {
		t.Error("a descendant of the proposer takes its approved stop over")
	}
	if Supersedes(by("t_self", "n_rogue", []string{"n_top", "n_parent", "n_rogue"}, ModeAbort), approved) {
		t.Error("the proposer takes its own approved stop over")
	}
	batch := newTermBy(t, "t_batch", "operator:alice", ModeAbort, 0)
	batch.RolloutID = "r_1"
	if !Supersedes(batch, approved) {
		t.Error("a rollout batch does not take the operator-approved stop over")
	}
	aborted := approved
	aborted.Mode = ModeAbort
	if Supersedes(topDrain, aborted) {
		t.Error("an ancestor's drain takes an approved abort over")
	}
	batchDrain := newTermBy(t, "t_batch_drain", "operator:alice", ModeDrain, time.Second)
	batchDrain.RolloutID = "r_1"
	if Supersedes(batchDrain, aborted) {
		t.Error("a rollout batch's drain takes an approved abort over")
	}
}
