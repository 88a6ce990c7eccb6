package rollout

import (
	"fmt"
	"testing"
	"time"

	"github.com/tetherhq/tether/supervisor"
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

// TestRogue25ReviewARogueFleetOfReplacementsCostsItsSize: a rogue spawns
// thousands of children labelled like replacements and has them report
// ready; none stands in for anyone (their parent is no ancestor of a
// drained agent). Each observation of the rollout matched every one of
// them against every drained agent (10,000 × 1,000 drained agents looked
// at, on every reconcile, with the store's read open); the matching reads
// the drained agents under each replacement's parent only.
func TestRogue25ReviewARogueFleetOfReplacementsCostsItsSize(t *testing.T) {
	const rogues, workers = 10_000, 1_000
	var drained [][]string
	for i := range workers {
		drained = append(drained, []string{"R", fmt.Sprintf("P%d", i%10)})
	}
	var late []replacement
	for i := range 5 {
		late = append(late, replacement{id: fmt.Sprintf("p%d-v2", i), parent: fmt.Sprintf("P%d", i), depth: 2})
	}
	for i := range rogues {
		late = append(late, replacement{id: fmt.Sprintf("fake-%d", i), parent: "rogue", depth: 2})
	}
	steps := 0
	if n := standIns(late, drained, &steps); n != 5 {
		t.Fatalf("%d stood in, want the 5 the planners spawned", n)
	}
	// The index of drained agents by ancestor (2 each), and at most one
	// look per replacement and per drained agent under its parent.
	if limit := 2*workers + len(late) + workers; steps > limit {
		t.Fatalf("matching %d replacements to %d drained agents looked at %d, want at most %d", len(late), workers, steps, limit)
	}
}

// TestRogue25ReviewWhoMayTakeAJobIsJudgedOncePerHolder: which replacements
// may take a drained agent's job depends on its holder alone. It was judged
// for every open lease — up to 4,096 per holder by default — against every
// ready replacement, a rogue's thousands of look-alikes included, on every
// observation of a batch being handed over; it is judged once per holder.
func TestRogue25ReviewWhoMayTakeAJobIsJudgedOncePerHolder(t *testing.T) {
	const holders, leasesEach, rogues = 10, 400, 1_000
	ancestors := map[string][]string{}
	var open []supervisor.HandoverLease
	for h := range holders {
		holder := fmt.Sprintf("w%d", h)
		ancestors[holder] = []string{"R", "P"}
		for j := range leasesEach {
			open = append(open, supervisor.HandoverLease{JobID: fmt.Sprintf("%s-job-%d", holder, j), Holder: holder})
		}
	}
	targets := []replacement{{id: "p-v2", parent: "P", depth: 2}}
	for i := range rogues {
		targets = append(targets, replacement{id: fmt.Sprintf("fake-%d", i), parent: "rogue", depth: 2})
	}
	steps := 0
	may := takers(targets, open, ancestors, &steps)
	for holder := range ancestors {
		if got := may[holder]; len(got) != 1 || got[0] != "p-v2" {
			t.Fatalf("%s's jobs may go to %v, want [p-v2]", holder, got)
		}
	}
	if limit := holders * len(targets); steps > limit {
		t.Fatalf("judging who may take %d leases of %d holders among %d replacements took %d steps, want at most %d", len(open), holders, len(targets), steps, limit)
	}
}
