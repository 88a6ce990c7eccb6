package tree

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/store"
)

// TestRogue38GARecordedClaimerRefusesItsNeverSessionedDescendantOnly:
// NoteAtWorkAfterClaims refuses a never-sessioned node's request once an
// ancestor is terminated with its exit claimed (its record's entry
// written: ErrAncestorRecorded), and only then: not when that ancestor's
// exit was attested by its launcher (not weighed against what it handed
// on), nor when it was terminated unconfirmed (its entry unaccounted
// already), nor for a node that had a session.
func TestRogue38GARecordedClaimerRefusesItsNeverSessionedDescendantOnly(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name        string
		claim, open bool
		launcher    bool
		want        bool
	}{
		{name: "claimed", claim: true, want: true},
		{name: "claimed, its launcher attested too", claim: true, launcher: true},
		{name: "unconfirmed"},
		{name: "claimed, the child sessioned", claim: true, open: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newBadgerTree(t)
			clk := tr.Clock.(interface{ Advance(time.Duration) })
			root, err := tr.RegisterRoot(ctx, "rogue", nil, "test")
			if err != nil {
				t.Fatal(err)
			}
			child, err := tr.Spawn(ctx, root.NodeID, "child", nil, "test", nil)
			if err != nil {
				t.Fatal(err)
			}
			if tc.open {
				if _, _, err := tr.SessionOpened(ctx, child.NodeID); err != nil {
					t.Fatal(err)
				}
			}
			clk.Advance(time.Second)
			if tc.claim {
				if _, err := tr.ConfirmExit(ctx, root.NodeID, "agent:"+root.NodeID, ConfirmedBySelf, "done", nil); err != nil {
					t.Fatal(err)
				}
			}
			if tc.launcher {
				if _, err := tr.ConfirmExit(ctx, root.NodeID, "operator:launcher", ConfirmedByLauncher, "exited 0", nil); err != nil {
					t.Fatal(err)
				}
			}
			// The root's record chunk: terminated.
			if err := tr.Store.Update(ctx, func(tx store.Txn) error {
				n, err := GetNodeIn(tx, root.NodeID)
				if err != nil {
					return err
				}
				n.State = NodeStateTerminated
				return PutNodeIn(tx, n)
			}); err != nil {
				t.Fatal(err)
			}
			clk.Advance(time.Second)
			n, err := tr.Get(ctx, child.NodeID)
			if err != nil {
				t.Fatal(err)
			}
			err = tr.NoteAtWorkAfterClaims(ctx, n, ActivityRequest)
			if got := errors.Is(err, ErrAncestorRecorded); got != tc.want || !got && err != nil {
				t.Fatalf("the child's request after its parent's record: %v, want refused %v", err, tc.want)
			}
			if r, err := tr.Get(ctx, root.NodeID); err != nil || len(r.BelowAfterClaim) != 0 {
				t.Fatalf("the terminated parent noted %+v (%v): its entry is written", r.BelowAfterClaim, err)
			}
		})
	}
}
