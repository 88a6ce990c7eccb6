package stoprule

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/ledger"
	"github.com/tetherhq/tether/supervisor/tree"
)

// The thirty-eighth hostile pass, stop rules: the rogue under a rule on
// its subtree's peak of calls in flight has the evaluator start counting
// again from the level.

var errRogue38FFired = errors.New("the rule is true")

// rogue38fWorld is a planner with a rogue and its three children, an
// honest tree beside them, and an operator's rules on each reading the
// subtree's peak of calls in flight.
type rogue38fWorld struct {
	g               *rogue31cRig
	planner, rogue  *tree.Node
	kids            []*tree.Node
	honest          *tree.Node
	workers         []*tree.Node
	six, seven, hon *Rule
}

func newRogue38fWorld(t *testing.T, g *rogue31cRig) *rogue38fWorld {
	ctx := context.Background()
	w := &rogue38fWorld{g: g}
	w.planner = g.spawn(nil, "planner")
	w.rogue = g.spawn(w.planner, "rogue")
	for i := range 3 {
		w.kids = append(w.kids, g.spawn(w.rogue, fmt.Sprintf("kid%d", i)))
	}
	w.honest = g.spawn(nil, "honest")
	for i := range 2 {
		w.workers = append(w.workers, g.spawn(w.honest, fmt.Sprintf("worker%d", i)))
	}
	op := Actor{ID: "operator:alice"}
	add := func(on *tree.Node, name, expression string) *Rule {
		t.Helper()
		r, _, err := g.rules.Add(ctx, op, &Rule{NodeID: on.NodeID, Name: name, Expression: expression})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	w.six = add(w.planner, "six", `observed.subtree_calls_in_flight_max >= 6`)
	w.seven = add(w.planner, "seven", `observed.subtree_calls_in_flight_max >= 7`)
	w.hon = add(w.honest, "honest", `observed.subtree_calls_in_flight_max > 3`)
	// Filing a proposal needs the supervisor: the test asks only whether
	// the rule is true, which the fault point before the filing says.
	g.rules.Fault = func(point string) error {
		if point == "before-file" {
			return errRogue38FFired
		}
		return nil
	}
	return w
}

// fires evaluates rule at n with the evaluator's index ix (of r).
func (w *rogue38fWorld) fires(t *testing.T, r *Rules, ix *index, n *tree.Node, rule *Rule) bool {
	t.Helper()
	a := ix.byID[rule.RuleID]
	if a == nil {
		t.Fatalf("rule %s is not held by the evaluator", rule.Name)
	}
	_, _, err := r.evaluateNodeOpen(context.Background(), n.NodeID, []*activeRule{a}, ix.peaks)
	if err != nil && !errors.Is(err, errRogue38FFired) {
		t.Fatal(err)
	}
	return err != nil
}

// burst has nodes begin a call each, then ends them all.
func (w *rogue38fWorld) burst(nodes ...*tree.Node) {
	var open []*ledger.ToolCall
	for _, n := range nodes {
		open = append(open, w.g.openCall(n))
	}
	for _, c := range open {
		w.g.endCall(c)
	}
}

// honestWork has each honest worker keep three calls open in turn.
func (w *rogue38fWorld) honestWork() {
	for _, k := range w.workers {
		w.burst(k, k, k)
	}
}

// pass starts a pass of r's evaluator: its watch, then its scan.
func (w *rogue38fWorld) pass(t *testing.T, r *Rules) (*index, store.Watcher, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	wt, err := w.g.st.Watch(ctx, []byte(prefixAll))
	if err != nil {
		t.Fatal(err)
	}
	ix, err := r.load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return ix, wt, cancel
}

// TestRogue38FARescanDoesNotResetTheSubtreesPeak: an operator holds a
// rogue's planner to fewer than six calls in flight over its subtree
// (subtree_calls_in_flight_max, the evaluator's count since the
// thirty-seventh pass). The rogue's children begin six calls and end
// them; the evaluator's watch hands it every change and its count reads
// 6 — but the rogue's tree's turns are the rogue's to spend, so its nodes
// wait to be judged, and meanwhile it floods the store until the watch
// falls behind. The pass ends and the next starts from a scan, with a
// fresh count at each node from the level: 0. The burst was forgotten,
// and the rule never fired. Worse, the new pass started each count only
// at the node's first evaluation, late as the rogue's turns make it: a
// second burst right after the rescan, ended before the rogue's nodes
// were judged, was not counted at all. Now the counts outlive the pass
// (Rules.endPass keeps the peaks, and the next scan starts each count
// from the same snapshot as the nodes): both bursts are seen, and an
// honest tree's children peaking one after another are still read at
// their peak, not their sum, across the rescans.
func TestRogue38FARescanDoesNotResetTheSubtreesPeak(t *testing.T) {
	rogue38fRescan(t, newRogue31cRig(t))
}

// TestRogue38FARescanDoesNotResetTheSubtreesPeakOnEtcd is the same on
// etcd.
func TestRogue38FARescanDoesNotResetTheSubtreesPeakOnEtcd(t *testing.T) {
	rogue38fRescan(t, newRogue35kEtcdRig(t))
}

func rogue38fRescan(t *testing.T, g *rogue31cRig) {
	w := newRogue38fWorld(t, g)
	ctx := context.Background()
	r := g.rules
	ix, wt, cancel := w.pass(t, r)
	// The rules' first evaluations, before any call.
	for _, n := range []*tree.Node{w.rogue, w.planner} {
		if w.fires(t, r, ix, n, w.six) {
			t.Fatalf("the rule fired at %s before any call", n.Name)
		}
	}
	if w.fires(t, r, ix, w.honest, w.hon) {
		t.Fatal("the honest tree's rule fired before any call")
	}
	// The burst: taken by the evaluator, its nodes not judged yet.
	w.burst(w.kids[0], w.kids[0], w.rogue, w.kids[1], w.kids[1], w.kids[2])
	w.honestWork()
	rogue37fSettle(t, g, ix, wt, 1)
	// The rogue floods the store: the watch falls behind, the pass ends,
	// the next scans.
	cancel()
	r.endPass(ctx, ix)
	ix, wt, cancel = w.pass(t, r)
	defer func() { cancel() }()
	for _, n := range []*tree.Node{w.rogue, w.planner} {
		if !w.fires(t, r, ix, n, w.six) {
			t.Errorf("a burst of six, counted before the rescan the rogue forced, was forgotten at %s", n.Name)
		}
	}
	if w.fires(t, r, ix, w.honest, w.hon) {
		t.Error("after a rescan the honest tree's workers, three calls each one after the other, read above three")
	}
	// Again, the burst right after the rescan, before the rogue's nodes
	// are judged.
	cancel()
	r.endPass(ctx, ix)
	ix, wt, cancel = w.pass(t, r)
	w.burst(w.kids[0], w.kids[0], w.rogue, w.kids[1], w.kids[1], w.kids[2], w.kids[2])
	w.honestWork()
	rogue37fSettle(t, g, ix, wt, 2)
	for _, n := range []*tree.Node{w.rogue, w.planner} {
		if !w.fires(t, r, ix, n, w.seven) {
			t.Errorf("a burst of seven right after a rescan, ended before the rogue's nodes were judged, was not seen at %s", n.Name)
		}
	}
	if w.fires(t, r, ix, w.honest, w.hon) {
		t.Error("after two rescans the honest tree's workers read above three")
	}
}

// TestRogue38FTheSubtreesPeakSurvivesALeaderChange: the count was the
// leader's memory alone. A burst of six the evaluator had counted was
// gone when the lead moved (or the evaluator restarted): the new leader
// started from the level, 0, and TestStopRule, read from the store on
// any replica, showed the level too. Now the evaluator keeps each node's
// peak in the store (stoprulespeak/<node>) as it rises: the new leader
// starts from it, and TestStopRule reads it.
func TestRogue38FTheSubtreesPeakSurvivesALeaderChange(t *testing.T) {
	rogue38fLeaderChange(t, newRogue31cRig(t))
}

// TestRogue38FTheSubtreesPeakSurvivesALeaderChangeOnEtcd is the same on
// etcd.
func TestRogue38FTheSubtreesPeakSurvivesALeaderChangeOnEtcd(t *testing.T) {
	rogue38fLeaderChange(t, newRogue35kEtcdRig(t))
}

func rogue38fLeaderChange(t *testing.T, g *rogue31cRig) {
	w := newRogue38fWorld(t, g)
	ctx := context.Background()
	r := g.rules
	ix, wt, cancel := w.pass(t, r)
	for _, n := range []*tree.Node{w.rogue, w.planner} {
		if w.fires(t, r, ix, n, w.six) {
			t.Fatalf("the rule fired at %s before any call", n.Name)
		}
	}
	w.fires(t, r, ix, w.honest, w.hon)
	w.burst(w.kids[0], w.kids[0], w.rogue, w.kids[1], w.kids[1], w.kids[2])
	w.honestWork()
	rogue37fSettle(t, g, ix, wt, 1)
	cancel()
	r.endPass(ctx, ix)
	// Another replica takes the lead: its own Rules, nothing in memory.
	next := &Rules{Store: g.st, Clock: g.clk, Fault: r.Fault}
	ix, _, cancel = w.pass(t, next)
	defer cancel()
	for _, n := range []*tree.Node{w.rogue, w.planner} {
		if !w.fires(t, next, ix, n, w.six) {
			t.Errorf("a burst of six the old leader counted was forgotten by the new one at %s", n.Name)
		}
	}
	if w.fires(t, next, ix, w.honest, w.hon) {
		t.Error("the new leader read the honest tree above three")
	}
	// TestStopRule, on any replica.
	op := Actor{ID: "operator:alice"}
	for _, n := range []*tree.Node{w.rogue, w.planner} {
		res, err := next.Test(ctx, op, n.NodeID, `observed.subtree_calls_in_flight_max >= 6`, "")
		if err != nil {
			t.Fatal(err)
		}
		if !res.Fired || res.Observed.SubtreeCallsInFlightMax != 6 {
			t.Errorf("TestStopRule at %s read the peak as %d (fired %v), want 6", n.Name, res.Observed.SubtreeCallsInFlightMax, res.Fired)
		}
	}
	res, err := next.Test(ctx, op, w.honest.NodeID, `observed.subtree_calls_in_flight_max`+" > 3", "")
	if err != nil {
		t.Fatal(err)
	}
	if res.Fired || res.Observed.SubtreeCallsInFlightMax != 3 {
		t.Errorf("TestStopRule read the honest tree's peak as %d, want 3", res.Observed.SubtreeCallsInFlightMax)
	}
}

// TestRogue38FTheCountStartsWhenTheEvaluatorReadsTheRule: the count of a
// node's subtree calls in flight started at the first evaluation there of
// a rule reading it, and the rogue's own tree's turns make that as late as
// the rogue likes: an operator attached the rule to the rogue's planner,
// and the rogue's burst of six, begun and ended before its nodes were
// judged, was not counted. The count now starts as the evaluator reads
// the rule (startPeaks, after it takes what its watches hold, before it
// evaluates): the burst is seen at the rogue and at its planner.
func TestRogue38FTheCountStartsWhenTheEvaluatorReadsTheRule(t *testing.T) {
	g := newRogue31cRig(t)
	ctx := context.Background()
	planner := g.spawn(nil, "planner")
	rogue := g.spawn(planner, "rogue")
	var kids []*tree.Node
	for i := range 3 {
		kids = append(kids, g.spawn(rogue, fmt.Sprintf("kid%d", i)))
	}
	w := &rogue38fWorld{g: g}
	g.rules.Fault = func(point string) error {
		if point == "before-file" {
			return errRogue38FFired
		}
		return nil
	}
	r := g.rules
	ix, wt, cancel := w.pass(t, r)
	defer cancel()
	rule, _, err := r.Add(ctx, Actor{ID: "operator:alice"}, &Rule{NodeID: planner.NodeID, Name: "six", Expression: `observed.subtree_calls_in_flight_max >= 6`})
	if err != nil {
		t.Fatal(err)
	}
	// The evaluator takes the rule from its watch, then (its loop) starts
	// the counts before it evaluates anything.
	rogue37fSettle(t, g, ix, wt, 1)
	if ix.byID[rule.RuleID] == nil {
		t.Fatal("the evaluator did not take the rule")
	}
	r.startPeaks(ctx, ix)
	w.burst(kids[0], kids[0], rogue, kids[1], kids[1], kids[2])
	rogue37fSettle(t, g, ix, wt, 2)
	for _, n := range []*tree.Node{rogue, planner} {
		if !w.fires(t, r, ix, n, rule) {
			t.Errorf("a burst of six after the rule was read, before %s was judged, was not seen there", n.Name)
		}
	}
}
