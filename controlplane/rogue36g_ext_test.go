package controlplane_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue36GAChildThatNeverHadASessionAtWorkReadsUnaccountedItself pins
// what the record says where it cannot tell a rogue parent from its child
// (docs/design.md §11): a rogue parent that never opened a session as its
// child ends its own session, claims its exit and reads on with the
// child's credential, nothing open at the record. The child, at work
// under the stop, reads unaccounted, nobody having confirmed its exit, and
// its reads after the stop are refused once the record is written. The
// parent's claim is shown; since the thirty-seventh pass it is no longer
// corroborated (the child's reads were served after it was stored:
// TestRogue37GAParentWorkingOnAsItsNeverSessionedChildAfterItsClaimIsNotConfirmed).
func TestRogue36GAChildThatNeverHadASessionAtWorkReadsUnaccountedItself(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the tests that start a server per case; make test and CI run them.")
	}
	ctx := context.Background()
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	parent := register(t, admin, "rogue")
	self := parent.Node.NodeId
	child := spawn(t, srv.Clients(parent.Credential), self, "child")
	asChild := srv.Clients(child.Credential)
	cid := child.Node.NodeId

	sess, err := openSession(t, srv.Clients(parent.Credential), self)
	if err != nil {
		t.Fatal(err)
	}
	endSessionStored(t, admin, clk, sess, self)
	clk.Advance(time.Minute)
	term := terminate(t, admin, self, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Minute, time.Second, time.Minute)
	if _, err := srv.Clients(parent.Credential).Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: self, Reason: "done"})); err != nil {
		t.Fatal(err)
	}
	// The rogue, exited by its own word, at work as its child, whose
	// credential never opened a session.
	clk.Advance(time.Second)
	for range 3 {
		if _, err := asChild.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: cid})); err != nil {
			t.Fatal(err)
		}
	}
	clk.Advance(2 * time.Minute)
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	clk.Advance(2 * time.Minute)
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, admin, term.TerminationId)
	rn := recordNode(t, rec, self)
	if rn.ClaimedBy == "" {
		t.Fatalf("record: the parent's claim not shown (confirmed by %q)", rn.ConfirmedBy)
	}
	if rn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED {
		t.Fatalf("record: the parent %s (confirmed by %q), want unaccounted: its child's reads were served after its claim", rn.Outcome, rn.ConfirmedBy)
	}
	cn := recordNode(t, rec, cid)
	if cn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED || !strings.Contains(cn.UnaccountedReason, "nobody confirmed") {
		t.Fatalf("record: the child %s (confirmed by %q, reason %q), want unaccounted, nobody having confirmed its exit",
			cn.Outcome, cn.ConfirmedBy, cn.UnaccountedReason)
	}
	if _, err := asChild.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: cid})); err == nil {
		t.Fatal("the child's credential served a read after its record was written")
	}
}
