package stoprule

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/storecodec"
	"github.com/tetherhq/tether/supervisor/ledger"
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
	rogue37fLateRulesNotHeld(t, newRogue35kEtcdRig(t))
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

// rogue37fSettle has the evaluator take every change the watch w holds up
// to now: it writes a key under the rules' prefix that the evaluator
// does not read, and applies the events up to it (a watch hands changes
// in commit order).
func rogue37fSettle(t *testing.T, g *rogue31cRig, ix *index, w store.Watcher, n int) {
	t.Helper()
	key := fmt.Sprintf("%stest-settled/%d", prefixAll, n)
	if err := g.st.Update(context.Background(), func(tx store.Txn) error { return tx.Put([]byte(key), []byte{1}) }); err != nil {
		t.Fatal(err)
	}
	g.rules.applyEvents(ix, rogue37fCollect(t, w, func(evs []store.Event) bool { return rogue37fHas(evs, key, -1) }))
}

// TestRogue37FABurstSplitAmongChildrenIsSeenAtItsPeak: an operator holds
// a rogue to five calls in flight over its subtree. The rogue has its
// three children and itself begin six calls at once and end them before
// the evaluator reads its node (the evaluator is late by the rogue's own
// design: its tree's turns are its own to spend). subtree_calls_in_flight
// is a level: it read 0, and no rule could see the burst (a node's own
// calls_in_flight_max is its own; the rogue's own peak was one).
// subtree_calls_in_flight_max is the level's high-water mark, counted by
// the evaluator from each call's change of the subtree's records as its
// watch hands them, in commit order: it reads 6 at the rogue and at its
// planner. It is exact, not each shard's peak added up: children that
// each peaked at three one after another read three, not nine.
func TestRogue37FABurstSplitAmongChildrenIsSeenAtItsPeak(t *testing.T) {
	rogue37fBurstSeen(t, newRogue31cRig(t))
}

// TestRogue37FABurstSplitAmongChildrenIsSeenAtItsPeakOnEtcd is the same
// on etcd.
func TestRogue37FABurstSplitAmongChildrenIsSeenAtItsPeakOnEtcd(t *testing.T) {
	rogue37fBurstSeen(t, newRogue35kEtcdRig(t))
}

