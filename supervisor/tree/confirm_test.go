package tree

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
)

// TestAnAgentsWordAfterTheRecordIsRefused: once a node is terminated (its
// record written in the same transaction), an ancestor agent's
// confirmation of its exit is refused ErrNodeRecorded and leaves the node
// as it was; before, it is kept; a launcher's late attestation is kept.
func TestAnAgentsWordAfterTheRecordIsRefused(t *testing.T) {
	ctx := context.Background()
	tr := newBadgerTree(t)
	root, err := tr.RegisterRoot(ctx, "root", nil, "test")
	if err != nil {
		t.Fatal(err)
	}
	var kids []*Node
	for _, name := range []string{"a", "b"} {
		n, err := tr.Spawn(ctx, root.NodeID, name, nil, "test", nil)
		if err != nil {
			t.Fatal(err)
		}
		kids = append(kids, n)
	}
	if _, err := tr.ConfirmExit(ctx, kids[0].NodeID, "agent:"+root.NodeID, ConfirmedByAncestor, "gone", nil); err != nil {
		t.Fatalf("the ancestor's word before any record: %v", err)
	}
	if err := tr.Store.Update(ctx, func(tx store.Txn) error {
		n, err := GetNodeIn(tx, kids[1].NodeID)
		if err != nil {
			return err
		}
		n.State, n.TerminationID = NodeStateTerminated, "t_1"
		return PutNodeIn(tx, n)
	}); err != nil {
		t.Fatal(err)
	}
	_, err = tr.ConfirmExit(ctx, kids[1].NodeID, "agent:"+root.NodeID, ConfirmedByAncestor, "gone", nil)
	if !errors.Is(err, ErrNodeRecorded) {
		t.Fatalf("the ancestor's word after the record: %v, want ErrNodeRecorded", err)
	}
	n, err := tr.Get(ctx, kids[1].NodeID)
	if err != nil {
		t.Fatal(err)
	}
	if len(n.ExitConfirmations) != 0 || n.ExitConfirmedBy != "" || !n.ExitedAt.IsZero() {
		t.Fatalf("the refused word changed the node: %+v", n)
	}
	if n, err = tr.ConfirmExit(ctx, kids[1].NodeID, "operator:launcher", ConfirmedByLauncher, "process gone", nil); err != nil || len(n.ExitConfirmations) != 1 {
		t.Fatalf("the launcher's late attestation: %v, %+v", err, n)
	}
}

// newBadgerTree is a Tree on a Badger store of its own in a temporary
// directory (closed with the test), on a manual clock at 2026-01-01, with
// the default limits.
func newBadgerTree(t *testing.T) *Tree {
	t.Helper()
	st, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return &Tree{Store: st, Clock: clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)), Limits: DefaultLimits}
}
