package rollout

import (
	"testing"
	"time"
)

// TestRogue25AReplacementStandsInOnlyUnderItsParent: a replacement that an
// operator did not vouch for counts for one drained agent its parent is an
// ancestor of, each drained agent once. The tree: root R, planners P and Q
// under it, workers under each; the rollout drained P's worker x and R's
// worker y.
func TestRogue25AReplacementStandsInOnlyUnderItsParent(t *testing.T) {
	start := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	r := Rollout{CreatedAt: start}
	drained := [][]string{
		{"R", "P"}, // x, under P
		{"R"},      // y, R's own
	}
	late := func(parent string, depth int) replacement {
		return replacement{id: parent + "-child", root: "R", parent: parent, depth: depth, readyAt: start.Add(time.Minute)}
	}
	for _, c := range []struct {
		name    string
		targets []replacement
		want    int
	}{
		{"a sibling planner's child replaces no one", []replacement{late("Q", 2), late("Q", 2)}, 0},
		{"a rogue worker's child replaces no one", []replacement{late("x", 3)}, 0},
		{"P's child stands in for x", []replacement{late("P", 2)}, 1},
		{"R's child stands in for either", []replacement{late("R", 1)}, 1},
		{"each drained agent once", []replacement{late("R", 1), late("R", 1), late("R", 1)}, 2},
		// Matched deepest first: P's child takes x, so R's takes y.
		{"R's child does not take the one P's needed", []replacement{late("R", 1), late("P", 2)}, 2},
		{"ready before the rollout started: a baseline", []replacement{{id: "old", root: "R", parent: "R", depth: 1, readyAt: start.Add(-time.Minute)}}, 0},
		{"vouched: counted as ever", []replacement{{id: "v", root: "V", vouched: true}}, 1},
	} {
		if got := credited(r, c.targets, drained); got != c.want {
			t.Errorf("%s: credited %d, want %d", c.name, got, c.want)
		}
	}
	holderX := []string{"R", "P"}
	if late("Q", 2).mayTake(holderX) || late("x", 3).mayTake(holderX) || !late("P", 2).mayTake(holderX) || !late("R", 1).mayTake(holderX) {
		t.Error("a job of x goes to a replacement spawned by an ancestor of x only (or a vouched one)")
	}
	if (replacement{id: "v", vouched: true}).mayTake(nil) != true {
		t.Error("a vouched replacement takes any job")
	}
}
