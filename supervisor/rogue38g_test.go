package supervisor

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/store/badgerstore"
	"github.com/tetherhq/tether/supervisor/tree"
)

// TestRogue38GANeverSessionedChildIsNotServedAfterItsClaimingParentsRecordChunk:
// a rogue parent opens and ends a session and claims its exit; its child
// never opened a session. Its operator stops the parent, the record written
// one node a chunk (a subtree larger than a chunk). Once the parent's
// chunk has committed (the parent terminated, its entry written:
// confirmed by the control plane), the rogue works on with the child's
// credential. Until the thirty-eighth pass that request was served
// (tree.NoteAtWorkAfterClaims skipped the terminated parent: nothing
// noted could reach its written entry), and the record read the parent
// CONFIRMED, the life after its claim put on the child alone. Now it is
// refused (tree.ErrAncestorRecorded): nothing is served to a credential
// the recorded parent was issued, so the entry stays true. Before the
// parent's chunk the request is served and noted, as in the thirty-seventh
// pass. On Badger and on etcd.
func TestRogue38GANeverSessionedChildIsNotServedAfterItsClaimingParentsRecordChunk(t *testing.T) {
	t.Run("badger", func(t *testing.T) {
		s, _ := chunkTestSupervisor(t, badgerstore.BadgerOptions{}, 1)
		rogue38gServedAfterTheParentsChunk(t, s)
	})
	t.Run("etcd", func(t *testing.T) {
		if testing.Short() {
			t.Skip("By design: -short skips the tests that start etcd; make test and CI run them.")
		}
		s, _ := etcdMarkTestSupervisor(t)
		s.ChunkSize = 1
		rogue38gServedAfterTheParentsChunk(t, s)
	})
}

func rogue38gServedAfterTheParentsChunk(t *testing.T, s *Supervisor) {
	ctx, tr, clk := context.Background(), s.Tree, s.Clock.(interface {
		Now() time.Time
		Advance(time.Duration)
	})
	parent, err := tr.RegisterRoot(ctx, "rogue", nil, "operator:test")
	if err != nil {
		t.Fatal(err)
	}
	child, err := tr.Spawn(ctx, parent.NodeID, "child", nil, "agent:"+parent.NodeID, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, sid, err := tr.SessionOpened(ctx, parent.NodeID)
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Second)
	if err := tr.SessionClosed(ctx, parent.NodeID, sid); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Second)
	if _, err := tr.ConfirmExit(ctx, parent.NodeID, "agent:"+parent.NodeID, tree.ConfirmedBySelf, "done", nil); err != nil {
		t.Fatal(err)
	}
	// The child's credential at work, as agentActAs serves a node that
	// never had a session.
	serve := func() error {
		n, err := tr.Act(ctx, child.NodeID, tree.ActivityRequest, "a read")
		if err != nil {
			return err
		}
		return tr.NoteAtWorkAfterClaims(ctx, n, tree.ActivityRequest)
	}
	term, err := s.Terminate(ctx, TerminateRequest{NodeID: parent.NodeID, Mode: ModeAbort, Reason: "rogue38g", RequestedBy: "operator:test",
		CancelAckTimeout: time.Second, ConfirmTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var tried bool
	var servedErr error
	s.ChunkFault = func(step string, n int) {
		if step != "record" || tried {
			return
		}
		p, err := tr.Get(ctx, parent.NodeID)
		if err != nil {
			t.Error(err)
			return
		}
		c, err := tr.Get(ctx, child.NodeID)
		if err != nil {
			t.Error(err)
			return
		}
		if p.State != tree.NodeStateTerminated || c.State == tree.NodeStateTerminated {
			return
		}
		tried = true
		clk.Advance(time.Second)
		servedErr = serve()
	}
	term = reconcileUntilTerminated(t, s, term.ID, 1000, func() { clk.Advance(time.Second) })
	if !tried {
		t.Fatal("the record never committed the parent's chunk before the child's")
	}
	rec := checkRecord(t, s, term, []string{parent.NodeID, child.NodeID})
	var pn RecordNode
	for _, n := range rec.Nodes {
		if n.NodeID == parent.NodeID {
			pn = n
		}
	}
	if servedErr == nil {
		t.Fatalf("the child's request after its parent's record chunk (the parent %v, confirmed by %q) was served: the rogue's life after its claim is in no entry",
			pn.Outcome, pn.ConfirmedBy)
	}
	if !errors.Is(servedErr, tree.ErrAncestorRecorded) {
		t.Fatalf("the child's request after its parent's record chunk: %v, want ErrAncestorRecorded", servedErr)
	}
	// Refused, not a contradiction of the child's own (its exit was never
	// confirmed), and the parent's entry is what the control plane saw.
	if pn.Outcome != NodeOutcomeConfirmed || pn.ConfirmedBy != tree.ConfirmedByControlPlane {
		t.Fatalf("the parent: %v by %q (%s), want confirmed by the control plane (nothing served after its claim)", pn.Outcome, pn.ConfirmedBy, pn.UnaccountedReason)
	}
}
