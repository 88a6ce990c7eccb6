package stoprule

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/ledger"
	"github.com/tetherhq/tether/supervisor/tree"
)

// The thirty-third hostile pass, stop rules: the rogue keeps its calls
// open, so that their time never reaches a rule on call time.

// openCall has n begin a call and leaves it open; it returns the call.
func (g *rogue31cRig) openCall(n *tree.Node) *ledger.ToolCall {
	g.t.Helper()
	g.seq++
	c := &ledger.ToolCall{CallID: fmt.Sprintf("call-%d", g.seq), NodeID: n.NodeID, Tool: "fetch", State: ledger.CallStateInFlight, BegunAt: g.clk.Now()}
	if err := g.st.Update(context.Background(), func(tx store.Txn) error { return g.rules.ObserveCall(tx, nil, c) }); err != nil {
		g.t.Fatal(err)
	}
	return c
}

// endCall ends c now, completed.
func (g *rogue31cRig) endCall(c *ledger.ToolCall) {
	g.t.Helper()
	ended := *c
	ended.State, ended.EndedAt, ended.Resolution = ledger.CallStateEnded, g.clk.Now(), ledger.CallResolutionCompleted
	if err := g.st.Update(context.Background(), func(tx store.Txn) error { return g.rules.ObserveCall(tx, c, &ended) }); err != nil {
		g.t.Fatal(err)
	}
}

// TestRogue33DDescendantsOpenCallsCountTheirTimeAtTheirAncestors: a
// rogue's child and grandchild keep calls open (the grandchild two). The
// rogue's subtree counts their time at the instant it is judged, each
// ancestor its own descendants' calls only, and stops counting a call at
// its end, as the time it took; the longest open call of one shard is
// exact. Before, every subtree read 0 seconds while the calls were open.
func TestRogue33DDescendantsOpenCallsCountTheirTimeAtTheirAncestors(t *testing.T) {
	g := newRogue31cRig(t)
	rogue := g.spawn(nil, "rogue")
	kid := g.spawn(rogue, "kid")
	grand := g.spawn(kid, "grand")
	kidCall := g.openCall(kid)
	g.clk.Advance(10 * time.Second)
	g.openCall(grand)
	g.openCall(grand)
	g.clk.Advance(100 * time.Second)
	for _, tc := range []struct {
		node       *tree.Node
		expression string
	}{
		{rogue, `observed.subtree_call_seconds_total == 310.0 && observed.subtree_call_seconds_max == 110.0`},
		{kid, `observed.subtree_call_seconds_total == 200.0 && observed.subtree_call_seconds_max == 100.0`},
		{grand, `observed.subtree_call_seconds_total == 0.0`}, // its own calls are read from the ledger
	} {
		if res := g.judge(tc.node, tc.expression); res.Err != nil || !res.Fired {
			t.Errorf("%s at %s: %v (%v); values %v", tc.expression, tc.node.Name, res.Fired, res.Err, res.Values)
		}
	}
	g.endCall(kidCall)
	g.clk.Advance(50 * time.Second)
	if res := g.judge(rogue, `observed.subtree_call_seconds_total == 410.0 && observed.subtree_call_seconds_max == 150.0`); res.Err != nil || !res.Fired {
		t.Errorf("after the kid's call ended (110 s): %v (%v); values %v", res.Fired, res.Err, res.Values)
	}
}

// TestRogue33DOpenCallsInTheRecordsRoundTripAndNeverWrap: the open calls a
// subtree record counts are stored after its times and read back; a
// record without them (an earlier version) reads none; a call open before
// the records counted open calls, ending, never wraps the count to read
// as billions of calls open.
func TestRogue33DOpenCallsInTheRecordsRoundTripAndNeverWrap(t *testing.T) {
	s := subtotal{calls: 3}
	s.add(subtotal{open: 1, openMs: 1_700_000_000_000})
	b := s.append(nil)
	got, err := decodeSubtotal(b)
	if err != nil || got != s {
		t.Fatalf("a record read back as %+v (%v), want %+v", got, err, s)
	}
	if _, err := decodeSubtotal(b[:len(b)-1]); err == nil {
		t.Fatal("a record cut short read without an error")
	}
	if _, err := decodeSubtotal(append(b, 0, 0)); err == nil {
		t.Fatal("a record with a corrupt tail read without an error")
	}
	s.add(subtotal{closed: 1, closedMs: 1_700_000_000_000})
	if s.open != 0 || s.openMs != 0 {
		t.Fatalf("after its one open call ended the record counts %d open (%d ms)", s.open, s.openMs)
	}
	s.add(subtotal{closed: 1, closedMs: 1_600_000_000_000}) // open before the records counted it
	if s.open != 0 || s.openMs != 0 {
		t.Fatalf("an uncounted call's end left %d open (%d ms), want none", s.open, s.openMs)
	}
	if b := s.append(nil); len(b) != 2 {
		t.Fatalf("a record with no call open nor ended written as %v, want its two totals as before", b)
	}
}