func rogue37fBurstSeen(t *testing.T, g *rogue31cRig) {
	ctx := context.Background()
	planner := g.spawn(nil, "planner")
	rogue := g.spawn(planner, "rogue")
	var kids []*tree.Node
	for i := range 3 {
		kids = append(kids, g.spawn(rogue, fmt.Sprintf("kid%d", i)))
	}
	// Filing a proposal needs the supervisor: the test asks only whether
	// the rule is true, which the fault point before the filing says.
	g.rules.Fault = func(point string) error {
		if point == "before-file" {
			return errRogue37FFired
		}
		return nil
	}
	rule := func(name, expression string) *activeRule {
		c, err := Compile(expression)
		if err != nil {
			t.Fatal(err)
		}
		return &activeRule{rule: &Rule{RuleID: name, Name: name, NodeID: planner.NodeID}, compiled: c}
	}
	peak := rule("peak", `observed.subtree_calls_in_flight_max >= 6`)
	above := rule("above", `observed.subtree_calls_in_flight_max > 6`)
	staggered := rule("staggered", `observed.subtree_calls_in_flight_max > 3`)
	level := rule("level", `observed.subtree_calls_in_flight >= 6`)
	if !peak.compiled.UsesSubtreePeak || !peak.compiled.UsesSubtree || peak.compiled.UsesCallTime || peak.compiled.UsesTime {
		t.Fatalf("the peak rule reads the subtree's records and nothing else: %+v", peak.compiled)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := g.st.Watch(wctx, []byte(prefixAll))
	if err != nil {
		t.Fatal(err)
	}
	ix, err := g.rules.load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fires := func(n *tree.Node, a *activeRule) bool {
		t.Helper()
		_, _, err := g.rules.evaluateNodeOpen(ctx, n.NodeID, []*activeRule{a}, ix.peaks)
		if err != nil && !errors.Is(err, errRogue37FFired) {
			t.Fatal(err)
		}
		return err != nil
	}
	// The rule's first evaluations, before any call.
	for _, n := range []*tree.Node{rogue, planner} {
		if fires(n, peak) {
			t.Fatalf("the peak rule fired at %s before any call", n.Name)
		}
	}
	begin := func(n *tree.Node) *ledger.ToolCall {
		t.Helper()
		g.seq++
		c := &ledger.ToolCall{CallID: fmt.Sprintf("call-%d", g.seq), NodeID: n.NodeID, Tool: "shell", State: ledger.CallStateInFlight, BegunAt: g.clk.Now()}
		if err := g.st.Update(ctx, func(tx store.Txn) error { return g.rules.ObserveCall(tx, nil, c) }); err != nil {
			t.Fatal(err)
		}
		return c
	}
	end := func(c *ledger.ToolCall) {
		t.Helper()
		ended := *c
		ended.State, ended.EndedAt, ended.Resolution = ledger.CallStateEnded, g.clk.Now(), ledger.CallResolutionCompleted
		if err := g.st.Update(ctx, func(tx store.Txn) error { return g.rules.ObserveCall(tx, c, &ended) }); err != nil {
			t.Fatal(err)
		}
	}
	// Honest work: each child in turn keeps three calls open, then ends
	// them; the subtree never had more than three in flight.
	for _, k := range kids {
		var open []*ledger.ToolCall
		for range 3 {
			open = append(open, begin(k))
		}
		for _, c := range open {
			end(c)
		}
	}
	rogue37fSettle(t, g, ix, w, 1)
	for _, n := range []*tree.Node{rogue, planner} {
		if fires(n, staggered) {
			t.Errorf("children that each kept three calls open one after another read above three at %s", n.Name)
		}
	}
	// The rogue's burst: six calls across itself and its children, all
	// ended before the evaluator reads.
	var burst []*ledger.ToolCall
	for _, n := range []*tree.Node{kids[0], kids[0], rogue, kids[1], kids[1], kids[2]} {
		burst = append(burst, begin(n))
	}
	for _, c := range burst {
		end(c)
	}
	rogue37fSettle(t, g, ix, w, 2)
	for _, n := range []*tree.Node{rogue, planner} {
		if fires(n, level) {
			t.Fatalf("the level read 6 at %s with no call in flight", n.Name)
		}
		if !fires(n, peak) {
			t.Errorf("a burst of six calls across the rogue's subtree, ended before the evaluator read it, was not seen at %s", n.Name)
		}
		if fires(n, above) {
			t.Errorf("the burst of six read above six at %s", n.Name)
		}
	}
}

var errRogue37FFired = errors.New("the rule is true")

// TestRogue37FTheOwnCallsInFlightAreReadFromTheStoredCounters: the
// evaluator's count of a subtree's calls in flight reads a node's own
// from its stored counters' bytes (field 6) without decoding them whole:
// it agrees with the decoded counters, whatever else they hold.
func TestRogue37FTheOwnCallsInFlightAreReadFromTheStoredCounters(t *testing.T) {
	for _, o := range []*Observations{
		{},
		{CallsInFlight: 3},
		{Calls: 9, CallsByTool: map[string]int64{"shell": 4, "x": 5}, CallsInFlight: 200, CallSecondsTotal: 1.5, CallsInFlightMax: 201, SubtreeCalls: 7},
		{Calls: 1 << 40, CallsInFlight: 1 << 33, NodeLabels: map[string]string{"team": "a"}},
	} {
		v, err := storecodec.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := callsInFlightOf(v)
		if !ok || got != o.CallsInFlight {
			t.Errorf("read %d (ok %v) from %+v, want %d", got, ok, o, o.CallsInFlight)
		}
	}
	if _, ok := callsInFlightOf([]byte{0x30}); ok {
		t.Errorf("a truncated record read as counters")
	}
}

// TestRogue37FARoguesTimedRuleDoesNotMakeEachTickVisitEveryNode: a rule
// that reads the clock (or the leases, or the revocations) is judged
// again every tick at the nodes it is in effect at. Each tick looked at
// every running node of every tree, and listed the rules in effect at
// each, as soon as one such rule was stored anywhere: a rogue that
// attached `observed.age_seconds > 1e9` to itself had every tick walk the
// whole cluster's nodes, its cost nobody's, where its rule is in effect at
// its own subtree alone. A tick now walks the subtrees such rules are
// attached to (and every node only for an operator's selector rule).
func TestRogue37FARoguesTimedRuleDoesNotMakeEachTickVisitEveryNode(t *testing.T) {
	g := newRogue31cRig(t)
	ctx := context.Background()
	other := g.spawn(nil, "other")
	const honest = 60
	for i := range honest {
		g.spawn(other, fmt.Sprintf("worker%d", i))
	}
	planner := g.spawn(nil, "planner")
	rogue := g.spawn(planner, "rogue")
	kid := g.spawn(rogue, "kid")
	g.spawn(kid, "grand")
	as := Actor{ID: capability.AgentPrefix + rogue.NodeID, NodeID: rogue.NodeID}
	if _, _, err := g.rules.Add(ctx, as, &Rule{NodeID: rogue.NodeID, Name: "clock", Expression: `observed.age_seconds > 1e9`}); err != nil {
		t.Fatal(err)
	}
	// A second such rule below the first: its subtree is walked once.
	if _, _, err := g.rules.Add(ctx, as, &Rule{NodeID: kid.NodeID, Name: "clock2", Expression: `observed.age_seconds > 2e9`}); err != nil {
		t.Fatal(err)
	}
	ix, err := g.rules.load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ix.dirty = newFairQueue() // the start's marks, served
	ix.markTimed()
	// A node marked is queued twice (for its operators' rules, then its
	// agents'): fairQueue.len counts both.
	if ix.dirty.len() != 2*3 {
		t.Errorf("a tick marked %d nodes, want the rogue's subtree's 3", ix.dirty.len()/2)
	}
	if q := ix.dirty.trees[other.NodeID]; q != nil && q.len() > 0 {
		t.Errorf("a tick marked %d nodes of a tree no timed rule is in effect at", q.len()/2)
	}
	if ix.tickVisits > 6 {
		t.Errorf("a tick looked at %d nodes for a rule in effect at 3 (the cluster has %d running)", ix.tickVisits, len(ix.nodes))
	}
	// Children the rogue spawned and ended are not walked again.
	for i := range 5 {
		c := g.spawn(kid, fmt.Sprintf("churn%d", i))
		ix.putNode(c)
		ix.putNode(rogue36fTerminate(t, g, c))
	}
	ix.dirty = newFairQueue()
	ix.markTimed()
	if ix.dirty.len() != 2*3 || ix.tickVisits > 6 {
		t.Errorf("after the rogue's churn a tick marked %d nodes and looked at %d, want 3 marked and at most 6 looked at", ix.dirty.len()/2, ix.tickVisits)
	}
	// An operator's selector rule on the clock is in effect wherever its
	// labels are: the tick looks at every node for it.
	if _, _, err := g.rules.Add(ctx, Actor{ID: "operator:alice"}, &Rule{Selector: map[string]string{"team": "x"}, Name: "sel", Expression: `observed.age_seconds > 3e9`}); err != nil {
		t.Fatal(err)
	}
	if ix, err = g.rules.load(ctx); err != nil {
		t.Fatal(err)
	}
	ix.dirty = newFairQueue()
	ix.markTimed()
	if ix.dirty.len() != 2*3 {
		t.Errorf("with a selector rule matching nothing, a tick marked %d nodes, want the rogue's subtree's 3", ix.dirty.len()/2)
	}
}

// TestRogue37FADescendantsCallDoesNotListEveryRuleAlongItsLineage: a
// descendant's call changes its shard's totals at every ancestor, and the
// evaluator marks each ancestor at which a rule reading the subtree is in
// effect. To learn that, it listed every rule in effect there — its own,
// each of its ancestors', the selectors — for every ancestor of every
// call: a rogue with a chain of descendants, each given its allotment of
// rules (an ancestor's 64 on each), had each call at the bottom of the
// chain make the evaluator list some 64·d²/2 rules, uncharged. The
// evaluator now keeps how many rules reading the subtree are attached to
// each node, and looks up the ancestor and its lineage.
func TestRogue37FADescendantsCallDoesNotListEveryRuleAlongItsLineage(t *testing.T) {
	g := newRogue31cRig(t)
	ctx := context.Background()
	planner := g.spawn(nil, "planner")
	rogue := g.spawn(planner, "rogue")
	as := Actor{ID: capability.AgentPrefix + rogue.NodeID, NodeID: rogue.NodeID}
	const depth, each = 7, 12
	chain := []*tree.Node{rogue}
	for i := range depth {
		c := g.spawn(chain[len(chain)-1], fmt.Sprintf("c%d", i))
		chain = append(chain, c)
		for j := range each {
			if _, _, err := g.rules.Add(ctx, as, &Rule{NodeID: c.NodeID, Name: fmt.Sprintf("r%d-%d", i, j), Expression: fmt.Sprintf("observed.calls > %d", 1000+100*i+j)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, _, err := g.rules.Add(ctx, Actor{ID: "operator:alice"}, &Rule{NodeID: planner.NodeID, Name: "subtree", Expression: `observed.subtree_calls > 1000`}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := g.st.Watch(wctx, []byte(prefixAll))
	if err != nil {
		t.Fatal(err)
	}
	ix, err := g.rules.load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ix.dirty = newFairQueue() // the start's marks, served
	g.call(chain[len(chain)-1], "shell", false)
	rogue37fSettle(t, g, ix, w, 1)
	// Every node of the chain is marked: the planner's rule reads the
	// subtree and is in effect at each (the bottom one for its own call).
	if got := ix.dirty.len() / 2; got != len(chain)+1 {
		t.Errorf("the call marked %d nodes, want the planner and the chain's %d", got, len(chain))
	}
	// Looked at: each ancestor's lineage (a lookup a level), not the
	// rules in effect along it.
	lineages := 0
	for i := range len(chain) + 1 {
		lineages += i + 1
	}
	if ix.subtreeLooks > 2*lineages {
		t.Errorf("a call at depth %d had the evaluator look at %d rules to mark its ancestors, want at most %d lookups", len(chain), ix.subtreeLooks, 2*lineages)
	}
}
