package tree

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
)

// A node this binary creates notes what it may hold from its first holding
// of each kind (written once), and a node stored before the notes (no
// HoldsTracked) is left alone and may hold anything.
func TestNodesNoteWhatTheyMayHold(t *testing.T) {
	st, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	tr := &Tree{Store: st, Clock: clock.NewManual(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)), Limits: DefaultLimits}
	root, err := tr.RegisterRoot(ctx, "root", nil, "operator:alice")
	if err != nil {
		t.Fatal(err)
	}
	child, err := tr.Spawn(ctx, root.NodeID, "child", nil, "operator:alice", nil)
	if err != nil {
		t.Fatal(err)
	}
	if root.Holds != HoldsTracked || child.Holds != HoldsTracked {
		t.Fatalf("new nodes note %b and %b, want %b", root.Holds, child.Holds, HoldsTracked)
	}
	if child.Holds.May(HoldsGrants) || child.Holds.May(HoldsPrivileges) || child.Holds.May(HoldsCalls) {
		t.Fatal("a new node may hold something before it is given anything")
	}
	if err := st.View(ctx, func(tx store.ReadTxn) error {
		parent, err := GetNodeIn(tx, root.NodeID)
		if err == nil && parent.Holds != HoldsTracked|HoldsChildren {
			t.Errorf("the parent of a spawned child notes %b, want %b", parent.Holds, HoldsTracked|HoldsChildren)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	legacy := &Node{NodeID: "n_legacy", Name: "older", State: NodeStateRunning}
	if err := st.Update(ctx, func(tx store.Txn) error { return PutNodeIn(tx, legacy) }); err != nil {
		t.Fatal(err)
	}
	writes := 0
	note := func(nodeID string, kind Holdings) Holdings {
		t.Helper()
		var got Holdings
		if err := st.Update(ctx, func(tx store.Txn) error {
			before, err := GetNodeIn(tx, nodeID)
			if err != nil {
				return err
			}
			n := *before
			if err := NoteHoldingIn(tx, &n, kind); err != nil {
				return err
			}
			after, err := GetNodeIn(tx, nodeID)
			if err != nil {
				return err
			}
			if after.Holds != before.Holds {
				writes++
			}
			got = after.Holds
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := note(child.NodeID, HoldsGrants); got != HoldsTracked|HoldsGrants {
		t.Fatalf("after a grant: %b", got)
	}
	if got := note(child.NodeID, HoldsGrants); got != HoldsTracked|HoldsGrants || writes != 1 {
		t.Fatalf("after a second grant: %b, %d writes", got, writes)
	}
	if got := note(child.NodeID, HoldsCalls); got != HoldsTracked|HoldsGrants|HoldsCalls || !got.May(HoldsCalls) || got.May(HoldsPrivileges) {
		t.Fatalf("after a call: %b", got)
	}
	if got := note(legacy.NodeID, HoldsGrants); got != 0 || !got.May(HoldsGrants) || !got.May(HoldsPrivileges) || !got.May(HoldsCalls) {
		t.Fatalf("a node stored before the notes: %b, and it must be taken to hold anything", got)
	}
}
