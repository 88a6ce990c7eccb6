package stoprule

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/etcdtest"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/tree"
)

// rogue37fCollect reads w's events until done says it has what it needs
// (the test's own writes are all committed before it is called, so it
// never waits for a write to come).
func rogue37fCollect(t *testing.T, w store.Watcher, done func([]store.Event) bool) []store.Event {
	t.Helper()
	var got []store.Event
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	for !done(got) {
		select {
		case batch, ok := <-w.Events():
			if !ok {
				t.Fatalf("the watch ended: %v", w.Err())
			}
			got = append(got, batch...)
		case <-ctx.Done():
			t.Fatalf("the watch did not hand over the test's writes (%d events so far)", len(got))
		}
	}
	return got
}

// rogue37fHas reports whether evs hold a write of key (a put of a node in
// state, when state is not negative).
func rogue37fHas(evs []store.Event, key string, state tree.NodeState) bool {
	return slices.ContainsFunc(evs, func(ev store.Event) bool {
		if string(ev.Key) != key || ev.Type == store.EventDelete {
			return false
		}
		if state < 0 {
			return true
		}
		n := &tree.Node{}
		return tree.UnmarshalNode(ev.Value, n) == nil && n.State == state
	})
}

// TestRogue37FRulesAttachedJustBeforeTheirNodeEndedAreNotHeld: the
// evaluator reads the rules and the nodes from two watches, and takes
// from whichever holds events. A rogue that attached its allotment of
// rules to a child (its own 64 and the child's 64) and ended the child at
// once had, whenever the evaluator read the child's termination before
// the rules, every one of them compiled and held by the leader until it
// restarted: the termination let go of the rules the evaluator held then,
// and the rules came after it, onto a node no longer judged. Child after
// child, the rogue grew the leader's memory at will.
func TestRogue37FRulesAttachedJustBeforeTheirNodeEndedAreNotHeld(t *testing.T) {
	rogue37fLateRulesNotHeld(t, newRogue31cRig(t))
}

// TestRogue37FRulesAttachedJustBeforeTheirNodeEndedAreNotHeldOnEtcd is
// the same on etcd.
func TestRogue37FRulesAttachedJustBeforeTheirNodeEndedAreNotHeldOnEtcd(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the etcd stores; make test and CI run them.")
	}
	st := etcdtest.OpenStore(t, etcdtest.Start(t))
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	rules := &Rules{Store: st, Clock: clk}
	rogue37fLateRulesNotHeld(t, &rogue31cRig{t: t, st: st, clk: clk, rules: rules,
		agents: &tree.Tree{Store: st, Clock: clk, Observer: rules, Limits: tree.Limits{MaxDepth: 8, MaxChildren: 1000, MaxLabels: 4}}})
}

func rogue37fLateRulesNotHeld(t *testing.T, g *rogue31cRig) {
	ctx := context.Background()
	planner := g.spawn(nil, "planner")
	rogue := g.spawn(planner, "rogue")
	as := func(n *tree.Node) Actor { return Actor{ID: capability.AgentPrefix + n.NodeID, NodeID: n.NodeID} }
	add := func(by, on *tree.Node, name, expression string) *Rule {
		t.Helper()
		r, _, err := g.rules.Add(ctx, as(by), &Rule{NodeID: on.NodeID, Name: name, Expression: expression})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// The evaluator runs: its watches, then its scan (as run does).
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	rulesW, err := g.st.Watch(wctx, []byte(prefixAll))
	if err != nil {
		t.Fatal(err)
	}
	nodesW, err := g.st.Watch(wctx, []byte(tree.NodePrefix))
	if err != nil {
		t.Fatal(err)
	}
	ix, err := g.rules.load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	held := func(r *Rule) bool { _, ok := ix.byID[r.RuleID]; return ok }
	// The rogue's churn: a child spawned, given rules, ended at once; the
	// evaluator reads the nodes' watch first, then the rules'.
	var gone []*Rule
	for i := range 3 {
		kid := g.spawn(rogue, fmt.Sprintf("kid%d", i))
		var mine []*Rule
		for j := range 3 {
			mine = append(mine, add(rogue, kid, fmt.Sprintf("r%d", j), fmt.Sprintf("observed.calls > %d", 5000+10*i+j)))
			mine = append(mine, add(kid, kid, fmt.Sprintf("own%d", j), fmt.Sprintf("observed.spawns > %d", 5000+10*i+j)))
		}
		rogue36fTerminate(t, g, kid)
		nodeEvs := rogue37fCollect(t, nodesW, func(evs []store.Event) bool {
			return rogue37fHas(evs, tree.NodePrefix+kid.NodeID, tree.NodeStateTerminated)
		})
		ruleEvs := rogue37fCollect(t, rulesW, func(evs []store.Event) bool {
			return !slices.ContainsFunc(mine, func(r *Rule) bool { return !rogue37fHas(evs, prefixRule+r.RuleID, -1) })
		})
		g.rules.applyEvents(ix, nodeEvs)
		g.rules.applyEvents(ix, ruleEvs)
		gone = append(gone, mine...)
	}
	for _, r := range gone {
		if held(r) {
			t.Errorf("rule %s attached to an ended child is held by the evaluator (read after the child's end)", r.Name)
		}
	}
	// What must still hold: a rule on a fresh child whose spawn the
	// evaluator has not read yet (the rules' watch read first) is in
	// effect at the child once it is; and the rogue's own rules.
	fresh := g.spawn(rogue, "fresh")
	early := add(rogue, fresh, "early", "observed.calls > 6000")
	onRogue := add(planner, rogue, "planners", "observed.calls > 6001")
	ruleEvs := rogue37fCollect(t, rulesW, func(evs []store.Event) bool {
		return rogue37fHas(evs, prefixRule+early.RuleID, -1) && rogue37fHas(evs, prefixRule+onRogue.RuleID, -1)
	})
	g.rules.applyEvents(ix, ruleEvs)
	nodeEvs := rogue37fCollect(t, nodesW, func(evs []store.Event) bool {
		return rogue37fHas(evs, tree.NodePrefix+fresh.NodeID, tree.NodeStateRunning)
	})
	g.rules.applyEvents(ix, nodeEvs)
	if !held(early) || !held(onRogue) {
		t.Fatalf("rules on running nodes are not held: early %v, planner's %v", held(early), held(onRogue))
	}
	if !slices.ContainsFunc(ix.inEffect(fresh.NodeID, ix.nodes[fresh.NodeID]), func(a *activeRule) bool { return a.rule.RuleID == early.RuleID }) {
		t.Errorf("the rule attached to a child before the evaluator read its spawn is not in effect at it")
	}
	// That child ended: its rule goes as before.
	rogue36fTerminate(t, g, fresh)
	g.rules.applyEvents(ix, rogue37fCollect(t, nodesW, func(evs []store.Event) bool {
		return rogue37fHas(evs, tree.NodePrefix+fresh.NodeID, tree.NodeStateTerminated)
	}))
	if held(early) {
		t.Errorf("the fresh child's rule is held after it ended")
	}
}
