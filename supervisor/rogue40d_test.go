package supervisor

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/tetherhq/tether/internal/store/badgerstore"
	"github.com/tetherhq/tether/supervisor/tree"
)

// rogue40dTree registers a rogue root R with a child A and a grandchild G
// under A, on a supervisor whose mark writes chunk nodes a pass.
func rogue40dTree(t *testing.T, chunk int) (s *Supervisor, rogue, root, a, g string) {
	t.Helper()
	s, _ = chunkTestSupervisor(t, badgerstore.BadgerOptions{}, chunk)
	ctx := context.Background()
	r, err := s.Tree.RegisterRoot(ctx, "rogue", nil, "operator:test")
	if err != nil {
		t.Fatal(err)
	}
	rogue = "agent:" + r.NodeID
	an, err := s.Tree.Spawn(ctx, r.NodeID, "a", nil, rogue, nil)
	if err != nil {
		t.Fatal(err)
	}
	gn, err := s.Tree.Spawn(ctx, an.NodeID, "g", nil, "agent:"+an.NodeID, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s, rogue, r.NodeID, an.NodeID, gn.NodeID
}

// rogue40dStop is the rogue's own stop of node, with a day's windows.
func rogue40dStop(s *Supervisor, rogue, root, node string, mode Mode) (Termination, error) {
	return s.Terminate(context.Background(), TerminateRequest{NodeID: node, Mode: mode, Reason: "rogue40d",
		DrainWindow: MaxTerminationWindow, CancelAckTimeout: MaxTerminationWindow, ConfirmTimeout: MaxTerminationWindow,
		RequestedBy: rogue, RequesterNodeID: root})
}

// TestRogue40DOwnRepeatBeforeTheMarkIsRefused: since the sixteenth pass an
// agent's own repeat of its stop that does not escalate (a drain over its
// own drain) is refused, naming the earlier termination: it stops nothing
// more, and each repeat was a new termination marking the whole subtree
// again for one request of the agent's budget. But the refusal read only
// the target's state, so it held only once the mark had reached the
// target: between the request and the mark (the reconciler's queue, its
// other trees' turns) the target reads running, and the rogue's repeats of
// the same drain, and its drains of any node inside the subtree, were each
// accepted — as many terminations, each marking (and taking over) the
// subtree again. Now a node covered by the agent's own unfinished stop,
// requested on it or above it, is refused as a marked one is.
func TestRogue40DOwnRepeatBeforeTheMarkIsRefused(t *testing.T) {
	s, rogue, root, a, g := rogue40dTree(t, 100)
	first, err := rogue40dStop(s, rogue, root, a, ModeDrain)
	if err != nil {
		t.Fatal(err)
	}
	const repeats = 8
	accepted := 0
	for range repeats {
		for _, node := range []string{a, g} {
			_, err := rogue40dStop(s, rogue, root, node, ModeDrain)
			switch {
			case err == nil:
				accepted++
			case !errors.Is(err, ErrAlreadyStopping):
				t.Fatalf("the rogue's repeated drain of %s: %v, want ErrAlreadyStopping", node, err)
			case !strings.Contains(err.Error(), first.ID):
				t.Errorf("the refusal %q does not name the rogue's earlier termination %s", err, first.ID)
			}
		}
	}
	if accepted != 0 {
		t.Errorf("%d of the rogue's %d repeated drains of its own stop's subtree were accepted before the mark (each a new termination marking it again), want none", accepted, 2*repeats)
	}
	// The mark is not held up by them: the first stop marks both nodes.
	if _, err := s.Reconcile(context.Background(), first.ID); err != nil {
		t.Fatal(err)
	}
	for _, node := range []string{a, g} {
		n, err := s.Tree.Get(context.Background(), node)
		if err != nil {
			t.Fatal(err)
		}
		if n.State != tree.NodeStateDraining || n.TerminationID != first.ID {
			t.Errorf("node %s is %s under %q after the first stop's mark, want draining under %s", node, tree.StateName(n.State), n.TerminationID, first.ID)
		}
	}
}

// TestRogue40DOwnRepeatDuringTheMarkIsRefused: the mark walks the subtree
// a chunk a pass; a node it has not reached yet, below one it marked,
// read running, and the rogue's drain of it was accepted, a new
// termination marking that node's subtree again. Now it is refused as a
// marked node's is; the rogue's abort still escalates its drain there,
// once.
func TestRogue40DOwnRepeatDuringTheMarkIsRefused(t *testing.T) {
	s, rogue, root, a, g := rogue40dTree(t, 1)
	ctx := context.Background()
	first, err := rogue40dStop(s, rogue, root, a, ModeDrain)
	if err != nil {
		t.Fatal(err)
	}
	// The roots' chunk: A is marked, G is not yet.
	if err := s.mark(ctx, first.ID, s.Clock.Now()); err != nil {
		t.Fatal(err)
	}
	gn, err := s.Tree.Get(ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	if gn.State != tree.NodeStateRunning {
		t.Fatalf("G is %s after the roots' chunk, want running (not reached yet)", tree.StateName(gn.State))
	}
	accepted := 0
	for range 8 {
		if _, err := rogue40dStop(s, rogue, root, g, ModeDrain); err == nil {
			accepted++
		} else if !errors.Is(err, ErrAlreadyStopping) || !strings.Contains(err.Error(), first.ID) {
			t.Fatalf("the rogue's drain of G below its draining A: %v, want ErrAlreadyStopping naming %s", err, first.ID)
		}
	}
	if accepted != 0 {
		t.Errorf("%d of the rogue's 8 drains of G, below its own draining A and not reached by the mark, were accepted, want none", accepted)
	}
	// An abort escalates the drain there, once.
	abort, err := rogue40dStop(s, rogue, root, g, ModeAbort)
	if err != nil {
		t.Fatalf("the rogue's abort of G below its drain: %v, want it accepted (it escalates)", err)
	}
	_, err = rogue40dStop(s, rogue, root, g, ModeAbort)
	if !errors.Is(err, ErrAlreadyStopping) || !strings.Contains(err.Error(), abort.ID) {
		t.Errorf("the rogue's second abort of G before its first's mark: %v, want ErrAlreadyStopping naming %s", err, abort.ID)
	}
}
