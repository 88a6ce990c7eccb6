package supervisor

import (
	"context"
	"testing"

	"github.com/tetherhq/tether/internal/etcdtest"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/etcdstore"
	"github.com/tetherhq/tether/supervisor/tree"
)

// TestTheRecordChecksTheNodesTheMarkKeptAtItsCommit: on etcd, a node kept
// as the mark wrote it and not changed since is taken without a read (its
// value checked at the commit); one that changed after the mark (its exit
// confirmed) while the kept value is stale — the watch that would carry
// the change is not running — must not be terminated from the stale
// value: the commit's check fails, and the next attempt reads the node
// and keeps the confirmation.
func TestTheRecordChecksTheNodesTheMarkKeptAtItsCommit(t *testing.T) {
	cluster := etcdtest.Start(t)
	st := etcdtest.OpenStore(t, cluster, func(o *etcdstore.EtcdOptions) { o.Prefix = etcdtest.Prefix(t) })
	ctx := context.Background()
	marked := func(id string) *tree.Node {
		return &tree.Node{NodeID: id, Name: id, State: tree.NodeStateAborting, TerminationID: "t_1", Holds: tree.HoldsTracked}
	}
	same, changed := marked("n_same"), marked("n_changed")
	if err := st.Update(ctx, func(tx store.Txn) error {
		if err := tree.PutNodeIn(tx, same); err != nil {
			return err
		}
		return tree.PutNodeIn(tx, changed)
	}); err != nil {
		t.Fatal(err)
	}
	var c nodeCache
	c.reset(nil)
	c.keep([]*tree.Node{same, changed})
	confirmed := *changed
	confirmed.ExitConfirmedBy = "agent"
	if err := st.Update(ctx, func(tx store.Txn) error { return tree.PutNodeIn(tx, &confirmed) }); err != nil {
		t.Fatal(err)
	}

	terminate := func(id string) (*tree.Node, int, uint64) {
		t.Helper()
		before := st.Stats()
		attempts := 0
		var got *tree.Node
		if err := st.Update(ctx, func(tx store.Txn) error {
			attempts++
			nodes, err := c.nodesIn(tx, []string{id}, attempts == 1)
			if err != nil {
				return err
			}
			got = nodes[id]
			got.State = tree.NodeStateTerminated
			return tree.PutNodeIn(tx, got)
		}); err != nil {
			t.Fatal(err)
		}
		return got, attempts, st.Stats().Ranges - before.Ranges
	}
	if got, attempts, ranges := terminate(same.NodeID); attempts != 1 || ranges != 0 || got.Name != same.Name {
		t.Errorf("a node unchanged since the mark took %d attempts and %d ranges (%+v); want 1 and none", attempts, ranges, got)
	}
	got, attempts, _ := terminate(changed.NodeID)
	if got.ExitConfirmedBy != "agent" {
		t.Errorf("a node confirmed after the mark was terminated from the value the mark wrote: %+v", got)
	}
	if attempts != 2 {
		t.Errorf("terminating a node changed after the mark took %d attempts, want 2 (the stale value's check fails the first)", attempts)
	}
	var stored *tree.Node
	if err := st.View(ctx, func(tx store.ReadTxn) error {
		var err error
		stored, err = tree.GetNodeIn(tx, changed.NodeID)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if stored.ExitConfirmedBy != "agent" || stored.State != tree.NodeStateTerminated {
		t.Errorf("stored after the record: %+v; want terminated with its confirmation", stored)
	}
}

// TestTheRecordChecksAKeptNodeByTheRevisionItsWatchDelivered: on etcd, a
// kept node whose write the watch delivered is checked at the record's
// commit by that write's revision, not by its value: unchanged since, it
// is taken without a read in one attempt; rewritten since (here with the
// very same value, a write the kept state has not seen), the check fails
// and the next attempt reads it. A value compared by its bytes would have
// passed.
func TestTheRecordChecksAKeptNodeByTheRevisionItsWatchDelivered(t *testing.T) {
	cluster := etcdtest.Start(t)
	st := etcdtest.OpenStore(t, cluster, func(o *etcdstore.EtcdOptions) { o.Prefix = etcdtest.Prefix(t) })
	ctx := t.Context()
	w, err := st.Watch(ctx, []byte(tree.NodePrefix))
	if err != nil {
		t.Fatal(err)
	}
	marked := func(id string) *tree.Node {
		return &tree.Node{NodeID: id, Name: id, State: tree.NodeStateAborting, TerminationID: "t_1", Holds: tree.HoldsTracked}
	}
	same, rewritten := marked("n_same"), marked("n_rewritten")
	if err := st.Update(ctx, func(tx store.Txn) error {
		if err := tree.PutNodeIn(tx, same); err != nil {
			return err
		}
		return tree.PutNodeIn(tx, rewritten)
	}); err != nil {
		t.Fatal(err)
	}
	var c nodeCache
	c.reset(nil)
	c.keep([]*tree.Node{same, rewritten})
	for seen := 0; seen < 2; {
		batch := <-w.Events()
		c.apply(batch)
		seen += len(batch)
	}
	for _, id := range []string{same.NodeID, rewritten.NodeID} {
		if k, _ := c.value(id); k.rev == 0 {
			t.Fatalf("node %s kept without the revision its watch delivered", id)
		}
	}
	if err := st.Update(ctx, func(tx store.Txn) error { return tree.PutNodeIn(tx, rewritten) }); err != nil {
		t.Fatal(err)
	}

	terminate := func(id string) (int, uint64, uint64) {
		t.Helper()
		before := st.Stats()
		attempts := 0
		if err := st.Update(ctx, func(tx store.Txn) error {
			attempts++
			nodes, err := c.nodesIn(tx, []string{id}, attempts == 1)
			if err != nil {
				return err
			}
			n := nodes[id]
			n.State = tree.NodeStateTerminated
			return tree.PutNodeIn(tx, n)
		}); err != nil {
			t.Fatal(err)
		}
		after := st.Stats()
		return attempts, after.Ranges - before.Ranges, after.Compares - before.Compares
	}
	if attempts, ranges, compares := terminate(same.NodeID); attempts != 1 || ranges != 0 || compares != 1 {
		t.Errorf("a node unchanged since the write its watch delivered took %d attempts, %d ranges, %d comparisons; want 1, none, 1", attempts, ranges, compares)
	}
	if attempts, _, _ := terminate(rewritten.NodeID); attempts != 2 {
		t.Errorf("a node rewritten since the write its watch delivered took %d attempts, want 2 (its revision's check fails the first)", attempts)
	}
}

// TestAKeptNodeTakesTheRevisionOfAWriteDeliveredBeforeItsCommitReturned:
// the watch may deliver a mark's writes before its Update returns; the
// nodes the chunk planned to write are awaited, so their values are kept
// with the revision the watch delivered, not by value without it; a
// planned node the chunk did not write is not kept.
func TestAKeptNodeTakesTheRevisionOfAWriteDeliveredBeforeItsCommitReturned(t *testing.T) {
	cluster := etcdtest.Start(t)
	st := etcdtest.OpenStore(t, cluster, func(o *etcdstore.EtcdOptions) { o.Prefix = etcdtest.Prefix(t) })
	ctx := t.Context()
	w, err := st.Watch(ctx, []byte(tree.NodePrefix))
	if err != nil {
		t.Fatal(err)
	}
	var c nodeCache
	c.reset(nil)
	root := &tree.Node{NodeID: "n_root", State: tree.NodeStateAborting, TerminationID: "t_1"}
	c.keep([]*tree.Node{root}) // the roots' chunk: the cache is in use from here on
	n := &tree.Node{NodeID: "n_1", Name: "n_1", State: tree.NodeStateAborting, TerminationID: "t_1", Holds: tree.HoldsTracked}
	planned := []string{"n_1", "n_unwritten"}
	c.await(planned)
	if err := st.Update(ctx, func(tx store.Txn) error { return tree.PutNodeIn(tx, n) }); err != nil {
		t.Fatal(err)
	}
	c.apply(<-w.Events()) // the event first, then the commit's keep
	c.keep([]*tree.Node{n})
	c.settle(planned)
	if k, ok := c.value("n_1"); !ok || k.rev == 0 {
		t.Errorf("a node whose write the watch delivered before its commit returned is kept as %+v, %v; want its value and revision", k, ok)
	}
	if _, ok := c.nodes["n_unwritten"]; ok {
		t.Errorf("a planned node the chunk did not write is still kept")
	}
}
