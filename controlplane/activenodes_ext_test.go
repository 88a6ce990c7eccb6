package controlplane_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The server remembers the agents that may act, so that an agent's unary
// calls (a renew, above all) do not read its node each time. The rogue
// agent keeps calling while it is being stopped, hoping the memory lags
// behind the store.

// TestARogueRacingItsTerminationIsRefusedOnTheVeryNextCall: the holder
// renews its lease over unary calls in a closed loop, as fast as it can,
// while its termination runs to the end. From the moment an operator can
// read the node as terminated, every call the holder starts is refused as
// unauthenticated (its credential's node is terminated): no renew is
// accepted, and none is even judged, after the termination is visible.
func TestARogueRacingItsTerminationIsRefusedOnTheVeryNextCall(t *testing.T) {
	w := newLeaseWorld(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	l := w.offer(t, w.job(), w.w1, 10*time.Minute)
	l, _ = unary{w.w1C}.send(t, ack(l))
	for seq := uint64(1); seq <= 3; seq++ { // the server now remembers w1
		unary{w.w1C}.send(t, renew(l, seq))
	}

	var terminated atomic.Bool // the operator read the node as terminated
	type afterward struct {
		err      error
		accepted bool
	}
	rogue := make(chan afterward, 1)
	var calls atomic.Int64
	go func() {
		for seq := uint64(4); ctx.Err() == nil; seq++ {
			seen := terminated.Load() // before the call starts
			resp, err := w.w1C.Lease.Renew(ctx, connect.NewRequest(renew(l, seq).GetRenew()))
			calls.Add(1)
			if seen {
				rogue <- afterward{err: err, accepted: err == nil && resp.Msg.Decision.GetOutcome() == tetherv1.Outcome_OUTCOME_ACCEPTED}
				return
			}
		}
	}()
	// The rogue calls before, during and after the termination.
	testserver.WaitFor(t, 20*time.Second, "the rogue's first calls", func() bool { return calls.Load() >= 3 })
	term := terminate(t, w.admin, w.w1, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, time.Second, time.Second, 0)
	w.clock.Advance(2 * time.Second) // past the drain window and the cancel-ack timeout
	testserver.WaitFor(t, 20*time.Second, "the node to be terminated", func() bool {
		return getNode(t, w.admin, w.w1).State == tetherv1.NodeState_NODE_STATE_TERMINATED
	})
	terminated.Store(true)
	got := <-rogue
	if got.accepted || connect.CodeOf(got.err) != connect.CodeUnauthenticated {
		t.Fatalf("the rogue's first renew after its termination was visible: accepted %v, err %v; want unauthenticated", got.accepted, got.err)
	}
	// The record's chunks mark its nodes terminated; the header that ends
	// the termination comes last, so the node can be seen terminated while
	// its termination is still reconciling, never before.
	switch st := getTermination(t, w.admin, term.TerminationId).State; st {
	case tetherv1.TerminationState_TERMINATION_STATE_RECONCILING, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED:
	default:
		t.Fatalf("the node is terminated while its termination is %v", st)
	}
	testserver.WaitFor(t, 20*time.Second, "the termination to end", func() bool {
		return getTermination(t, w.admin, term.TerminationId).State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	// And every call after it.
	if _, err := w.w1C.Lease.Renew(ctx, connect.NewRequest(renew(l, 1000).GetRenew())); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("a later renew: %v, want unauthenticated", err)
	}
}

// TestANodeStoppedBetweenTwoCallsIsRefusedOnTheNextOne: a worker the
// server remembers as active is stopped between two of its calls — its
// exit confirmed by itself, or its node marked terminated by a write
// straight to the store, as when its parent process died — and its very
// next unary call is refused (failed_precondition for the exit, kept as a
// contradiction each time; unauthenticated for the terminated node), while
// a sibling the server also remembers goes on working.
func TestANodeStoppedBetweenTwoCallsIsRefusedOnTheNextOne(t *testing.T) {
	w := newLeaseWorld(t)
	ctx := context.Background()
	l1 := w.offer(t, w.job(), w.w1, 10*time.Minute)
	l1, _ = unary{w.w1C}.send(t, ack(l1))
	l2 := w.offer(t, w.job(), w.w2, 10*time.Minute)
	l2, _ = unary{w.w2C}.send(t, ack(l2))
	unary{w.w1C}.send(t, renew(l1, 1))
	unary{w.w2C}.send(t, renew(l2, 1))

	if _, err := w.w1C.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: w.w1, Reason: "done"})); err != nil {
		t.Fatal(err)
	}
	for seq := uint64(2); seq <= 3; seq++ {
		if _, err := w.w1C.Lease.Renew(ctx, connect.NewRequest(renew(l1, seq).GetRenew())); connect.CodeOf(err) != connect.CodeFailedPrecondition {
			t.Fatalf("renew %d after the exit: %v, want failed_precondition", seq, err)
		}
	}
	if n := len(getNode(t, w.admin, w.w1).Contradictions); n < 2 {
		t.Fatalf("%d contradictions kept, want both renews after the exit", n)
	}
	unary{w.w2C}.send(t, renew(l2, 2)) // the sibling is untouched

	terminateInStore(t, w.srv, w.w2)
	if _, err := w.w2C.Lease.Renew(ctx, connect.NewRequest(renew(l2, 3).GetRenew())); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("a renew after the node was terminated in the store: %v, want unauthenticated", err)
	}
	if _, err := w.w2C.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: w.w2})); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("another call after the node was terminated in the store: %v, want unauthenticated", err)
	}
}

