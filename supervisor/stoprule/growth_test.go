package stoprule

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/tetherhq/tether/supervisor/internal/kv"
	"github.com/tetherhq/tether/supervisor/ledger"
	"github.com/tetherhq/tether/supervisor/tree"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
)

// TestSpawnCountersStayExactAcrossShards: a spawn counts itself into one
// growth record of each ancestor, chosen by its parent, instead of
// rewriting the ancestors' counters. With spawns landing concurrently
// under many parents at several levels, a tool call's counters written in
// between, and a node whose counters an older version had stored with its
// spawns folded in, every node's counters are exactly what folding every
// spawn into every ancestor (ApplySpawn, the model) gives.
func TestSpawnCountersStayExactAcrossShards(t *testing.T) {
	st, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	rules := &Rules{Store: st, Clock: clk}
	agents := &tree.Tree{Store: st, Clock: clk, Observer: rules, Limits: tree.Limits{MaxDepth: 8, MaxChildren: 1000, MaxLabels: 4}}
	root, err := agents.RegisterRoot(ctx, "root", nil, "test")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	nodes := []*tree.Node{root}
	add := func(n *tree.Node) {
		mu.Lock()
		nodes = append(nodes, n)
		mu.Unlock()
	}
	// An older version folded spawns into the stored counters: the root
	// arrives with two children, one grandchild, already counted.
	old := &Observations{Spawns: 2, SubtreeSize: 4, SubtreeDepth: 2}
	if err := st.Update(ctx, func(tx store.Txn) error { return kv.Put(tx, obsKey(root.NodeID), old) }); err != nil {
		t.Fatal(err)
	}
	// Levels: 12 parents under the root, each with children, some of
	// which have children of their own; every level spawned concurrently.
	var parents []*tree.Node
	for i := range 12 {
		p, err := agents.Spawn(ctx, root.NodeID, fmt.Sprintf("p%d", i), nil, "test", nil)
		if err != nil {
			t.Fatal(err)
		}
		parents = append(parents, p)
		add(p)
	}
	var wg sync.WaitGroup
	var mids []*tree.Node
	for w, p := range parents {
		wg.Go(func() {
			for i := range 15 {
				c, err := agents.Spawn(ctx, p.NodeID, fmt.Sprintf("c%d", i), nil, "test", nil)
				if err != nil {
					t.Error(err)
					return
				}
				add(c)
				if i < 2 {
					mu.Lock()
					mids = append(mids, c)
					mu.Unlock()
				}
			}
			if w == 0 {
				call := &ledger.ToolCall{CallID: "call-1", NodeID: root.NodeID, Tool: "http", State: ledger.CallStateInFlight}
				if err := st.Update(ctx, func(tx store.Txn) error { return rules.ObserveCall(tx, nil, call) }); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	for _, m := range mids {
		wg.Go(func() {
			for i := range 5 {
				c, err := agents.Spawn(ctx, m.NodeID, fmt.Sprintf("g%d", i), nil, "test", nil)
				if err != nil {
					t.Error(err)
					return
				}
				add(c)
			}
		})
	}
	wg.Wait()

	want := map[string]*Observations{root.NodeID: old}
	for _, n := range nodes {
		ApplySpawn(n, func(id string) *Observations {
			if want[id] == nil {
				want[id] = &Observations{}
			}
			return want[id]
		})
	}
	checked := 0
	for _, n := range nodes {
		var got *Observations
		if err := st.View(ctx, func(tx store.ReadTxn) error {
			var err error
			got, _, err = readNode(tx, n.NodeID)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		w := want[n.NodeID]
		if w == nil {
			w = &Observations{}
		}
		if got.SubtreeSize != w.SubtreeSize || got.SubtreeDepth != w.SubtreeDepth || got.Spawns != w.Spawns {
			t.Errorf("node %s: subtree_size %d, subtree_depth %d, spawns %d; want %d, %d, %d",
				n.Name, got.SubtreeSize, got.SubtreeDepth, got.Spawns, w.SubtreeSize, w.SubtreeDepth, w.Spawns)
		}
		if n.NodeID == root.NodeID && (got.Calls != 1 || got.CallsInFlight != 1) {
			t.Errorf("the root's call counters: calls %d, in flight %d; want 1 and 1", got.Calls, got.CallsInFlight)
		}
		checked++
	}
	if want[root.NodeID].SubtreeSize != 4+12+12*15+24*5 {
		t.Fatalf("the model's root subtree_size is %d: the test does not spawn what it says", want[root.NodeID].SubtreeSize)
	}
	t.Logf("checked the counters of %d nodes", checked)
}
