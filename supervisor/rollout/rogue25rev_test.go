package rollout

import (
	"testing"
	"time"
)

// TestRogue25ReviewAnOperatorsReplacementIsMatchedLast: a replacement an
// operator spawned stands in for any drained agent and may take any job;
// it is matched after those whose parent limits them, so that it never
// takes the one agent a parent's replacement could stand in for. The
// rollout drained x under planner P and y under planner Q.
func TestRogue25ReviewAnOperatorsReplacementIsMatchedLast(t *testing.T) {
	start := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	r := Rollout{CreatedAt: start}
	drained := [][]string{{"R", "P"}, {"R", "Q"}}
	ready := start.Add(time.Minute)
	byOperator := replacement{id: "op", root: "R", parent: "S", depth: 3, byOperator: true, readyAt: ready}
	underP := replacement{id: "p2", root: "R", parent: "P", depth: 2, readyAt: ready}
	for _, c := range []struct {
		name    string
		targets []replacement
		want    int
	}{
		{"an operator's replacement stands in outside its parent", []replacement{byOperator}, 1},
		{"the operator's is matched after P's", []replacement{byOperator, underP}, 2},
		{"each drained agent once", []replacement{byOperator, byOperator, byOperator}, 2},
		{"ready before the rollout started: a baseline", []replacement{{id: "op", root: "R", parent: "S", depth: 3, byOperator: true, readyAt: start.Add(-time.Minute)}}, 0},
	} {
		if got := credited(r, c.targets, drained); got != c.want {
			t.Errorf("%s: credited %d, want %d", c.name, got, c.want)
		}
	}
	if !byOperator.mayTake([]string{"R", "P"}) {
		t.Error("a replacement an operator spawned may take a job of any drained agent")
	}
}
