package privilege

import (
	"fmt"
	"slices"
	"testing"
)

// TestRogue43ATreeQueueTakesEachBranchInTurn pins the revocation queue's
// order within a tier: a rogue below the root that spawned many children
// (and a chain below one of them), each with a privilege, and kept many
// on its own node, is one branch beside its honest sibling's subtree: the
// honest agent's privilege, three levels down, is the second called, not
// the last. Where the nodes were taken in turn (until the forty-third
// pass) it came after every one of the rogue's nodes.
func TestRogue43ATreeQueueTakesEachBranchInTurn(t *testing.T) {
	var b treeBranch
	priv := func(id string) Privilege { return Privilege{ID: id} }
	for i := range 4 {
		b.add([]string{"root", "rogue"}, priv(fmt.Sprintf("rogue-own-%d", i)))
	}
	for i := range 40 {
		b.add([]string{"root", "rogue", fmt.Sprintf("hand-%d", i)}, priv(fmt.Sprintf("hand-%d", i)))
	}
	chain := []string{"root", "rogue", "hand-0"}
	for i := range 20 {
		chain = append(chain, fmt.Sprintf("deep-%d", i))
		b.add(slices.Clone(chain), priv(fmt.Sprintf("deep-%d", i)))
	}
	b.add([]string{"root", "branch", "team", "honest"}, priv("honest"))
	b.add([]string{"root", "branch", "team", "honest"}, priv("honest-2"))
	b.add([]string{"root"}, priv("root-own"))

	q := b.appendTo(nil)
	if len(q) != 4+40+20+3 {
		t.Fatalf("the queue holds %d privileges, want %d", len(q), 4+40+20+3)
	}
	seen := map[string]bool{}
	for _, p := range q {
		if seen[p.ID] {
			t.Fatalf("%s queued twice", p.ID)
		}
		seen[p.ID] = true
	}
	at := slices.IndexFunc(q, func(p Privilege) bool { return p.ID == "honest" })
	second := slices.IndexFunc(q, func(p Privilege) bool { return p.ID == "honest-2" })
	t.Logf("the honest agent's privileges are queued at %d and %d of %d", at, second, len(q))
	// Round one: the root's own, the rogue's branch's first, the honest
	// branch's first; round two: the rogue's second, the honest's second.
	if at != 2 || second != 4 {
		t.Fatalf("the honest agent's privileges are queued at %d and %d, want 2 and 4: %v", at, second, queuedIDs(q[:6]))
	}
}

func queuedIDs(ps []Privilege) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.ID
	}
	return out
}
