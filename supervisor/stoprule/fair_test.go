package stoprule

import (
	"fmt"
	"slices"
	"testing"
)

// TestFairQueueServesTreesInTurnAndChargesTheirCost: a tree whose nodes
// cost four turns each is served one node, then sits out the turns that
// pay for it, while a cheap tree is served every turn; a node marked twice
// keeps its place; a slice that ends mid-turn resumes the same turn; a
// tree that left the ring in debt re-enters with it; within a tree, the
// operators' rules of a node marked last come before the agents' rules of
// the nodes marked earlier.
func TestFairQueueServesTreesInTurnAndChargesTheirCost(t *testing.T) {
	f := newFairQueue()
	for i := range 6 {
		f.mark("rogue", fmt.Sprintf("r%d", i))
	}
	for i := range 3 {
		f.mark("other", fmt.Sprintf("o%d", i))
	}
	f.mark("other", "o0") // keeps its place
	if f.len() != 18 {    // each node queued for its operators' and its agents' rules
		t.Fatalf("len %d, want 18", f.len())
	}
	cost := func(id string) int64 {
		if id[0] == 'r' {
			return 4 * TurnCost
		}
		return TurnCost / 2
	}
	// The rogue's nodes have agents' rules only, expensive; the others'
	// operators' rules, and agents' rules that cost little (taken with
	// them), except "rop", the rogue's node with an operator's rule too.
	var order []string
	eval := func(id string, p phase) (int64, bool, error) {
		switch {
		case p == operatorsPhase && id == "rop":
			order = append(order, id+"/operators")
			return TurnCost / 2, false, nil
		case p == operatorsPhase && id[0] == 'r':
			return 0, false, nil // no operators' rules: the agents' phase takes it
		case p == agentsPhase && id[0] != 'r':
			t.Fatalf("%s's agents' rules were taken with its operators'", id)
		}
		order = append(order, id)
		return cost(id), true, nil
	}
	if err := f.serve(3, eval); err != nil {
		t.Fatal(err)
	}
	// The rogue one node (its turn spent), the other two (a turn's worth),
	// the slice's end.
	if want := []string{"r0", "o0", "o1"}; !slices.Equal(order, want) {
		t.Fatalf("first slice served %v, want %v", order, want)
	}
	if err := f.serve(100, eval); err != nil {
		t.Fatal(err)
	}
	// The other tree's last node comes before the rogue's second: the
	// rogue sits out until its turns have paid for its first.
	if i, j := slices.Index(order, "o2"), slices.Index(order, "r1"); i < 0 || j < 0 || i > j {
		t.Fatalf("served %v: the other tree's node after the rogue's second", order)
	}
	if len(order) != 9 || f.len() != 0 || len(f.ring) != 0 {
		t.Fatalf("served %v, %d left, ring %d", order, f.len(), len(f.ring))
	}
	// The rogue left the ring in debt (its last node overran its turn):
	// marked again, it is served after a newcomer.
	order = nil
	f.mark("rogue", "r0")
	f.mark("late", "l0")
	if err := f.serve(100, eval); err != nil {
		t.Fatal(err)
	}
	if want := []string{"l0", "r0"}; !slices.Equal(order, want) {
		t.Fatalf("after the debt: served %v, want %v", order, want)
	}
	if q := f.trees["rogue"]; q == nil || q.deficit >= 0 {
		t.Fatal("the rogue's debt was not kept while its tree is idle")
	}
	f.unmark("rogue", "rogue") // its root terminated: the debt goes with it
	if _, ok := f.trees["rogue"]; ok {
		t.Fatal("a terminated tree's debt is kept")
	}
	// An unmarked node is not served.
	order = nil
	f.mark("other", "o5")
	f.mark("other", "o6")
	f.unmark("other", "o5")
	if err := f.serve(100, eval); err != nil {
		t.Fatal(err)
	}
	if want := []string{"o6"}; !slices.Equal(order, want) || f.len() != 0 {
		t.Fatalf("after an unmark: served %v (%d left), want %v", order, f.len(), want)
	}
	// Within the rogue's tree: its operator's rule first, though marked
	// last (the rogue's debt is paid first: a newcomer's turn).
	order = nil
	f = newFairQueue()
	for i := range 3 {
		f.mark("rogue", fmt.Sprintf("r%d", i))
	}
	f.mark("rogue", "rop")
	if err := f.serve(100, eval); err != nil {
		t.Fatal(err)
	}
	if want := []string{"rop/operators", "r0", "r1", "r2", "rop"}; !slices.Equal(order, want) || f.len() != 0 {
		t.Fatalf("within a tree: served %v (%d left), want %v", order, f.len(), want)
	}
}
