package stoprule

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	"github.com/tetherhq/tether/supervisor/ledger"
	"github.com/tetherhq/tether/supervisor/tree"
)

// rogue31cRig is a store, a tree observed by Rules, and a way to make a
// node's calls and judge an expression at a node.
type rogue31cRig struct {
	t      *testing.T
	st     store.Store
	clk    *clock.Manual
	rules  *Rules
	agents *tree.Tree
	seq    int
}

func newRogue31cRig(t *testing.T) *rogue31cRig {
	st, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	rules := &Rules{Store: st, Clock: clk}
	return &rogue31cRig{t: t, st: st, clk: clk, rules: rules,
		agents: &tree.Tree{Store: st, Clock: clk, Observer: rules, Limits: tree.Limits{MaxDepth: 8, MaxChildren: 1000, MaxLabels: 4}}}
}

func (g *rogue31cRig) spawn(parent *tree.Node, name string) *tree.Node {
	g.t.Helper()
	if parent == nil {
		n, err := g.agents.RegisterRoot(context.Background(), name, nil, "test")
		if err != nil {
			g.t.Fatal(err)
		}
		return n
	}
	n, err := g.agents.Spawn(context.Background(), parent.NodeID, name, nil, "test", nil)
	if err != nil {
		g.t.Fatal(err)
	}
	return n
}

// call has n begin a call to tool and end it, failed when fail.
func (g *rogue31cRig) call(n *tree.Node, tool string, fail bool) {
	g.t.Helper()
	g.seq++
	c := &ledger.ToolCall{CallID: fmt.Sprintf("call-%d", g.seq), NodeID: n.NodeID, Tool: tool, State: ledger.CallStateInFlight, BegunAt: g.clk.Now()}
	ctx := context.Background()
	if err := g.st.Update(ctx, func(tx store.Txn) error { return g.rules.ObserveCall(tx, nil, c) }); err != nil {
		g.t.Fatal(err)
	}
	ended := *c
	ended.State, ended.EndedAt, ended.Resolution = ledger.CallStateEnded, g.clk.Now(), ledger.CallResolutionCompleted
	if fail {
		ended.Resolution = ledger.CallResolutionFailed
	}
	if err := g.st.Update(ctx, func(tx store.Txn) error { return g.rules.ObserveCall(tx, c, &ended) }); err != nil {
		g.t.Fatal(err)
	}
}

// judge evaluates expression at n as the evaluator does, with the values
// it read.
func (g *rogue31cRig) judge(n *tree.Node, expression string) Result {
	g.t.Helper()
	c, err := Compile(expression)
	if err != nil {
		g.t.Fatal(err)
	}
	var res Result
	err = g.st.View(context.Background(), func(tx store.ReadTxn) error {
		o, self, _, err := readNodeTools(tx, n.NodeID, c.UsesSubtreeTools)
		if err != nil {
			return err
		}
		sums, err := readSubtreeReported(tx, n.NodeID, self)
		if err != nil {
			return err
		}
		snap := Snapshot(o, n, g.clk.Now())
		res = c.evaluate(snap, self, sums)
		res.Values = c.values(snap, self, sums)
		return nil
	})
	if err != nil {
		g.t.Fatal(err)
	}
	return res
}

