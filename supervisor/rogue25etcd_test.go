package supervisor

import (
	"context"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/tree"
)

// spawnTen spawns a root, 10 children and 100 grandchildren through the
// tree and returns every node id, the root's first.
func spawnTen(t *testing.T, tr *tree.Tree) []string {
	t.Helper()
	ctx := context.Background()
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
	return all
}

// deliverNodes applies the watch's node events to s's cache, as the
// reconcile loop does, until every node of ids was delivered in its
// latest write (the spawns commit in turn, a parent's note with its
// children, and a watch delivers in commit order).
func deliverNodes(t *testing.T, s *Supervisor, w store.Watcher, ids []string) {
	t.Helper()
	seen := map[string]bool{}
	guard := time.NewTimer(time.Minute) // against a hang only
	defer guard.Stop()
	for len(seen) < len(ids) {
		var batch []store.Event
		var ok bool
		select {
		case batch, ok = <-w.Events():
		case <-guard.C:
			t.Fatalf("the node watch delivered %d of the %d nodes written", len(seen), len(ids))
		}
		if !ok {
			t.Fatal("the node watch ended")
		}
		s.nodes.apply(batch)
		for _, ev := range batch {
			seen[string(ev.Key[len(tree.NodePrefix):])] = true
		}
	}
}

// TestTheMarkTakesTheNodesItsWatchDeliveredWithoutReadingThem: on etcd,
// the mark read every node of a chunk (a range each, 110 for a chunk of a
// 111-node subtree) though the reconciler's watch of the tree had
// delivered each node's latest write, with its revision. It now takes a
// node the watch delivered as delivered and checks its revision at the
// commit (store.RevisionExpecter), as the record does with the nodes the
// mark wrote: the chunk reads none of the nodes, commits in one attempt,
// and every node is still marked and recorded once.
func TestTheMarkTakesTheNodesItsWatchDeliveredWithoutReadingThem(t *testing.T) {
	s, st := etcdMarkTestSupervisor(t)
	ctx, clk := context.Background(), s.Clock
	w, err := st.Watch(t.Context(), []byte(tree.NodePrefix))
	if err != nil {
		t.Fatal(err)
	}
	s.nodes.reset(st)
	all := spawnTen(t, s.Tree)
	deliverNodes(t, s, w, all)

	term, err := s.Terminate(ctx, TerminateRequest{NodeID: all[0], Mode: ModeAbort, Reason: "watched nodes", RequestedBy: "operator:test"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.mark(ctx, term.ID, clk.Now()); err != nil { // the roots' chunk
		t.Fatal(err)
	}
	before := st.Stats()
	if err := s.mark(ctx, term.ID, clk.Now()); err != nil { // the other 110 nodes
		t.Fatal(err)
	}
	after := st.Stats()
	ranges, attempts := after.Ranges-before.Ranges, after.Attempts-before.Attempts
	// The walk's (the termination, the index's pack, the root's list and
	// the 10 children's lists) and the chunk's termination: none of the
	// 110 nodes.
	if want := uint64(2 + 1 + 10 + 1); ranges > want || attempts != 1 {
		t.Errorf("the chunk of 110 nodes the watch delivered read %d ranges in %d attempts; want at most %d in one (no node read)", ranges, attempts, want)
	}
	if stored, err := s.Get(ctx, term.ID); err != nil || stored.Counts.Listed != len(all) || stored.Counts.Members != len(all) {
		t.Fatalf("after the mark: %+v, %v; want %d nodes listed and members", stored.Counts, err, len(all))
	}
	term = reconcileToEnd(t, s, term.ID)
	checkRecord(t, s, term, all)
}

// TestTheMarkReadsANodeWrittenSinceItsWatchDeliveredIt: a node written
// after the write the watch delivered (its event not applied yet) must
// not be marked from the stale value: the chunk's check of its revision
// fails at the commit, the next attempt reads every node, and the write
// the watch had not delivered (a label) survives the mark.
func TestTheMarkReadsANodeWrittenSinceItsWatchDeliveredIt(t *testing.T) {
	s, st := etcdMarkTestSupervisor(t)
	ctx, clk := context.Background(), s.Clock
	w, err := st.Watch(t.Context(), []byte(tree.NodePrefix))
	if err != nil {
		t.Fatal(err)
	}
	s.nodes.reset(st)
	all := spawnTen(t, s.Tree)
	deliverNodes(t, s, w, all)
	stale := all[len(all)-1]
	if err := st.Update(ctx, func(tx store.Txn) error {
		n, err := tree.GetNodeIn(tx, stale)
		if err != nil {
			return err
		}
		n.Labels = map[string]string{"written": "after-the-watch"}
		return tree.PutNodeIn(tx, n)
	}); err != nil {
		t.Fatal(err)
	}

	term, err := s.Terminate(ctx, TerminateRequest{NodeID: all[0], Mode: ModeAbort, Reason: "stale watched node", RequestedBy: "operator:test"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.mark(ctx, term.ID, clk.Now()); err != nil {
		t.Fatal(err)
	}
	before := st.Stats()
	if err := s.mark(ctx, term.ID, clk.Now()); err != nil {
		t.Fatal(err)
	}
	if attempts := st.Stats().Attempts - before.Attempts; attempts != 2 {
		t.Errorf("the chunk took %d attempts; want 2 (the stale node's check fails the first)", attempts)
	}
	n, err := s.Tree.Get(ctx, stale)
	if err != nil {
		t.Fatal(err)
	}
	if n.State == tree.NodeStateRunning || n.TerminationID != term.ID || n.Labels["written"] != "after-the-watch" {
		t.Errorf("the node written after its watch's event: state %v, termination %q, labels %v; want it marked by %s with the later write's label", n.State, n.TerminationID, n.Labels, term.ID)
	}
	term = reconcileToEnd(t, s, term.ID)
	checkRecord(t, s, term, all)
}