// TestANeverSessionedChildRememberedBeforeItsParentsClaimIsWeighedAfterIt:
// the server remembers a child that never opened a session once its
// requests found nothing to weigh against its ancestors. Its rogue parent
// has the child's credential read (the server now remembers the child),
// ends its own session and claims its exit — no stop yet, so the child's
// node does not change — and then works on as the child (a read; or a
// tool call begun and ended with the child's token). The child's request
// after the claim must still be weighed against it, as if nothing were
// remembered: the parent reads unaccounted, its child served after its
// claim.
func TestANeverSessionedChildRememberedBeforeItsParentsClaimIsWeighedAfterIt(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the tests that start a server per case; make test and CI run them.")
	}
	for _, viaTool := range []bool{false, true} {
		name := "read"
		if viaTool {
			name = "tool-call"
		}
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			clk := clock.NewManual(epoch)
			srv := testserver.Start(t, testserver.WithClock(clk))
			admin := srv.AdminClients()
			parent := register(t, admin, "rogue")
			self := parent.Node.NodeId
			child := spawn(t, srv.Clients(parent.Credential), self, "child")
			cid := child.Node.NodeId
			asChild := srv.Clients(child.Credential)
			grant := issueRoot(t, admin, cid, time.Hour, "tool:*")
			tool := srv.Clients(srv.ToolServerToken(t, "resource-1"))
			work := func() {
				t.Helper()
				if viaTool {
					c, err := tool.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: grant.token, Tool: "shell", GateId: "resource-1"}))
					if err != nil {
						t.Fatal(err)
					}
					if _, err := tool.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: c.Msg.Call.CallId, GateId: "resource-1"})); err != nil {
						t.Fatal(err)
					}
					return
				}
				if _, err := asChild.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: cid})); err != nil {
					t.Fatal(err)
				}
			}
			for range 3 { // remembered from the second on
				work()
			}
			sess, err := openSession(t, srv.Clients(parent.Credential), self)
			if err != nil {
				t.Fatal(err)
			}
			endSessionStored(t, admin, clk, sess, self)
			clk.Advance(time.Minute)
			if _, err := srv.Clients(parent.Credential).Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: self, Reason: "done"})); err != nil {
				t.Fatal(err)
			}
			clk.Advance(time.Second)
			work()
			term := terminate(t, admin, self, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, time.Second, time.Second, time.Second)
			clk.Advance(time.Minute)
			waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
			clk.Advance(time.Minute)
			waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
			pn := recordNode(t, record(t, admin, term.TerminationId), self)
			if pn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED || !strings.Contains(pn.UnaccountedReason, cid) || !strings.Contains(pn.UnaccountedReason, "after this node's claim") {
				t.Fatalf("record: the parent %s (confirmed by %q, reason %q), want unaccounted, its child %s served after its claim",
					pn.Outcome, pn.ConfirmedBy, pn.UnaccountedReason, cid)
			}
		})
	}
}