// TestRogue31CCallsToOneToolSplitAmongDescendantsCountAgainstTheSubtree:
// an operator holds a rogue to at most three calls of delete_db over its
// subtree. The rogue makes one itself and has two children and a
// grandchild make one each (no node above one; subtree_calls, every tool
// together, says nothing of delete_db): subtree_calls_by_tool counts the
// four, and subtree_failures_by_tool the failed ones, however they are
// split. Each node's calls_by_tool keeps its own meaning.
func TestRogue31CCallsToOneToolSplitAmongDescendantsCountAgainstTheSubtree(t *testing.T) {
	g := newRogue31cRig(t)
	rogue := g.spawn(nil, "rogue")
	a, b := g.spawn(rogue, "a"), g.spawn(rogue, "b")
	grand := g.spawn(a, "grand")
	g.call(rogue, "delete_db", false)
	g.call(a, "delete_db", true)
	g.call(b, "delete_db", false)
	g.call(grand, "delete_db", true)
	for range 5 {
		g.call(b, "read", false)
	}
	for _, tc := range []struct {
		node       *tree.Node
		expression string
		want       bool
	}{
		{rogue, `observed.subtree_calls_by_tool["delete_db"] > 3`, true},
		{rogue, `observed.subtree_calls_by_tool.delete_db == 4 && observed.subtree_calls_by_tool.read == 5`, true},
		{rogue, `observed.subtree_failures_by_tool["delete_db"] >= 2`, true},
		{rogue, `"read" in observed.subtree_failures_by_tool`, false},
		{rogue, `observed.calls_by_tool["delete_db"] == 1`, true},
		{a, `observed.subtree_calls_by_tool["delete_db"] == 2 && observed.subtree_failures_by_tool["delete_db"] == 2`, true},
		{grand, `observed.subtree_calls_by_tool["delete_db"] == 1`, true},
		{b, `"delete_db" in observed.subtree_failures_by_tool`, false},
	} {
		res := g.judge(tc.node, tc.expression)
		if res.Err != nil || res.Fired != tc.want {
			t.Errorf("%s at %s: %v (%v), want %v; values %v", tc.expression, tc.node.Name, res.Fired, res.Err, tc.want, res.Values)
		}
	}
	res := g.judge(rogue, `observed.subtree_calls_by_tool["delete_db"] > 3`)
	if len(res.Values) != 1 || res.Values[0].Name != `observed.subtree_calls_by_tool["delete_db"]` || res.Values[0].Value != "4" || res.Values[0].SelfReported {
		t.Fatalf("values %v, want observed.subtree_calls_by_tool[\"delete_db\"] = 4, observed", res.Values)
	}
}

// TestRogue31CSubtreeToolCountsCannotBeHiddenByFillingTheRecords: a
// record of an ancestor tracks at most MaxTools tools, so a rogue fills
// one: a child calls MaxTools harmless tools, then a sibling sharing its
// record calls delete_db, which the record has no room for. The call is
// counted under the record's other, and a lookup of delete_db at the
// rogue reads at least the calls made, never 0 nor absent.
func TestRogue31CSubtreeToolCountsCannotBeHiddenByFillingTheRecords(t *testing.T) {
	g := newRogue31cRig(t)
	rogue := g.spawn(nil, "rogue")
	byShard := map[uint32]*tree.Node{}
	var filler, caller *tree.Node
	for i := 0; caller == nil; i++ {
		if i == 1000 {
			t.Fatal("no two of 1000 children share a shard")
		}
		c := g.spawn(rogue, fmt.Sprintf("kid%d", i))
		if f, ok := byShard[growShard(c.NodeID)]; ok {
			filler, caller = f, c
		}
		byShard[growShard(c.NodeID)] = c
	}
	for i := range MaxTools {
		g.call(filler, fmt.Sprintf("junk%02d", i), false)
	}
	for range 3 {
		g.call(caller, "delete_db", true)
	}
	for _, tc := range []struct {
		node       *tree.Node
		expression string
		want       bool
	}{
		{rogue, `observed.subtree_calls_by_tool["delete_db"] >= 3`, true},
		{rogue, `observed.subtree_calls_by_tool[?"delete_db"].orValue(0) >= 3`, true},
		{rogue, `"delete_db" in observed.subtree_calls_by_tool`, true},
		{rogue, `observed.subtree_failures_by_tool["delete_db"] >= 3`, true},
		{rogue, `observed.subtree_calls_by_tool.junk00 == 1`, true}, // tracked: exact
		{caller, `observed.subtree_calls_by_tool["delete_db"] == 3`, true},
		{filler, `"delete_db" in observed.subtree_calls_by_tool`, false},
	} {
		res := g.judge(tc.node, tc.expression)
		if res.Err != nil || res.Fired != tc.want {
			t.Errorf("%s at %s: %v (%v), want %v; values %v", tc.expression, tc.node.Name, res.Fired, res.Err, tc.want, res.Values)
		}
	}
}

