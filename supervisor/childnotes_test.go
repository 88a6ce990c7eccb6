package supervisor

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/etcdtest"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	"github.com/tetherhq/tether/internal/store/etcdstore"
	"github.com/tetherhq/tether/supervisor/tree"
)

// etcdMarkTestSupervisor is a supervisor on a fresh etcd keyspace (a
// manual clock), for the tests that count what a mark's chunk reads
// (st.Stats).
func etcdMarkTestSupervisor(t *testing.T) (*Supervisor, *etcdstore.Etcd) {
	t.Helper()
	cluster := etcdtest.Start(t)
	st := etcdtest.OpenStore(t, cluster, func(o *etcdstore.EtcdOptions) { o.Prefix = etcdtest.Prefix(t) })
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	tr := &tree.Tree{Store: st, Clock: clk, Limits: tree.Limits{MaxDepth: 8, MaxChildren: 1000, MaxLabels: 4}}
	return &Supervisor{Store: st, Clock: clk, Tree: tr, Log: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))}, st
}

// TestTheMarkReadsNoChildListOfALeafItsWalkListed: on etcd, a subtree
// spawned through the tree (a root, 10 children, 100 grandchildren) is
// marked in one chunk after the roots'. Its walk lists the children and
// the grandchildren itself, so it has not read their nodes; the entries
// their spawns wrote in their parents' lists say which of them may have
// children, and the walk reads the lists of those alone (the root's and
// the 10 children's), not the 100 empty lists of the leaves. Every node is
// still marked and recorded once.
func TestTheMarkReadsNoChildListOfALeafItsWalkListed(t *testing.T) {
	s, st := etcdMarkTestSupervisor(t)
	ctx, tr, clk := context.Background(), s.Tree, s.Clock

	root, err := tr.RegisterRoot(ctx, "root", nil, "operator:test")
	if err != nil {
		t.Fatal(err)
	}
	all := []string{root.NodeID}
	specs := make([]tree.ChildSpec, 10)
	for i := range specs {
		specs[i] = tree.ChildSpec{Name: "agent"}
	}
	kids, err := tr.SpawnMany(ctx, root.NodeID, specs, "operator:test", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range kids {
		all = append(all, k.NodeID)
		grand, err := tr.SpawnMany(ctx, k.NodeID, specs, "operator:test", nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range grand {
			all = append(all, g.NodeID)
		}
	}

	term, err := s.Terminate(ctx, TerminateRequest{NodeID: root.NodeID, Mode: ModeAbort, Reason: "child notes", RequestedBy: "operator:test"})
	if err != nil {
		t.Fatal(err)
	}
	// The roots' chunk first.
	if err := s.mark(ctx, term.ID, clk.Now()); err != nil {
		t.Fatal(err)
	}
	if stored, err := s.Get(ctx, term.ID); err != nil || stored.Counts.Listed != 1 {
		t.Fatalf("after the roots' chunk: %+v, %v; want the root listed", stored.Counts, err)
	}
	before := st.Stats()
	plan, _, err := s.planMark(ctx, term.ID, nil, s.chunkSize())
	if err != nil {
		t.Fatal(err)
	}
	ranges := st.Stats().Ranges - before.Ranges
	if plan == nil || len(plan.kids) != len(all)-1 {
		t.Fatalf("the walk planned %v, want the %d nodes below the root", plan, len(all)-1)
	}
	// The termination, the index's pack, the root's list and the 10
	// children's lists.
	if want := uint64(2 + 1 + len(kids)); ranges > want {
		t.Errorf("the walk read %d ranges, want at most %d (no list of the %d leaves)", ranges, want, len(all)-1-len(kids))
	}
	term = reconcileToEnd(t, s, term.ID)
	checkRecord(t, s, term, all)
}

// TestAChildNoteThatSaysLeafIsCheckedAgainstTheNode: a node spawned by
// this binary has its entry written as a leaf's; a binary without the
// child notes that spawns its first child notes it on the node
// (HoldsChildren) but leaves the entry. The mark's walk, which skips the
// lists of the nodes it lists whose entries say leaf, must still cover
// that node's children: the chunk finds the node's own note, writes
// nothing, and the walk is done again reading every list. Every node is
// recorded once.
func TestAChildNoteThatSaysLeafIsCheckedAgainstTheNode(t *testing.T) {
	s, st := chunkTestSupervisor(t, badgerstore.BadgerOptions{}, 0)
	ctx := context.Background()
	tr := s.Tree
	root, err := tr.RegisterRoot(ctx, "root", nil, "operator:test")
	if err != nil {
		t.Fatal(err)
	}
	specs := []tree.ChildSpec{{Name: "a"}, {Name: "b"}, {Name: "c"}}
	kids, err := tr.SpawnMany(ctx, root.NodeID, specs, "operator:test", nil)
	if err != nil {
		t.Fatal(err)
	}
	grand, err := tr.SpawnMany(ctx, kids[0].NodeID, specs[:2], "operator:test", nil)
	if err != nil {
		t.Fatal(err)
	}
	all := []string{root.NodeID}
	for _, n := range append(kids, grand...) {
		all = append(all, n.NodeID)
	}
	// The entry as the binary without the notes leaves it: a leaf's.
	leaf := []byte{'l'}
	if tree.ChildMayHaveChildren(leaf) {
		t.Fatal("the test's entry does not say leaf")
	}
	if err := st.Update(ctx, func(tx store.Txn) error { return tx.Put(tree.ChildKey(root.NodeID, kids[0].NodeID), leaf) }); err != nil {
		t.Fatal(err)
	}
	term, err := s.Terminate(ctx, TerminateRequest{NodeID: root.NodeID, Mode: ModeAbort, Reason: "stale note", RequestedBy: "operator:test"})
	if err != nil {
		t.Fatal(err)
	}
	term = reconcileToEnd(t, s, term.ID)
	checkRecord(t, s, term, all)
	if !s.childNotesDistrusted.Load() {
		t.Error("the mark did not notice the stale note")
	}
}
