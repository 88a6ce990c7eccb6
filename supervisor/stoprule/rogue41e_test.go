package stoprule

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/big"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	"github.com/tetherhq/tether/supervisor/tree"
)

// The forty-first hostile pass, stop rules: the rogue under its planner's
// rule on its subtree's reported spend (subtree_reported) erases what its
// honest workers reported, by the rounding of the records that add the
// reports up.

// rogue41eRig is a planner's tree: the planner, the rogue it spawned, and
// under the rogue the honest workers and the rogue's own hands.
type rogue41eRig struct {
	ctx     context.Context
	rules   *Rules
	agents  *tree.Tree
	planner *tree.Node
	rogue   *tree.Node
}

func newRogue41eRig(t *testing.T) *rogue41eRig {
	t.Helper()
	st, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	rules := &Rules{Store: st, Clock: clk}
	agents := &tree.Tree{Store: st, Clock: clk, Observer: rules, Limits: tree.Limits{MaxDepth: 8, MaxChildren: 10000, MaxLabels: 4}}
	planner, err := agents.RegisterRoot(ctx, "planner", nil, "test")
	if err != nil {
		t.Fatal(err)
	}
	rogue, err := agents.Spawn(ctx, planner.NodeID, "rogue", nil, "test", nil)
	if err != nil {
		t.Fatal(err)
	}
	return &rogue41eRig{ctx: ctx, rules: rules, agents: agents, planner: planner, rogue: rogue}
}