// TestRogue31CSubtreeRecordsOfAnEarlierVersionStillRead: a subtree record
// an earlier version wrote (the two totals alone) reads as tracking no
// tool, and one written now round-trips with the tools it tracks.
func TestRogue31CSubtreeRecordsOfAnEarlierVersionStillRead(t *testing.T) {
	old, err := decodeSubtotal([]byte{7, 2})
	if err != nil || old != (subtotal{calls: 7, failures: 2}) {
		t.Fatalf("an earlier version's record read as %+v (%v), want 7 calls, 2 failures, no tools", old, err)
	}
	s := subtotal{calls: 3, failures: 1, tracked: 2}
	b := s.append(nil)
	got, err := decodeSubtotal(b)
	if err != nil || got != s {
		t.Fatalf("a record read back as %+v (%v), want %+v", got, err, s)
	}
	if _, err := decodeSubtotal(append(b, 0xff)); err == nil {
		t.Fatal("a record with a corrupt tail read without an error")
	}
}

// TestRogue31CFillingTheSubtreeToolRecordsIsChargedToTheRogue: a rogue
// fills its records of its own node with MaxTools tools of 128 characters
// from each of several children, so that reading its subtree's counts by
// tool decodes hundreds of names. An evaluation of a rule that reads them
// is charged to the rogue's tree by the bytes it decoded, not as one read;
// an evaluation of rules that do not read them decodes none and is charged
// as before.
func TestRogue31CFillingTheSubtreeToolRecordsIsChargedToTheRogue(t *testing.T) {
	g := newRogue31cRig(t)
	rogue := g.spawn(nil, "rogue")
	for i := range 8 {
		kid := g.spawn(rogue, fmt.Sprintf("kid%d", i))
		for j := range MaxTools {
			g.call(kid, fmt.Sprintf("%s%d%02d", strings.Repeat("t", 125), i, j), false)
		}
	}
	evaluate := func(expression string) int64 {
		t.Helper()
		c, err := Compile(expression)
		if err != nil {
			t.Fatal(err)
		}
		cost, err := g.rules.evaluateNode(context.Background(), rogue.NodeID, []*activeRule{{rule: &Rule{RuleID: "r", Name: "r", NodeID: rogue.NodeID}, compiled: c}})
		if err != nil {
			t.Fatal(err)
		}
		return cost
	}
	// Up to eight records of 64 names of some 130 bytes: some 60 KiB decoded, each
	// 4 KiB charged as a read. The rules' own cost is a few units.
	if cost := evaluate(`observed.subtree_calls_by_tool["delete_db"] > 100`); cost < 13*evaluationBaseCost {
		t.Fatalf("an evaluation reading 8 full records' tools was charged %d, want at least 12 reads (%d) past its snapshot's", cost, 12*evaluationBaseCost)
	}
	if cost := evaluate(`observed.subtree_calls > 100000 && observed.calls_by_tool.size() < 1000`); cost >= 2*evaluationBaseCost {
		t.Fatalf("an evaluation not reading the tools was charged %d, want its snapshot's read (%d) and the rule's few units", cost, evaluationBaseCost)
	}
}

