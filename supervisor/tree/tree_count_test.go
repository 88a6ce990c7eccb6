package tree

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
)

// TestSpawnCountsChildrenOfOlderParents: a parent whose children were
// spawned before the stored child count existed (simulated by removing
// the count) has them counted, so the fan-out limit still holds, and the
// count then goes on from there.
func TestSpawnCountsChildrenOfOlderParents(t *testing.T) {
	st, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	tree := &Tree{Store: st, Clock: clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)), Limits: Limits{MaxDepth: 4, MaxChildren: 5, MaxLabels: 4}}
	root, err := tree.RegisterRoot(ctx, "root", nil, "test")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := tree.Spawn(ctx, root.NodeID, fmt.Sprintf("c%d", i), nil, "test", nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Update(ctx, func(tx store.Txn) error { return tx.Delete(childCountKey(root.NodeID)) }); err != nil {
		t.Fatal(err)
	}
	for i := 3; i < 5; i++ {
		if _, err := tree.Spawn(ctx, root.NodeID, fmt.Sprintf("c%d", i), nil, "test", nil); err != nil {
			t.Fatalf("child %d of 5: %v", i+1, err)
		}
	}
	if _, err := tree.Spawn(ctx, root.NodeID, "c5", nil, "test", nil); !errors.Is(err, ErrLimit) {
		t.Fatalf("a sixth child with a limit of 5: err = %v, want ErrLimit", err)
	}
	nodes, err := tree.Subtree(ctx, root.NodeID)
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 6 {
		t.Fatalf("subtree of %d nodes, want the root and 5 children", len(nodes))
	}
}