func (g *rogue41eRig) spawn(t *testing.T, name string) *tree.Node {
	t.Helper()
	n, err := g.agents.Spawn(g.ctx, g.rogue.NodeID, name, nil, "test", nil)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// handIn spawns the rogue's children until one lands in shard (one of
// 256: a few hundred spawns on average), the record of each ancestor its
// reports add to.
func (g *rogue41eRig) handIn(t *testing.T, shard uint32) *tree.Node {
	t.Helper()
	for i := range 5000 {
		if n := g.spawn(t, fmt.Sprintf("hand%d", i)); growShard(n.NodeID) == shard {
			return n
		}
	}
	t.Fatalf("no hand of 5000 in shard %d", shard)
	return nil
}

func (g *rogue41eRig) report(t *testing.T, n *tree.Node, counters map[string]float64) {
	t.Helper()
	if _, err := g.rules.Report(g.ctx, Actor{ID: "agent:" + n.NodeID, NodeID: n.NodeID}, n.NodeID, counters); err != nil {
		t.Fatal(err)
	}
}

// spend is subtree_reported.cost_usd at n, as the operator's TestStopRule
// (the evaluator's read of the same records) reads it.
func (g *rogue41eRig) spend(t *testing.T, n *tree.Node) float64 {
	t.Helper()
	res, err := g.rules.Test(g.ctx, Actor{ID: "operator:alice"}, n.NodeID, `subtree_reported.cost_usd >= 0.0`, "")
	if err != nil || res.Err != nil {
		t.Fatalf("test at %s: %v, %v", n.Name, err, res.Err)
	}
	for _, v := range res.Values {
		if v.Name == "subtree_reported.cost_usd" {
			x, err := strconv.ParseFloat(v.Value, 64)
			if err != nil {
				t.Fatal(err)
			}
			return x
		}
	}
	t.Fatalf("test at %s read no subtree_reported.cost_usd: %v", n.Name, res.Values)
	return 0
}

// TestRogue41EARoguesHugeReportTakenBackDoesNotEraseItsWorkersSpend: an
// ancestor's record of its descendants' reported counters (one of 256,
// chosen by the reporting node) adds each report's change to the total
// it holds. A rogue whose honest worker reported 500 spawned children
// until one shared the worker's record, had it report 1e300 (allowed) and
// then 0: the record held 500 + 1e300, rounded to 1e300, then 0, and its
// planner's rule `subtree_reported.cost_usd > 100` on it read 0 at the
// rogue and at the planner, for good. The records now round each change up
// (never below what was reported: the rogue's trick reads as a huge spend,
// an honest subtree's whole numbers stay exact).
func TestRogue41EARoguesHugeReportTakenBackDoesNotEraseItsWorkersSpend(t *testing.T) {
	g := newRogue41eRig(t)
	worker := g.spawn(t, "worker")
	g.report(t, worker, map[string]float64{"cost_usd": 500})
	hand := g.handIn(t, growShard(worker.NodeID))
	for _, n := range []*tree.Node{g.rogue, g.planner} {
		if got := g.spend(t, n); got != 500 {
			t.Fatalf("before the rogue's trick, %s read %v, want 500", n.Name, got)
		}
	}
	g.report(t, hand, map[string]float64{"cost_usd": 1e300})
	g.report(t, hand, map[string]float64{"cost_usd": 0})
	for _, n := range []*tree.Node{g.rogue, g.planner} {
		if got := g.spend(t, n); got < 500 {
			t.Errorf("the worker reported 500 and the rogue's hand 1e300 then 0: %s reads subtree_reported.cost_usd = %v, below 500", n.Name, got)
		}
	}

	// An honest subtree's whole numbers are exact, raised and lowered.
	h := newRogue41eRig(t)
	a, b := h.spawn(t, "a"), h.spawn(t, "b")
	h.report(t, a, map[string]float64{"cost_usd": 40})
	h.report(t, b, map[string]float64{"cost_usd": 7})
	h.report(t, a, map[string]float64{"cost_usd": 30})
	for _, n := range []*tree.Node{h.rogue, h.planner} {
		if got := h.spend(t, n); got != 37 {
			t.Errorf("honest workers at 30 and 7: %s reads %v, want 37", n.Name, got)
		}
	}
}

// TestRogue41EARoguesHugeOverflowDoesNotHideAnotherRecordsSpend: a record
// full of names (MaxCounters) adds further names under its other, which a
// name's lookup reads from every record that does not track it, as all the
// others less those of the records tracking it. A rogue whose hand's
// record tracked cost_usd and held 1e300 in its other (another hand's junk
// name past the record's room) had that subtraction cancel every other record's other:
// its worker's spend of 300, filed under the other of a record another
// hand had filled with junk names, read 0 (1 with the hand's own). Now the
// sums round up, the taking away too, and read at least 301.
func TestRogue41EARoguesHugeOverflowDoesNotHideAnotherRecordsSpend(t *testing.T) {
	g := newRogue41eRig(t)
	worker := g.spawn(t, "worker")
	filler := g.handIn(t, growShard(worker.NodeID))
	var big *tree.Node
	for i := 0; big == nil; i++ {
		if n := g.spawn(t, fmt.Sprintf("big%d", i)); growShard(n.NodeID) != growShard(worker.NodeID) {
			big = n
		}
	}
	junk := map[string]float64{}
	for i := range MaxCounters {
		junk[fmt.Sprintf("junk%02d", i)] = 1
	}
	g.report(t, filler, junk) // the worker's record is full
	g.report(t, worker, map[string]float64{"cost_usd": 300})
	// The hand's own record tracks cost_usd, and its other holds 1e300.
	tracked := map[string]float64{"cost_usd": 1}
	for i := range MaxCounters - 1 {
		tracked[fmt.Sprintf("pad%02d", i)] = 1
	}
	g.report(t, big, tracked)
	g.report(t, g.handIn(t, growShard(big.NodeID)), map[string]float64{"zzz_huge": 1e300})
	for _, n := range []*tree.Node{g.rogue, g.planner} {
		if got := g.spend(t, n); got < 301 {
			t.Errorf("the worker's 300 under its record's other, the hand's 1 tracked beside 1e300 in its other: %s reads subtree_reported.cost_usd = %v, below 301", n.Name, got)
		}
	}
}

// TestRogue41EARecordsSumsNeverRoundBelowTheReports: addUp and addDown
// round toward +Inf and -Inf exactly (against math/big), over changes of
// magnitudes a rogue picks (1e-300 to 1e300, either sign), so a record
// folding them stays at or above its exact total and a lookup's taking
// away of the others stays at or above what is left.
func TestRogue41EARecordsSumsNeverRoundBelowTheReports(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 5))
	pick := func() float64 {
		x := math.Ldexp(rng.Float64()+0.5, rng.IntN(1990)-995)
		if rng.IntN(2) == 0 {
			x = -x
		}
		return x
	}
	exact := func(x float64) *big.Float { return new(big.Float).SetPrec(4096).SetFloat64(x) }
	up, down, want := 0.0, 0.0, exact(0)
	for i := range 20000 {
		d := pick()
		up, down = addUp(up, d), addDown(down, d)
		want.Add(want, exact(d))
		if exact(up).Cmp(want) < 0 || exact(down).Cmp(want) > 0 {
			t.Fatalf("change %d (%v): rounded up %v, down %v, exact %s", i, d, up, down, want.Text('g', 30))
		}
	}
	// Exact sums are left as they are.
	if addUp(30, 7) != 37 || addDown(37, -7) != 30 || addUp(0.5, 0.25) != 0.75 {
		t.Fatal("an exact sum moved")
	}
}
