package controlplane_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue38GAParentsRecordChunkEndsWhatItsNeverSessionedChildIsServed:
// a rogue parent ends its session and claims its exit; its child never
// opened a session. Its operator stops it, the record written one node a
// chunk (a subtree larger than a chunk). Once the parent's chunk has
// committed (its entry written, confirmed by the control plane), the rogue
// reads on with the child's credential. Until the thirty-eighth pass the
// read was served, and the record read the parent CONFIRMED, its life
// after its claim in no entry; now it is refused (FailedPrecondition),
// nothing served after the claim, and the entry stays true.
func TestRogue38GAParentsRecordChunkEndsWhatItsNeverSessionedChildIsServed(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the tests that start a server per case; make test and CI run them.")
	}
	ctx := context.Background()
	clk := clock.NewManual(epoch)
	var mu sync.Mutex
	var hook func(step string, n int)
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) {
		cfg.TerminationChunk = 1
		cfg.TerminationFault = func(step string, n int) {
			mu.Lock()
			h := hook
			mu.Unlock()
			if h != nil {
				h(step, n)
			}
		}
	})
	admin := srv.AdminClients()
	parent := register(t, admin, "rogue")
	self := parent.Node.NodeId
	child := spawn(t, srv.Clients(parent.Credential), self, "child")
	cid := child.Node.NodeId
	asChild := srv.Clients(child.Credential)
	read := func() error {
		_, err := asChild.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: cid}))
		return err
	}
	sess, err := openSession(t, srv.Clients(parent.Credential), self)
	if err != nil {
		t.Fatal(err)
	}
	endSessionStored(t, admin, clk, sess, self)
	clk.Advance(time.Second)
	if _, err := srv.Clients(parent.Credential).Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: self, Reason: "done"})); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Second)
	done := make(chan error, 1)
	mu.Lock()
	hook = func(step string, n int) {
		if step != "record" || n != 1 {
			return
		}
		done <- read()
	}
	mu.Unlock()
	term := terminate(t, admin, self, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, time.Minute, time.Second, time.Second)
	clk.Advance(2 * time.Second)
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	clk.Advance(2 * time.Second)
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, admin, term.TerminationId)
	pn := recordNode(t, rec, self)
	var readErr error
	select {
	case readErr = <-done:
	default:
		t.Fatal("the record's first chunk was never reported")
	}
	if readErr == nil {
		t.Fatalf("the child's read after its claiming parent's record chunk was served; the parent reads %s (confirmed by %q): its life after its claim is in no entry",
			pn.Outcome, pn.ConfirmedBy)
	}
	if connect.CodeOf(readErr) != connect.CodeFailedPrecondition {
		t.Fatalf("the child's read after its parent's record chunk: %v, want FailedPrecondition", readErr)
	}
	if pn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_CONFIRMED {
		t.Fatalf("the parent %s (%s), want confirmed: nothing was served after its claim", pn.Outcome, pn.UnaccountedReason)
	}
	if cn := recordNode(t, rec, cid); cn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED {
		t.Fatalf("the child %s, want unaccounted (nobody confirmed its exit)", cn.Outcome)
	}
}
