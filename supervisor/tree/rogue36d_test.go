package tree

import (
	"context"
	"fmt"
	"testing"
)

// TestRogue36DListReadsAtMostItsBound: a rogue's 300 children, none
// labelled like the one node an operator looks for. A listing with that
// selector reads at most its bound a call and answers what it found with
// the last node it read as the next token; paged through, it finds the
// node once and ends. Without a bound one call reads every node.
func TestRogue36DListReadsAtMostItsBound(t *testing.T) {
	ctx := context.Background()
	tr := newBadgerTree(t)
	root, err := tr.RegisterRoot(ctx, "planner", nil, "test")
	if err != nil {
		t.Fatal(err)
	}
	rogue, err := tr.Spawn(ctx, root.NodeID, "rogue", nil, "test", nil)
	if err != nil {
		t.Fatal(err)
	}
	var specs []ChildSpec
	for i := range 300 {
		specs = append(specs, ChildSpec{Name: fmt.Sprintf("spawn-%03d", i), Labels: map[string]string{"role": "spawn"}})
	}
	if _, err := tr.SpawnMany(ctx, rogue.NodeID, specs, "test", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Spawn(ctx, root.NodeID, "helper", map[string]string{"role": "retrieval"}, "test", nil); err != nil {
		t.Fatal(err)
	}
	const total = 303
	sel := map[string]string{"role": "retrieval"}

	if _, next, read, err := tr.List(ctx, sel, "", 100, 0); err != nil || read != total || next != "" {
		t.Fatalf("unbounded: read %d, next %q, %v; want all %d read in one call", read, next, err, total)
	}
	var found []string
	calls, reads := 0, 0
	for token := ""; calls == 0 || token != ""; calls++ {
		if calls > total {
			t.Fatal("the pages do not end")
		}
		nodes, next, read, err := tr.List(ctx, sel, token, 100, 50)
		if err != nil {
			t.Fatal(err)
		}
		if read > 50 {
			t.Fatalf("call %d read %d nodes, bound 50", calls, read)
		}
		reads += read
		for _, n := range nodes {
			found = append(found, n.Name)
		}
		token = next
	}
	if len(found) != 1 || found[0] != "helper" || calls < total/50 || reads != total {
		t.Fatalf("the bounded pages found %v in %d calls reading %d nodes; want the helper once, %d calls or more, each node read once", found, calls, reads, total/50)
	}
	// With no selector, a page is its size, as before.
	nodes, next, _, err := tr.List(ctx, nil, "", 100, 100)
	if err != nil || len(nodes) != 100 || next != nodes[99].NodeID {
		t.Fatalf("a page of 100 without a selector: %d nodes, next %q, %v", len(nodes), next, err)
	}
}
