package rollout

import (
	"testing"
	"time"
)

// TestRogue39MBaselineAgentsLeavingDoNotStallTheRollout: three v2 agents
// in a tree an operator vouched for were ready when the rollout started (its
// baseline). A rogue among them — or its parent, which spawned them — stops
// two of them once the rollout runs (or an operator stops them). The
// rollout counted replacements as "ready now minus the baseline", so each
// baseline agent that left swallowed a real replacement: the batch drained
// v1 agent a, its v2 replacement came up ready, and the rollout still read
// 0 replacements — paused at every deadline, after every resume, for ever.
// Replacements are the agents ready beyond those of the baseline still
// ready; never more than are really new (no over-credit either way).
func TestRogue39MBaselineAgentsLeavingDoNotStallTheRollout(t *testing.T) {
	start := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	r := Rollout{CreatedAt: start, BaselineReady: 3}
	base := func(id string) replacement {
		return replacement{id: id, root: "V", parent: "V", depth: 1, vouched: true, readyAt: start.Add(-time.Minute)}
	}
	late := func(id string) replacement {
		return replacement{id: id, root: "V", parent: "V", depth: 1, vouched: true, readyAt: start.Add(time.Minute)}
	}
	for _, c := range []struct {
		name    string
		targets []replacement
		want    int
	}{
		{"the baseline alone replaces no one", []replacement{base("b1"), base("b2"), base("b3")}, 0},
		{"one new beside the whole baseline", []replacement{base("b1"), base("b2"), base("b3"), late("n1")}, 1},
		{"two baseline agents left, one new: one replacement", []replacement{base("b1"), late("n1")}, 1},
		{"the whole baseline left, two new: two replacements", []replacement{late("n1"), late("n2")}, 2},
		{"baseline agents leaving are not replacements", []replacement{base("b1")}, 0},
		{"nothing ready: nothing replaced", nil, 0},
	} {
		if got := r.Replacements(credited(r, c.targets, nil)); got != c.want {
			t.Errorf("%s: %d replacements, want %d", c.name, got, c.want)
		}
	}
	// Another replica's clock ran ahead: a baseline agent reported ready
	// "after" the start. Recorded as BaselineReadyBy, it is not taken for
	// a new one when another baseline agent leaves.
	skewed := Rollout{CreatedAt: start, BaselineReady: 2, BaselineReadyBy: start.Add(2 * time.Second)}
	ahead := replacement{id: "b2", root: "V", parent: "V", depth: 1, vouched: true, readyAt: start.Add(2 * time.Second)}
	if got := skewed.Replacements(credited(skewed, []replacement{ahead}, nil)); got != 0 {
		t.Errorf("a baseline agent ready by a clock ahead of the start's: %d replacements, want 0", got)
	}
	// Through the decision: batch 0 drained a; its replacement is ready
	// but two baseline agents left. The batch is replaced, not paused at
	// its deadline.
	r = Rollout{ID: "o_1", State: RolloutRunning, CreatedAt: start, BaselineReady: 3, Batch: 1, MaxUnavailable: 1, BatchDeadline: 10 * time.Minute,
		Batches: []RolloutBatch{{Index: 0, NodeIDs: []string{"a"}, TerminationID: "t_1", StartedAt: start, Deadline: start.Add(10 * time.Minute), TerminatedAt: start.Add(time.Second)}}}
	f := RolloutFacts{ReadyTarget: credited(r, []replacement{base("b1"), late("n1")}, nil), Batches: map[int]BatchFacts{0: {Marked: true, Terminated: true}}}
	if step := NextRollout(r, f, start.Add(2*time.Minute)); step.Action != ActRolloutNoteReplaced {
		t.Fatalf("next step %s (%s), want note_replaced: the replacement of a is ready", step.Action, step.Reason)
	}
}
