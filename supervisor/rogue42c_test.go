package supervisor

import (
	"testing"
	"time"
)

// Forty-second hostile pass (letter C): the supervisor's termination path.

// TestRogue42CAnAgentsRuleAbortTakesOverItsDescendantsDrain is the
// decision: an honest planner (n_top) sets a rule whose action is abort on
// its subtree; its rogue child (n_rogue) drains its own worker with a
// day's window before the rule is true on the worker. The rule's abort
// carries the planner's authority, which supersedes its descendant's
// drain; the policy used to weigh rank alone (an agent's over an agent's)
// and left the abort pending for an operator. It still does not take over
// the planner's own stop (its windows are kept) nor a stop of the
// planner's ancestor; a rule's drain takes over a descendant's drain (a
// drain a drain, as the planner's own would), and a drain never an abort.
func TestRogue42CAnAgentsRuleAbortTakesOverItsDescendantsDrain(t *testing.T) {
	roguesDrain := newTermBy(t, "t_rogue", "agent:n_rogue", ModeDrain, MaxTerminationWindow)
	roguesDrain.RequesterLineage = []string{"n_top", "n_rogue"}
	roguesAbort := newTermBy(t, "t_rogue_abort", "agent:n_rogue", ModeAbort, 0)
	roguesAbort.RequesterLineage = roguesDrain.RequesterLineage
	plannersDrain := newTermBy(t, "t_planner", "agent:n_top", ModeDrain, time.Hour)
	plannersDrain.RequesterLineage = []string{"n_top"}
	aboveDrain := newTermBy(t, "t_above", "agent:n_above", ModeDrain, time.Hour)
	aboveDrain.RequesterLineage = []string{"n_above"}

	rule := func(mode Mode, lineage ...string) Termination {
		return Termination{RequestedBy: PolicyDecider + "stop-rule-action", RequesterLineage: lineage, Mode: mode}
	}
	for _, tc := range []struct {
		name      string
		t, owner  Termination
		takesOver bool
	}{
		{"the planner's rule abort over its rogue child's day-long drain", rule(ModeAbort, "n_top"), roguesDrain, true},
		{"the planner's rule abort over its rogue child's abort", rule(ModeAbort, "n_top"), roguesAbort, true},
		{"the planner's rule drain over its rogue child's drain", rule(ModeDrain, "n_top"), roguesDrain, true},
		{"the planner's rule drain over its rogue child's abort", rule(ModeDrain, "n_top"), roguesAbort, false},
		{"the planner's rule abort over the planner's own drain", rule(ModeAbort, "n_top"), plannersDrain, false},
		{"the rogue's own rule abort over its own drain", rule(ModeAbort, "n_top", "n_rogue"), roguesDrain, false},
		{"the rogue's rule abort over the planner's drain", rule(ModeAbort, "n_top", "n_rogue"), plannersDrain, false},
		{"the planner's rule abort over a drain of an agent outside its lineage", rule(ModeAbort, "n_top"), aboveDrain, false},
		{"an operator's rule abort over the rogue's drain", rule(ModeAbort), roguesDrain, true},
	} {
		if got := PolicyTakesOver(tc.t, tc.owner); got != tc.takesOver {
			t.Errorf("%s: PolicyTakesOver = %v, want %v", tc.name, got, tc.takesOver)
		}
	}

	// The rule's drain that takes the worker over keeps the deadline the
	// drain it takes over was waiting on there, and its own is no later.
	roguesDrain.Phase, roguesDrain.DrainDeadline = PhaseDraining, t0.Add(time.Second)
	drain := newTermBy(t, "t_rule", PolicyDecider+"stop-rule-action", ModeDrain, DefaultDrainWindow)
	drain.RequesterLineage = []string{"n_top"}
	if got := InheritAtRoot(drain, roguesDrain).KeptDrainDeadline; !got.Equal(roguesDrain.DrainDeadline) {
		t.Fatalf("the rule's drain keeps the drain deadline %s at its root, want the one it took over, %s", got, roguesDrain.DrainDeadline)
	}
}
