package stoprule

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor"
)

// TestSpawnCountersStayExactWhileFolded: a spawn writes one growth entry
// per ancestor instead of rewriting the ancestors' counters; readers add
// the entries not folded yet, and folds move them into the counters in
// chunks, concurrently with more spawns. At every point the counters are
// exactly what folding every spawn into every ancestor (ApplySpawn, the
// model) gives, a tool call's counters written between two folds count no
// spawn twice, and once folded no entry is left.
func TestSpawnCountersStayExactWhileFolded(t *testing.T) {
	st, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	rules := &Rules{Store: st, Clock: clk}
	tree := &supervisor.Tree{Store: st, Clock: clk, Observer: rules, Limits: supervisor.Limits{MaxDepth: 8, MaxChildren: 1000, MaxLabels: 4}}
	root, err := tree.RegisterRoot(ctx, "root", nil, "test")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	nodes := []*tetherv1.Node{root}
	spawnUnder := func(parent *tetherv1.Node, n, workers int) {
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for i := w; i < n; i += workers {
					c, err := tree.Spawn(ctx, parent.NodeId, fmt.Sprintf("c%d", i), nil, "test", nil)
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					nodes = append(nodes, c)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
	}
	a, err := tree.Spawn(ctx, root.NodeId, "a", nil, "test", nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := tree.Spawn(ctx, a.NodeId, "b", nil, "test", nil)
	if err != nil {
		t.Fatal(err)
	}
	nodes = append(nodes, a, b)
	// model folds every spawn into every ancestor, as the spawn's own
	// transaction used to.
	model := func() map[string]*tetherv1.StopRuleObservations {
		mu.Lock()
		defer mu.Unlock()
		m := map[string]*tetherv1.StopRuleObservations{}
		get := func(id string) *tetherv1.StopRuleObservations {
			if m[id] == nil {
				m[id] = &tetherv1.StopRuleObservations{}
			}
			return m[id]
		}
		for _, n := range nodes {
			ApplySpawn(n, get)
		}
		return m
	}
	check := func(when string) {
		t.Helper()
		want := model()
		for _, n := range []*tetherv1.Node{root, a, b} {
			var got *tetherv1.StopRuleObservations
			if err := st.View(ctx, func(tx store.ReadTxn) error {
				var err error
				got, _, err = readNode(tx, n.NodeId)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			w := want[n.NodeId]
			if got.SubtreeSize != w.SubtreeSize || got.SubtreeDepth != w.SubtreeDepth || got.Spawns != w.Spawns {
				t.Errorf("%s: node %s has subtree_size %d, subtree_depth %d, spawns %d; want %d, %d, %d",
					when, n.Name, got.SubtreeSize, got.SubtreeDepth, got.Spawns, w.SubtreeSize, w.SubtreeDepth, w.Spawns)
			}
		}
	}
	pending := func(n *tetherv1.Node) int {
		count := 0
		if err := st.View(ctx, func(tx store.ReadTxn) error {
			return tx.Scan(growPrefix(n.NodeId), nil, func(_, _ []byte) error { count++; return nil })
		}); err != nil {
			t.Fatal(err)
		}
		return count
	}

	spawnUnder(a, 130, 8)
	spawnUnder(b, 120, 8)
	check("before any fold")
	if got := pending(root); got != len(nodes)-1 {
		t.Fatalf("%d growth entries under the root before any fold, want %d", got, len(nodes)-1)
	}

	// A tool call's counters are written back between two folds: the
	// pending spawns must not be written into them.
	call := &tetherv1.ToolCall{CallId: "call-1", NodeId: root.NodeId, Tool: "http", State: tetherv1.CallState_CALL_STATE_IN_FLIGHT}
	if err := st.Update(ctx, func(tx store.Txn) error { return rules.ObserveCall(tx, nil, call) }); err != nil {
		t.Fatal(err)
	}
	if more, err := rules.fold(ctx, root.NodeId); err != nil || !more {
		t.Fatalf("first fold of %d entries: more %v, err %v; want more", len(nodes)-1, more, err)
	}
	check("after one fold")

	// Folds go on while more spawns land under every level.
	var wg sync.WaitGroup
	wg.Go(func() {
		for _, n := range []*tetherv1.Node{root, a, b, root, a, b, root, a, b} {
			if _, err := rules.fold(ctx, n.NodeId); err != nil {
				t.Error(err)
			}
		}
	})
	spawnUnder(root, 40, 4)
	spawnUnder(b, 40, 4)
	wg.Wait()
	check("while folding")

	for _, n := range []*tetherv1.Node{root, a, b} {
		for {
			more, err := rules.fold(ctx, n.NodeId)
			if err != nil {
				t.Fatal(err)
			}
			if !more {
				break
			}
		}
		if got := pending(n); got != 0 {
			t.Errorf("%d growth entries left under %s after folding it", got, n.Name)
		}
	}
	check("after folding everything")
	var o *tetherv1.StopRuleObservations
	if err := st.View(ctx, func(tx store.ReadTxn) error {
		var err error
		o, _, err = readNode(tx, root.NodeId)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if o.Calls != 1 || o.CallsInFlight != 1 {
		t.Errorf("the root's call counters: calls %d, in flight %d; want 1 and 1", o.Calls, o.CallsInFlight)
	}
}
