package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/id"
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
		if _, err := tree.Spawn(ctx, root.NodeId, fmt.Sprintf("c%d", i), nil, "test", nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Update(ctx, func(tx store.Txn) error { return tx.Delete(childCountKey(root.NodeId)) }); err != nil {
		t.Fatal(err)
	}
	for i := 3; i < 5; i++ {
		if _, err := tree.Spawn(ctx, root.NodeId, fmt.Sprintf("c%d", i), nil, "test", nil); err != nil {
			t.Fatalf("child %d of 5: %v", i+1, err)
		}
	}
	if _, err := tree.Spawn(ctx, root.NodeId, "c5", nil, "test", nil); !errors.Is(err, ErrLimit) {
		t.Fatalf("a sixth child with a limit of 5: err = %v, want ErrLimit", err)
	}
	nodes, err := tree.Subtree(ctx, root.NodeId)
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 6 {
		t.Fatalf("subtree of %d nodes, want the root and 5 children", len(nodes))
	}
}

// TestSpawnManyRefusesAnExistingID: SpawnMany takes the children's ids
// from its caller, so an id that is already a node (the parent, a
// sibling), or one given twice, is refused and nothing is written.
func TestSpawnManyRefusesAnExistingID(t *testing.T) {
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
	child, err := tree.Spawn(ctx, root.NodeId, "child", nil, "test", nil)
	if err != nil {
		t.Fatal(err)
	}
	fresh := id.New(id.Node)
	for _, specs := range [][]ChildSpec{
		{{ID: root.NodeId, Name: "again"}},
		{{ID: fresh, Name: "new"}, {ID: child.NodeId, Name: "again"}},
		{{ID: fresh, Name: "new"}, {ID: fresh, Name: "twice"}},
		{{ID: "not-an-id", Name: "bad"}},
	} {
		if _, err := tree.SpawnMany(ctx, root.NodeId, specs, "test", nil); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("SpawnMany of %v: err = %v, want ErrInvalidArgument", specs, err)
		}
	}
	nodes, err := tree.Subtree(ctx, root.NodeId)
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 2 || nodes[0].Name != "root" || nodes[1].Name != "child" {
		t.Fatalf("after refused SpawnMany calls the subtree is %v, want the root and its one child unchanged", nodes)
	}
}
