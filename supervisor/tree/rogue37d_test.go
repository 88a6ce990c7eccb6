package tree

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// TestRogue37DSubtreePagesWalkTheSubtreeOnceEach: a rogue's subtree of
// four levels (its children, some with children of their own, one with
// grandchildren), next to a sibling's. Its pages, of every size from 1 to
// 7 and with a read bound of 3, list each node of the subtree once, depth
// first with children in id order, never the sibling's; a page reads at
// most its bound (plus the root and the token's node); a selector answers
// only the matches; a token outside the subtree is refused. Subtree (the
// whole listing) lists the same nodes.
func TestRogue37DSubtreePagesWalkTheSubtreeOnceEach(t *testing.T) {
	ctx := context.Background()
	tr := newBadgerTree(t)
	root, err := tr.RegisterRoot(ctx, "planner", nil, "test")
	if err != nil {
		t.Fatal(err)
	}
	spawn := func(parent, name string, labels map[string]string) *Node {
		t.Helper()
		n, err := tr.Spawn(ctx, parent, name, labels, "test", nil)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	sibling := spawn(root.NodeID, "worker", nil)
	spawn(sibling.NodeID, "worker-child", nil)
	rogue := spawn(root.NodeID, "rogue", nil)
	for i := range 6 {
		c := spawn(rogue.NodeID, fmt.Sprintf("c%d", i), map[string]string{"role": fmt.Sprint(i % 2)})
		for j := range i % 3 {
			g := spawn(c.NodeID, fmt.Sprintf("c%d-g%d", i, j), map[string]string{"role": "1"})
			if i == 4 {
				for k := range 2 {
					spawn(g.NodeID, fmt.Sprintf("c%d-g%d-h%d", i, j, k), nil)
				}
			}
		}
	}
	whole, err := tr.Subtree(ctx, rogue.NodeID)
	if err != nil {
		t.Fatal(err)
	}

	// The depth-first order, children in id order, from the whole.
	kids := map[string][]*Node{}
	for _, n := range whole[1:] {
		kids[n.ParentNodeID] = append(kids[n.ParentNodeID], n)
	}
	var want []string
	var walk func(n *Node)
	walk = func(n *Node) {
		want = append(want, n.NodeID)
		ks := kids[n.NodeID]
		slices.SortFunc(ks, func(a, b *Node) int { return strings.Compare(a.NodeID, b.NodeID) })
		for _, k := range ks {
			walk(k)
		}
	}
	walk(whole[0])

	pages := func(sel map[string]string, size, bound int) []string {
		t.Helper()
		var got []string
		calls := 0
		for token := ""; calls == 0 || token != ""; calls++ {
			if calls > 2*len(whole)+1 {
				t.Fatal("the pages do not end")
			}
			nodes, next, read, err := tr.SubtreePage(ctx, rogue.NodeID, sel, token, size, bound)
			if err != nil {
				t.Fatal(err)
			}
			if len(nodes) > size || read > bound+2 {
				t.Fatalf("a page of size %d, bound %d, answered %d nodes and read %d", size, bound, len(nodes), read)
			}
			for _, n := range nodes {
				got = append(got, n.NodeID)
			}
			token = next
		}
		return got
	}
	for size := 1; size <= 7; size++ {
		for _, bound := range []int{3, 1000} {
			if got := pages(nil, size, bound); !slices.Equal(got, want) {
				t.Fatalf("pages of %d (bound %d) list %d nodes %v, want the subtree's %d depth first %v", size, bound, len(got), got, len(want), want)
			}
		}
	}
	var matches []string
	for _, id := range want {
		n, _ := tr.Get(ctx, id)
		if n.Labels["role"] == "1" {
			matches = append(matches, id)
		}
	}
	if got := pages(map[string]string{"role": "1"}, 2, 3); !slices.Equal(got, matches) {
		t.Fatalf("the selector's pages list %v, want %v", got, matches)
	}
	for _, token := range []string{sibling.NodeID, root.NodeID, "n_00000000000000000000"} {
		if _, _, _, err := tr.SubtreePage(ctx, rogue.NodeID, nil, token, 10, 10); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("a page after %s: %v, want invalid argument", token, err)
		}
	}
}

// TestRogue37DANameCannotHoldAnotherNodesID: a name shaped like an id was
// refused, but one that held an id beside a word of its own was not: a
// rogue named its child "<the planner's id>-helper", which `tether agent
// tree` prints as "n_…-helper (n_child) [running]" and a browser selects,
// double-clicked in the console's tree, as the planner's id alone (a
// hyphen ends a word), so an operator who copied it into `tether agent
// terminate` stopped the planner's tree instead of the rogue's child. A
// name now holds no id between its dots and hyphens; names that merely
// begin like one stay allowed.
func TestRogue37DANameCannotHoldAnotherNodesID(t *testing.T) {
	ctx := context.Background()
	tr := newBadgerTree(t)
	planner, err := tr.RegisterRoot(ctx, "planner", nil, "test")
	if err != nil {
		t.Fatal(err)
	}
	rogue, err := tr.Spawn(ctx, planner.NodeID, "rogue", nil, "test", nil)
	if err != nil {
		t.Fatal(err)
	}
	p := planner.NodeID
	for _, name := range []string{p + "-helper", p + ".x", "helper-" + p, "a." + p + ".b", "x-g_00000000000000000000", "t_00000000000000000000-old"} {
		if _, err := tr.Spawn(ctx, rogue.NodeID, name, nil, "test", nil); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "id") {
			t.Fatalf("a child named %q: %v, want invalid argument naming the id", name, err)
		}
	}
	for _, name := range []string{"n_helper", "worker-1", "n_0000000000000000000-x", "x" + p, p[2:] + "-x"} {
		if _, err := tr.Spawn(ctx, rogue.NodeID, name, nil, "test", nil); err != nil {
			t.Fatalf("a child named %q: %v, want it spawned", name, err)
		}
	}
}
