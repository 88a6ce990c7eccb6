package stoprule

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	"github.com/tetherhq/tether/supervisor/ledger"
	"github.com/tetherhq/tether/supervisor/tree"
)

// countingTxn counts the keys a transaction writes.
type countingTxn struct {
	store.Txn
	puts  []string
	bytes map[string]int // by key, the size of the key and value put last
}

func (c *countingTxn) Put(k, v []byte) error {
	c.puts = append(c.puts, string(k))
	if c.bytes == nil {
		c.bytes = map[string]int{}
	}
	c.bytes[string(k)] = len(k) + len(v)
	return c.Txn.Put(k, v)
}

// TestRogue30CSubtreeCallsAreExactAndCostOneRecordPerAncestor: a rogue
// spreading its calls over a wide subtree, concurrently, is counted
// exactly at every ancestor (each node's subtree_calls and
// subtree_failures are its own and its descendants', what folding every
// call into every ancestor gives), and each call writes its node's
// counters and, per ancestor, one record of totals and one count of its
// tool (thirty-first pass), and its listing as open (thirty-fourth pass),
// whatever the size of the subtrees above it: no walk of a subtree per
// call.
func TestRogue30CSubtreeCallsAreExactAndCostOneRecordPerAncestor(t *testing.T) {
	st, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	rules := &Rules{Store: st, Clock: clk}
	agents := &tree.Tree{Store: st, Clock: clk, Observer: rules, Limits: tree.Limits{MaxDepth: 8, MaxChildren: 1000, MaxLabels: 4}}
	root, err := agents.RegisterRoot(ctx, "rogue", nil, "test")
	if err != nil {
		t.Fatal(err)
	}
	nodes := []*tree.Node{root}
	for i := range 6 {
		p, err := agents.Spawn(ctx, root.NodeID, fmt.Sprintf("p%d", i), nil, "test", nil)
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, p)
		for j := range 8 {
			c, err := agents.Spawn(ctx, p.NodeID, fmt.Sprintf("c%d", j), nil, "test", nil)
			if err != nil {
				t.Fatal(err)
			}
			nodes = append(nodes, c)
			if j == 0 {
				g, err := agents.Spawn(ctx, c.NodeID, "g", nil, "test", nil)
				if err != nil {
					t.Fatal(err)
				}
				nodes = append(nodes, g)
			}
		}
	}
	// Each node makes i%3 calls, the first of them failed when i%2 == 1,
	// all concurrently.
	var wg sync.WaitGroup
	var mu sync.Mutex
	writes := map[int]int{} // keys written by a begin, by the caller's depth
	for i, n := range nodes {
		wg.Go(func() {
			for k := range i % 3 {
				call := &ledger.ToolCall{CallID: fmt.Sprintf("c-%d-%d", i, k), NodeID: n.NodeID, Tool: "shell", State: ledger.CallStateInFlight, BegunAt: clk.Now()}
				err := st.Update(ctx, func(tx store.Txn) error {
					ct := &countingTxn{Txn: tx}
					if err := rules.ObserveCall(ct, nil, call); err != nil {
						return err
					}
					for _, k := range ct.puts {
						if !strings.HasPrefix(k, prefixObs) && !strings.HasPrefix(k, prefixSub) && !strings.HasPrefix(k, prefixSubTool) && !strings.HasPrefix(k, prefixSubOpen) {
							return fmt.Errorf("a call wrote %s", k)
						}
					}
					mu.Lock()
					writes[len(n.Ancestors)] = max(writes[len(n.Ancestors)], len(ct.puts))
					mu.Unlock()
					return nil
				})
				if err != nil {
					t.Error(err)
					return
				}
				ended := *call
				ended.State, ended.EndedAt = ledger.CallStateEnded, clk.Now()
				ended.Resolution = ledger.CallResolutionCompleted
				if k == 0 && i%2 == 1 {
					ended.Resolution = ledger.CallResolutionFailed
				}
				if err := st.Update(ctx, func(tx store.Txn) error { return rules.ObserveCall(tx, call, &ended) }); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	// Since the thirty-fourth pass a call begun open lists itself at each
	// ancestor by its begin time too (subOpenKey, an empty value), since
	// the thirty-fifth only where its shard's record holds another open
	// call (the calls here are concurrent): at most three small keys per
	// ancestor (TestRogue35DACallAloneInItsShardListsItselfAtNoAncestor
	// counts them exactly).
	for depth, n := range writes {
		if n < 2*depth+1 || n > 3*depth+1 {
			t.Errorf("a call at depth %d wrote %d keys, want its counters and, per ancestor, its shard's totals, its count of the tool and at most its open call listed (%d to %d)", depth, n, 2*depth+1, 3*depth+1)
		}
	}
	// The model: every call folded into its node and every ancestor.
	wantCalls, wantFailures := map[string]int64{}, map[string]int64{}
	for i, n := range nodes {
		for _, id := range append([]string{n.NodeID}, n.Ancestors...) {
			wantCalls[id] += int64(i % 3)
			if i%3 > 0 && i%2 == 1 {
				wantFailures[id]++
			}
		}
	}
	err = st.View(ctx, func(tx store.ReadTxn) error {
		for _, n := range nodes {
			o, _, err := readNode(tx, n.NodeID)
			if err != nil {
				return err
			}
			if o.SubtreeCalls != wantCalls[n.NodeID] || o.SubtreeFailures != wantFailures[n.NodeID] {
				t.Errorf("%s (depth %d): subtree calls %d, failures %d; want %d, %d", n.Name, len(n.Ancestors), o.SubtreeCalls, o.SubtreeFailures, wantCalls[n.NodeID], wantFailures[n.NodeID])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if wantCalls[root.NodeID] == 0 || wantFailures[root.NodeID] == 0 {
		t.Fatal("the model counted nothing")
	}
}

// TestRogue30CSubtreeSpendCannotBeHiddenByFillingTheRecords: the subtree
// totals of the reported counters keep at most MaxCounters names per
// record, so a rogue fills one: a child reports MaxCounters junk names,
// then a sibling sharing its record reports its spend under a name the
// record has no room for. The spend is counted under the record's other,
// and a lookup of it reads at least what was spent, never 0; a report
// replacing a counter moves the totals by the change, a negative counter
// counting as 0; and the per-node self_reported keeps its meaning.
func TestRogue30CSubtreeSpendCannotBeHiddenByFillingTheRecords(t *testing.T) {
	st, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	rules := &Rules{Store: st, Clock: clk}
	agents := &tree.Tree{Store: st, Clock: clk, Observer: rules, Limits: tree.Limits{MaxDepth: 8, MaxChildren: 1000, MaxLabels: 4}}
	rogue, err := agents.RegisterRoot(ctx, "rogue", nil, "test")
	if err != nil {
		t.Fatal(err)
	}
	// Two children sharing a record of the rogue's: spawned until two
	// land in one shard (256 shards: some twenty spawns on average).
	byShard := map[uint32]*tree.Node{}
	var filler, spender *tree.Node
	for i := 0; spender == nil; i++ {
		if i == 1000 {
			t.Fatal("no two of 1000 children share a shard")
		}
		c, err := agents.Spawn(ctx, rogue.NodeID, fmt.Sprintf("kid%d", i), nil, "test", nil)
		if err != nil {
			t.Fatal(err)
		}
		if f, ok := byShard[growShard(c.NodeID)]; ok {
			filler, spender = f, c
		}
		byShard[growShard(c.NodeID)] = c
	}
	report := func(n *tree.Node, counters map[string]float64) {
		t.Helper()
		if _, err := rules.Report(ctx, Actor{ID: "agent:" + n.NodeID, NodeID: n.NodeID}, n.NodeID, counters); err != nil {
			t.Fatal(err)
		}
	}
	junk := map[string]float64{}
	for i := range MaxCounters {
		junk[fmt.Sprintf("junk%02d", i)] = 0.5
	}
	report(filler, junk)
	report(spender, map[string]float64{"cost_usd": 40, "tokens": 7})
	report(spender, map[string]float64{"cost_usd": 30}) // replaced: the total follows
	report(rogue, map[string]float64{"cost_usd": 2, "refund": -100})

	judge := func(n *tree.Node, expression string) Result {
		t.Helper()
		c, err := Compile(expression)
		if err != nil {
			t.Fatal(err)
		}
		var res Result
		err = st.View(ctx, func(tx store.ReadTxn) error {
			o, self, err := readNode(tx, n.NodeID)
			if err != nil {
				return err
			}
			sums, err := readSubtreeReported(tx, n.NodeID, self)
			if err != nil {
				return err
			}
			res = c.evaluate(Snapshot(o, n, clk.Now()), self, sums)
			res.Values = c.values(Snapshot(o, n, clk.Now()), self, sums)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	for _, tc := range []struct {
		node       *tree.Node
		expression string
		want       bool
	}{
		// At least 2 + 30: the record's other holds the spend, and the
		// tokens too (an over-count, never an under-count).
		{rogue, `subtree_reported.cost_usd >= 32.0`, true},
		{rogue, `subtree_reported[?"cost_usd"].orValue(0.0) >= 32.0`, true},
		{rogue, `subtree_reported.cost_usd == 39.0`, true}, // 2 + 30 + the 7 tokens beside it in the other
		{rogue, `subtree_reported.tokens >= 7.0`, true},    // no record tracks it: the others
		{rogue, `"cost_usd" in subtree_reported`, true},
		{rogue, `self_reported.cost_usd == 2.0`, true},
		{rogue, `subtree_reported.junk00 == 0.5`, true}, // tracked: exact
		{rogue, `subtree_reported.refund >= 0.0`, true}, // a negative counter counts as 0
		{spender, `subtree_reported.cost_usd == 30.0`, true},
		{filler, `"cost_usd" in subtree_reported`, false},
	} {
		res := judge(tc.node, tc.expression)
		if res.Err != nil || res.Fired != tc.want {
			t.Errorf("%s at %s: %v (%v), want %v; values %v", tc.expression, tc.node.Name, res.Fired, res.Err, tc.want, res.Values)
		}
	}
	res := judge(rogue, `subtree_reported.tokens > 0.0`)
	if len(res.Values) != 1 || res.Values[0].Name != "subtree_reported.tokens" || res.Values[0].Value != "37" || !res.Values[0].SelfReported {
		t.Fatalf("values %v, want subtree_reported.tokens = 37 (the records' other) labelled self-reported", res.Values)
	}
}
