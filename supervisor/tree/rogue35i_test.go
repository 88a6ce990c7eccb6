package tree

import (
	"context"
	"fmt"
	"testing"

	"github.com/tetherhq/tether/internal/store"
)

// TestRogue35IListLevelReadsOneLevel: a page of a node's children reads
// the node, the children it lists and their counts, never the subtree
// below them (a rogue's); the roots are listed from their index, which
// IndexRoots writes once for the roots a version before it stored (more
// than a chunk of them), each root once over the pages.
func TestRogue35IListLevelReadsOneLevel(t *testing.T) {
	ctx := context.Background()
	tr := newBadgerTree(t)
	const roots = rootsChunk + 40
	var first *Node
	for i := range roots {
		r, err := tr.RegisterRoot(ctx, fmt.Sprintf("root-%03d", i), nil, "test")
		if err != nil {
			t.Fatal(err)
		}
		if first == nil {
			first = r
		}
	}
	// The rogue: first's child, with 300 children of its own.
	rogue, err := tr.Spawn(ctx, first.NodeID, "rogue", nil, "test", nil)
	if err != nil {
		t.Fatal(err)
	}
	var specs []ChildSpec
	for i := range 300 {
		specs = append(specs, ChildSpec{Name: fmt.Sprintf("spawn-%03d", i)})
	}
	if _, err := tr.SpawnMany(ctx, rogue.NodeID, specs, "test", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Spawn(ctx, first.NodeID, "helper", nil, "test", nil); err != nil {
		t.Fatal(err)
	}

	lv, read, err := tr.ListLevel(ctx, first.NodeID, "", 1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(lv.Nodes) != 2 || read != 3 || lv.Next != "" {
		t.Fatalf("first's level: %d nodes, %d read, next %q; want its 2 children, 3 nodes read, no next page", len(lv.Nodes), read, lv.Next)
	}
	if lv.ChildCounts[first.NodeID] != 2 || lv.ChildCounts[rogue.NodeID] != 300 {
		t.Fatalf("child counts %v: want first 2, the rogue 300", lv.ChildCounts)
	}
	seen := map[string]bool{}
	for token, pages := "", 0; pages == 0 || token != ""; pages++ {
		lv, read, err := tr.ListLevel(ctx, rogue.NodeID, token, 128)
		if err != nil {
			t.Fatal(err)
		}
		if read > 129 || len(lv.Nodes) > 128 {
			t.Fatalf("a page of 128 of the rogue's children read %d nodes", read)
		}
		for _, n := range lv.Nodes {
			if seen[n.NodeID] || n.ParentNodeID != rogue.NodeID {
				t.Fatalf("page %d lists %s (parent %s) again or from elsewhere", pages, n.Name, n.ParentNodeID)
			}
			seen[n.NodeID] = true
		}
		token = lv.Next
	}
	if len(seen) != 300 {
		t.Fatalf("the rogue's pages list %d children, want 300", len(seen))
	}

	// A data directory written before the roots' index.
	if err := tr.Store.Update(ctx, func(tx store.Txn) error {
		var keys [][]byte
		if err := tx.Scan([]byte(prefixRoot), nil, func(k, _ []byte) error { keys = append(keys, append([]byte(nil), k...)); return nil }); err != nil {
			return err
		}
		for _, k := range keys {
			if err := tx.Delete(k); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if lv, _, err := tr.ListLevel(ctx, "", "", 1000); err != nil || len(lv.Nodes) != 0 {
		t.Fatalf("roots without their index: %d, %v", len(lv.Nodes), err)
	}
	if n, err := tr.IndexRoots(ctx); err != nil || n != roots {
		t.Fatalf("IndexRoots indexed %d roots (%v), want %d", n, err, roots)
	}
	if n, err := tr.IndexRoots(ctx); err != nil || n != 0 {
		t.Fatalf("IndexRoots again indexed %d (%v), want none: the mark is written", n, err)
	}
	got := map[string]bool{}
	for token, pages := "", 0; pages == 0 || token != ""; pages++ {
		lv, _, err := tr.ListLevel(ctx, "", token, 100)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range lv.Nodes {
			if got[n.NodeID] || n.ParentNodeID != "" {
				t.Fatalf("the roots' pages list %s twice or a child", n.Name)
			}
			got[n.NodeID] = true
		}
		token = lv.Next
	}
	if len(got) != roots {
		t.Fatalf("the roots' pages list %d roots, want %d", len(got), roots)
	}
}