// TestRogue33DARuleWithinTheBudgetAtMaxLabelsCostsPastItBeyond: why a tree
// allowing more than MaxLabels labels is refused (controlplane.New). A
// rule looping over a node's labels twice is accepted within the budget,
// bounded at MaxLabels; on a node of MaxLabels labels it is judged, on a
// node of twice as many its evaluation is stopped at the budget and fails,
// and would never fire.
func TestRogue33DARuleWithinTheBudgetAtMaxLabelsCostsPastItBeyond(t *testing.T) {
	nums := make([]string, 55)
	for i := range nums {
		nums[i] = fmt.Sprint(i + 1)
	}
	fiftyFive := "[" + strings.Join(nums, ",") + "]"
	c, err := Compile(strings.Replace(`observed.node_labels.exists(k, LIST.all(x, x > 0) && k == "stop")`, "LIST", fiftyFive, 1))
	if err != nil {
		t.Fatalf("the rule was refused: %v", err)
	}
	labels := func(n int) map[string]string {
		m := map[string]string{}
		for i := range n {
			m[fmt.Sprintf("label-%02d", i)] = "v"
		}
		return m
	}
	if res := c.evaluate(&Observations{NodeLabels: labels(MaxLabels)}, nil, nil); res.Err != nil {
		t.Fatalf("at %d labels: %v", MaxLabels, res.Err)
	}
	if res := c.evaluate(&Observations{NodeLabels: labels(2 * MaxLabels)}, nil, nil); res.Err == nil {
		t.Fatalf("at %d labels the rule cost %d and was judged; want it stopped at the budget (else the bound need not be refused)", 2*MaxLabels, res.Cost)
	}
}

// TestRogue33DARescanKeepsTheRoguesDebt: a rogue whose tree overspent its
// turns (its agents' rules near the budget at every node) floods the store
// with writes until the evaluator's watch falls behind: Run's pass ends
// and the next starts from a scan (load). The new queue forgot every
// tree's debt, so each rescan gave the rogue's tree a fresh turn before
// others' were served. Now the pass leaves its debts (Run keeps them as
// the pass ends) and the next queue charges them: after the rescan the
// honest tree is served first, and the rogue's tree still owes its turns.
func TestRogue33DARescanKeepsTheRoguesDebt(t *testing.T) {
	g := newRogue31cRig(t)
	rogue := g.spawn(nil, "rogue")
	for range 3 {
		g.spawn(rogue, "kid")
	}
	honest := g.spawn(nil, "honest")
	ctx := context.Background()
	ix, err := g.rules.load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Each of the rogue's nodes costs ten turns; the honest tree's one.
	cost := func(id string) int64 {
		if id == honest.NodeID {
			return evaluationBaseCost
		}
		return 10 * TurnCost
	}
	var first []string
	serve := func(ix *index) {
		first = nil
		if err := ix.dirty.serveUpTo(1, TurnCost, func(id string, _ phase) (int64, bool, error) {
			first = append(first, id)
			return cost(id), true, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	for ix.dirty.trees[rogue.NodeID] == nil || ix.dirty.trees[rogue.NodeID].deficit >= 0 {
		serve(ix)
	}
	// The watch fell behind: the pass ends, Run keeps its debts, and the
	// next pass loads again.
	g.rules.endPass(ctx, ix)
	ix, err = g.rules.load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for range 2 {
		serve(ix)
		order = append(order, first...)
	}
	if len(order) == 0 || order[0] != honest.NodeID {
		t.Fatalf("after the rescan the evaluator served %v first, want the honest tree %s (the rogue's tree in debt)", order, honest.NodeID)
	}
	if d := ix.dirty.trees[rogue.NodeID]; d == nil || d.deficit >= 0 {
		t.Fatal("after the rescan the rogue's tree owes nothing")
	}
}

// TestRogue33DTestingCallTimeOverManyOpenCallsIsPriced: a rogue with 64
// calls open has TestStopRule judge an expression on call time over and
// over: each test reads its 64 call records from the ledger. The test is
// priced by them (DecodedBytes, a request more per 4 KiB at the API: 32
// calls), as the evaluator charges them; an expression not on call time
// reads none.
func TestRogue33DTestingCallTimeOverManyOpenCallsIsPriced(t *testing.T) {
	g := newRogue31cRig(t)
	rogue := g.spawn(nil, "rogue")
	err := g.st.Update(context.Background(), func(tx store.Txn) error {
		for i := range 64 {
			c := &ledger.ToolCall{CallID: fmt.Sprintf("open-%d", i), NodeID: rogue.NodeID, GateID: "gate", Tool: "fetch", State: ledger.CallStateInFlight, BegunAt: g.clk.Now()}
			if err := ledger.PutCallIn(tx, c); err != nil {
				return err
			}
			if err := tx.Put(ledger.OpenCallKey(rogue.NodeID, c.CallID), []byte("gate")); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	g.clk.Advance(10 * time.Second)
	rogueActor := Actor{ID: "agent:" + rogue.NodeID, NodeID: rogue.NodeID}
	res, err := g.rules.Test(context.Background(), rogueActor, rogue.NodeID, `observed.call_seconds_total > 600.0`, "")
	if err != nil {
		t.Fatal(err)
	}
	if !res.Fired || res.DecodedBytes < 2*4096 {
		t.Fatalf("64 calls open 10 s: result %v, priced %d bytes; want true (640 s) and at least two reads' worth", res.Fired, res.DecodedBytes)
	}
	res, err = g.rules.Test(context.Background(), rogueActor, rogue.NodeID, `observed.calls > 0`, "")
	if err != nil || res.DecodedBytes != 0 {
		t.Fatalf("an expression not on call time priced %d bytes (%v), want none", res.DecodedBytes, err)
	}
}
