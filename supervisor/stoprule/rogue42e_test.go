package stoprule

import (
	"context"
	"fmt"
	"log/slog"
	"testing"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/supervisor/tree"
)

// The forty-second hostile pass, stop rules: the evaluator's tick looked
// at every rule in effect along a node's lineage to learn whether one
// reads the clock or the calls' time, uncharged, every tick, for every
// node it visited.

// rogue42eLineage has a rogue under a planner attach perLevel cheap rules
// to each node of a chain of depth nodes below itself, and spawn leaves
// children under the chain's bottom: each leaf has depth*perLevel rules in
// effect along its lineage. It returns the rogue, its actor, the chain's
// bottom and the leaves.
func rogue42eLineage(t *testing.T, g *rogue31cRig, depth, perLevel, leaves int) (rogue *tree.Node, as Actor, bottom *tree.Node, out []*tree.Node) {
	t.Helper()
	ctx := context.Background()
	planner := g.spawn(nil, "planner")
	rogue = g.spawn(planner, "rogue")
	as = Actor{ID: capability.AgentPrefix + rogue.NodeID, NodeID: rogue.NodeID}
	bottom = rogue
	for i := range depth {
		bottom = g.spawn(bottom, fmt.Sprintf("c%d", i))
		for j := range perLevel {
			if _, _, err := g.rules.Add(ctx, as, &Rule{NodeID: bottom.NodeID, Name: fmt.Sprintf("r%d-%d", i, j), Expression: fmt.Sprintf("observed.calls > %d", 100000+100*i+j)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := range leaves {
		out = append(out, g.spawn(bottom, fmt.Sprintf("leaf%d", i)))
	}
	return rogue, as, bottom, out
}

// rogue42eLevels is what a tick may look at for the nodes ids: a lookup a
// level of each one's lineage, and one per selector rule.
func rogue42eLevels(ix *index, ids []string) int {
	n := 0
	for _, id := range ids {
		n += len(ix.nodes[id].ancestors) + 1 + len(ix.selectors)
	}
	return n
}

// TestRogue42EATickDoesNotListTheRulesAlongARoguesLineageForAnOperatorsTimedSelector:
// an operator holds its production agents to an hour with a selector rule
// on the clock (`observed.age_seconds`, in effect wherever its label is),
// which has every tick visit every running node of the cluster. For each,
// the tick listed every rule in effect along its lineage to learn whether
// one reads the clock: a rogue that attached its allotment of cheap rules
// to each node of a chain below itself and spawned children at its bottom
// had each tick list them all for each child, for ever, uncharged, on the
// evaluator's one loop that every tree's rules wait for. It now looks a
// level up each lineage (the polled rules attached to each node, counted)
// and at the polled selector rules: the rogue's rules are not listed.
func TestRogue42EATickDoesNotListTheRulesAlongARoguesLineageForAnOperatorsTimedSelector(t *testing.T) {
	g := newRogue31cRig(t)
	ctx := context.Background()
	prod, err := g.agents.RegisterRoot(ctx, "prod", map[string]string{"env": "prod"}, "test")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := g.rules.Add(ctx, Actor{ID: "operator:alice"}, &Rule{Name: "hour", Selector: map[string]string{"env": "prod"}, Expression: `observed.age_seconds > 3600.0`}); err != nil {
		t.Fatal(err)
	}
	const depth, perLevel, leaves = 6, 16, 30
	rogue42eLineage(t, g, depth, perLevel, leaves)
	ix, err := g.rules.load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ix.dirty = newFairQueue() // the start's marks, served
	ix.markTimed()
	// Only the production agent is marked: no rule on the clock is in
	// effect in the rogue's tree.
	if got := ix.dirty.len() / 2; got != 1 {
		t.Errorf("a tick marked %d nodes, want the production agent alone", got)
	}
	if q := ix.dirty.trees[prod.NodeID]; q == nil || q.len() != 2 {
		t.Errorf("a tick did not mark the production agent its operator's rule on the clock is in effect at")
	}
	ids := make([]string, 0, len(ix.nodes))
	for id := range ix.nodes {
		ids = append(ids, id)
	}
	if bound := rogue42eLevels(ix, ids); ix.tickLooks > bound {
		t.Errorf("a tick looked at %d rules for %d nodes (the rogue's %d along each of its %d leaves' lineage), want at most %d lookups", ix.tickLooks, len(ix.nodes), depth*perLevel, leaves, bound)
	}
}

// TestRogue42EATickDoesNotListTheRulesAlongARoguesLineageForItsOpenCalls:
// a rule on call time keeps the nodes whose subtree has calls open judged
// every tick, and each tick checked that such a rule is still in effect at
// each of them by listing every rule in effect along its lineage. A rogue
// with one such rule at the bottom of a chain carrying its allotment of
// cheap rules at each level, and a call held open by each of its children
// there, had each tick list them all for each child, uncharged. It now
// looks a level up each lineage (the rules on call time attached to each
// node, counted): the nodes with calls open are marked as before, and let
// go once no rule on call time is in effect at them.
func TestRogue42EATickDoesNotListTheRulesAlongARoguesLineageForItsOpenCalls(t *testing.T) {
	g := newRogue31cRig(t)
	g.rules.Log = slog.New(slog.DiscardHandler)
	ctx := context.Background()
	const depth, perLevel, leaves = 6, 16, 30
	_, as, bottom, kids := rogue42eLineage(t, g, depth, perLevel, leaves)
	timeRule, _, err := g.rules.Add(ctx, as, &Rule{NodeID: bottom.NodeID, Name: "slow", Expression: `observed.call_seconds_total > 1e9`})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range kids {
		g.beginOwn(k, "gate-1")
	}
	ix, err := g.rules.load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The start's marks, served: each child's evaluation finds its call
	// open, and so does its parent's (its subtree's).
	for i := 0; ix.dirty.len() > 0; i++ {
		if i == 1000 {
			t.Fatalf("the start's marks not served after %d slices", i)
		}
		if err := g.rules.evaluateDirty(ctx, ix, evaluateSlice); err != nil {
			t.Fatal(err)
		}
	}
	if len(ix.open) != leaves+1 {
		t.Fatalf("%d nodes found with calls open, want the %d children and their parent", len(ix.open), leaves)
	}
	ids := make([]string, 0, len(ix.open))
	for id := range ix.open {
		ids = append(ids, id)
	}
	ix.dirty = newFairQueue()
	ix.markTimed()
	if got := ix.dirty.len() / 2; got != leaves+1 {
		t.Errorf("a tick marked %d nodes, want the %d with calls open", got, leaves+1)
	}
	if bound := rogue42eLevels(ix, ids); ix.tickLooks > bound {
		t.Errorf("a tick looked at %d rules for %d nodes with calls open (the rogue's %d along each lineage), want at most %d lookups", ix.tickLooks, len(ids), depth*perLevel+1, bound)
	}
	// The rule gone, a tick lets the nodes go.
	ix.removeRule(timeRule.RuleID)
	ix.dirty = newFairQueue()
	ix.markTimed()
	if len(ix.open) != 0 || ix.dirty.len() != 0 {
		t.Errorf("with no rule on call time in effect a tick kept %d nodes with calls open and marked %d", len(ix.open), ix.dirty.len()/2)
	}
}
