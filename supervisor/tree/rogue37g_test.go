package tree

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store/badgerstore"
)

// TestRogue37GANeverSessionedDescendantServedAfterAClaimWeighsAgainstIt:
// a rogue grandparent and parent claim their exits (sessions opened and
// ended first), then work on with the credential of the grandchild, which
// never had a session. NoteAtWorkAfterClaims notes the grandchild on both
// claimers, once each, and their bare claims are not corroborated; a
// sessioned node's requests, a claim made after the activity, and a
// launcher's attestation are left as they were. Before the thirty-seventh
// pass nothing was noted and both claims read corroborated.
func TestRogue37GANeverSessionedDescendantServedAfterAClaimWeighsAgainstIt(t *testing.T) {
	st, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	tr := &Tree{Store: st, Clock: clk, Limits: DefaultLimits}
	must := func(n *Node, err error) *Node {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	root := must(tr.RegisterRoot(ctx, "grandparent", nil, "test"))
	parent := must(tr.Spawn(ctx, root.NodeID, "parent", nil, "test", nil))
	child := must(tr.Spawn(ctx, parent.NodeID, "child", nil, "test", nil))
	late := must(tr.Spawn(ctx, root.NodeID, "late", nil, "test", nil))
	for _, n := range []*Node{root, parent, late} {
		_, sid, err := tr.SessionOpened(ctx, n.NodeID)
		if err != nil {
			t.Fatal(err)
		}
		clk.Advance(time.Second)
		if err := tr.SessionClosed(ctx, n.NodeID, sid); err != nil {
			t.Fatal(err)
		}
	}
	claim := func(n *Node) {
		t.Helper()
		clk.Advance(time.Second)
		if _, err := tr.ConfirmExit(ctx, n.NodeID, "agent:"+n.NodeID, ConfirmedBySelf, "done", nil); err != nil {
			t.Fatal(err)
		}
	}
	serve := func(n *Node) {
		t.Helper()
		clk.Advance(time.Second)
		got, err := tr.Act(ctx, n.NodeID, ActivityRequest, "a read")
		if err != nil {
			t.Fatal(err)
		}
		if err := tr.NoteAtWorkAfterClaims(ctx, got, ActivityRequest); err != nil {
			t.Fatal(err)
		}
	}
	judge := func(n *Node) ExitVerdict {
		t.Helper()
		return JudgeExit(must(tr.Get(ctx, n.NodeID)), func(string) bool { return true }, nil)
	}
	// Served before any claim: nothing to note.
	serve(child)
	claim(root)
	claim(parent)
	if v := judge(parent); !v.Confirmed {
		t.Fatalf("the parent's claim, nothing served after it: %+v", v)
	}
	// The sessioned node at work after the claims notes nothing (its own
	// session's end weighs it).
	serve(late)
	if n := must(tr.Get(ctx, root.NodeID)); len(n.BelowAfterClaim) != 0 {
		t.Fatalf("a sessioned descendant noted on the claimer: %+v", n.BelowAfterClaim)
	}
	serve(child)
	serve(child)
	for _, n := range []*Node{root, parent} {
		got := must(tr.Get(ctx, n.NodeID))
		if len(got.BelowAfterClaim) != 1 || got.BelowAfterClaim[0].NodeID != child.NodeID {
			t.Fatalf("%s noted %+v, want the grandchild once", n.Name, got.BelowAfterClaim)
		}
		v := judge(n)
		if v.Confirmed || !strings.Contains(v.UnaccountedReason, child.NodeID) || !strings.Contains(v.UnaccountedReason, "after this node's claim") {
			t.Fatalf("%s: %+v, want its claim not corroborated, the grandchild named", n.Name, v)
		}
	}
	if v := judge(root); !strings.Contains(v.UnaccountedReason, "its descendant") {
		t.Fatalf("the grandparent's reason %q does not say descendant", v.UnaccountedReason)
	}
	// A launcher watched the parent's process end: not weighed against
	// what it handed on.
	if _, err := tr.ConfirmExit(ctx, parent.NodeID, "operator:launcher", ConfirmedByLauncher, "exited 0", nil); err != nil {
		t.Fatal(err)
	}
	if v := judge(parent); !v.Confirmed {
		t.Fatalf("the parent attested by its launcher: %+v, want confirmed", v)
	}
}
