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
	c.reset()
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