// TestRogue31CFillingTheSubtreeReportedRecordsIsChargedToTheRogue: as
// with the counts by tool, a rogue fills its node's records of reported
// counters, sixteen children each reporting MaxCounters names of 63
// characters. Every evaluation of its node, whatever rule was judged,
// decoded them all, charged as one read: now only an evaluation of a rule
// that reads subtree_reported decodes them, charged by their size.
func TestRogue31CFillingTheSubtreeReportedRecordsIsChargedToTheRogue(t *testing.T) {
	g := newRogue31cRig(t)
	rogue := g.spawn(nil, "rogue")
	for i := range 16 {
		kid := g.spawn(rogue, fmt.Sprintf("kid%d", i))
		counters := map[string]float64{}
		for j := range MaxCounters {
			counters[fmt.Sprintf("c%s%02d%02d", strings.Repeat("x", 58), i, j)] = 1
		}
		if _, err := g.rules.Report(context.Background(), Actor{ID: "agent:" + kid.NodeID, NodeID: kid.NodeID}, kid.NodeID, counters); err != nil {
			t.Fatal(err)
		}
	}
	evaluate := func(expression string) int64 {
		t.Helper()
		c, err := Compile(expression)
		if err != nil {
			t.Fatal(err)
		}
		cost, err := g.rules.evaluateNode(context.Background(), rogue.NodeID, []*activeRule{{rule: &Rule{RuleID: "r", Name: "r", NodeID: rogue.NodeID}, compiled: c}})
		if err != nil {
			t.Fatal(err)
		}
		return cost
	}
	// Up to sixteen records of 32 names of some 70 bytes: over 30 KiB.
	if cost := evaluate(`subtree_reported[?"cost_usd"].orValue(0.0) > 1000.0`); cost < 7*evaluationBaseCost {
		t.Fatalf("an evaluation reading 16 full records of reported counters was charged %d, want at least 6 reads (%d) past its snapshot's", cost, 6*evaluationBaseCost)
	}
	if cost := evaluate(`observed.subtree_calls > 100000 && self_reported.size() < 1000`); cost >= 2*evaluationBaseCost {
		t.Fatalf("an evaluation not reading subtree_reported was charged %d, want its snapshot's read (%d) and the rule's few units", cost, evaluationBaseCost)
	}
}

// TestRogue31CARogueFillingItsShardsDoesNotMakeEachCallRewriteThem: a
// rogue four levels deep calls MaxTools tools of 128 characters, filling
// its shard's counts by tool at each of its ancestors. Each of its later
// calls — of a tracked tool, of a new one counted under OtherTool — writes
// a few dozen bytes per ancestor (the shard's totals and the one tool's
// count), not the shard's whole record of names at every ancestor (some 9
// KiB each, rewritten on every call of every node of the shard), and the
// counts still read exact or over, never under.
func TestRogue31CARogueFillingItsShardsDoesNotMakeEachCallRewriteThem(t *testing.T) {
	g := newRogue31cRig(t)
	root := g.spawn(nil, "root")
	a := g.spawn(root, "a")
	b := g.spawn(a, "b")
	c := g.spawn(b, "c")
	rogue := g.spawn(c, "rogue")
	long := func(i int) string { return fmt.Sprintf("%s%03d", strings.Repeat("t", 125), i) }
	for i := range MaxTools {
		g.call(rogue, long(i), false)
	}
	for _, tool := range []string{long(7), "delete_db"} {
		g.seq++
		call := &ledger.ToolCall{CallID: fmt.Sprintf("call-%d", g.seq), NodeID: rogue.NodeID, Tool: tool, State: ledger.CallStateInFlight, BegunAt: g.clk.Now()}
		ct := &countingTxn{}
		err := g.st.Update(context.Background(), func(tx store.Txn) error {
			ct.Txn = tx
			return g.rules.ObserveCall(ct, nil, call)
		})
		if err != nil {
			t.Fatal(err)
		}
		subtree := 0
		for k, n := range ct.bytes {
			if strings.HasPrefix(k, prefixSub) || strings.HasPrefix(k, prefixSubTool) {
				subtree += n
			}
		}
		// Four ancestors; per ancestor a totals key of ~50 bytes and a
		// tool's key of ~60 bytes and its name.
		if limit := 4 * (2*64 + len(tool)); subtree > limit {
			t.Errorf("a call of %.12s… wrote %d bytes of subtree records over 4 ancestors, want at most %d", tool, subtree, limit)
		}
	}
	for _, tc := range []struct {
		node       *tree.Node
		expression string
		want       bool
	}{
		{root, fmt.Sprintf(`observed.subtree_calls_by_tool[%q] == 2`, long(7)), true},
		{a, `observed.subtree_calls_by_tool["delete_db"] >= 1`, true},
		{c, `observed.subtree_calls == 66`, true},
	} {
		res := g.judge(tc.node, tc.expression)
		if res.Err != nil || res.Fired != tc.want {
			t.Errorf("%s at %s: %v (%v), want %v", tc.expression, tc.node.Name, res.Fired, res.Err, tc.want)
		}
	}
}
