package controlplane

import (
	"context"
	"fmt"
	"testing"

	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	"github.com/tetherhq/tether/supervisor/tree"
)

// TestActiveNodesKeepReadsThatRacedOnlyOtherNodes: a read of a node that
// raced the spawns of other nodes is remembered (a busy tree, spawning all
// the time, would otherwise read an agent's node on each of its calls),
// and a read that raced a change of its own node never is — nor one whose
// race can no longer be told, its changes forgotten.
func TestActiveNodesKeepReadsThatRacedOnlyOtherNodes(t *testing.T) {
	st, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	a := newActiveNodes(st)
	if a == nil {
		t.Fatal("no memory of active nodes on Badger")
	}
	t.Cleanup(a.close)
	ctx := context.Background()
	write := func(ids ...string) {
		t.Helper()
		if err := st.Update(ctx, func(tx store.Txn) error {
			for _, id := range ids {
				if err := tx.Put([]byte(tree.NodePrefix+id), []byte("x")); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	remembered := func(id string) bool {
		_, ok, _ := a.lookup(id)
		return ok
	}

	// Read while other nodes were spawned: kept.
	_, _, gen := a.lookup("n_a")
	write("n_b", "n_c")
	a.remember("n_a", "n_root", gen)
	if lineage, ok, _ := a.lookup("n_a"); !ok || lineage != "n_root" {
		t.Fatalf("a read that raced only other nodes' spawns was not kept: %q, %v", lineage, ok)
	}

	// Read while its own node changed: not kept.
	_, _, gen = a.lookup("n_d")
	write("n_e", "n_d", "n_f")
	a.remember("n_d", "n_root", gen)
	if remembered("n_d") {
		t.Fatal("a read that raced a change of its own node was kept")
	}

	// A remembered node that changes is forgotten.
	write("n_a")
	if remembered("n_a") {
		t.Fatal("a changed node is still remembered")
	}

	// Its own change, then so many others that the memory of the changes
	// let it go: the race can no longer be told, and the read is not kept.
	_, _, gen = a.lookup("n_g")
	write("n_g")
	for i := 0; i < maxChangedNodes+100; i += 100 {
		ids := make([]string, 100)
		for j := range ids {
			ids[j] = fmt.Sprintf("n_other%d", i+j)
		}
		write(ids...)
		a.lookup("n_none") // drains
	}
	a.remember("n_g", "n_root", gen)
	if remembered("n_g") {
		t.Fatal("a read from before the forgotten changes was kept")
	}
	if len(a.changed) > maxChangedNodes {
		t.Fatalf("%d changes remembered, past the bound of %d", len(a.changed), maxChangedNodes)
	}
	// A read after them is kept again.
	_, _, gen = a.lookup("n_g")
	write("n_h")
	a.remember("n_g", "n_root", gen)
	if !remembered("n_g") {
		t.Fatal("a read after the forgotten changes was not kept")
	}

	// One batch larger than the bound forgets everything before it.
	_, _, gen = a.lookup("n_i")
	big := make([]string, maxChangedNodes+1)
	for j := range big {
		big[j] = fmt.Sprintf("n_big%d", j)
	}
	big[len(big)-1] = "n_i"
	write(big...)
	a.remember("n_i", "n_root", gen)
	if remembered("n_i") {
		t.Fatal("a read that raced a change of its own node in a batch past the bound was kept")
	}
}
