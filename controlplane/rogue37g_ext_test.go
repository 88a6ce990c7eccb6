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

// rogue37gChild is the child of the rogue37g rig: its clients, its id and
// a capability token of a grant it holds, and a tool server's clients.
type rogue37gChild struct {
	as    *testserver.Clients
	id    string
	token string
	tool  *testserver.Clients
	// call: a call of the child's the tool began before the stop
	// (callBefore), in flight, holding the drain open.
	call string
}

// rogue37gRun registers a parent with a child that never opens a session
// (a root grant issued to it), has the child's credential read once before
// the stop (warmAsChild), ends the parent's session, terminates the parent
// (a drain), has the parent claim its exit once the child is marked, then
// calls after, and returns the record's entries of the parent and the
// child.
func rogue37gRun(t *testing.T, warmAsChild, callBefore bool, after func(ctx context.Context, child rogue37gChild)) (parentEntry, childEntry *tetherv1.RecordNode) {
	t.Helper()
	ctx := context.Background()
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	parent := register(t, admin, "rogue")
	self := parent.Node.NodeId
	child := spawn(t, srv.Clients(parent.Credential), self, "child")
	asChild := srv.Clients(child.Credential)
	cid := child.Node.NodeId
	grant := issueRoot(t, admin, cid, time.Hour, "tool:*")
	tool := srv.Clients(srv.ToolServerToken(t, "resource-1"))
	var callID string
	if callBefore {
		c, err := tool.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: grant.token, Tool: "shell", GateId: "resource-1"}))
		if err != nil {
			t.Fatal(err)
		}
		callID = c.Msg.Call.CallId
	}
	if warmAsChild {
		if _, err := asChild.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: cid})); err != nil {
			t.Fatal(err)
		}
	}
	sess, err := openSession(t, srv.Clients(parent.Credential), self)
	if err != nil {
		t.Fatal(err)
	}
	endSessionStored(t, admin, clk, sess, self)
	clk.Advance(time.Minute)
	term := terminate(t, admin, self, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Minute, time.Second, time.Minute)
	// Marked (the child draining) before the parent claims.
	testserver.WaitFor(t, 20*time.Second, "the child to be marked", func() bool {
		return getNode(t, admin, cid).State == tetherv1.NodeState_NODE_STATE_DRAINING
	})
	if _, err := srv.Clients(parent.Credential).Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: self, Reason: "done"})); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Second)
	after(ctx, rogue37gChild{as: asChild, id: cid, token: grant.token, tool: tool, call: callID})
	clk.Advance(2 * time.Minute)
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	clk.Advance(2 * time.Minute)
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, admin, term.TerminationId)
	return recordNode(t, rec, self), recordNode(t, rec, cid)
}

// TestRogue37GAParentWorkingOnAsItsNeverSessionedChildAfterItsClaimIsNotConfirmed:
// a rogue parent ends its session, claims its exit and works on with the
// credential of a child that never opened a session (reads served after
// the claim, nothing open at the record). Until the thirty-seventh pass
// the parent read CONFIRMED by the control plane, the life put on the
// child alone (TestRogue36GAChildThatNeverHadASessionAtWorkReadsUnaccountedItself
// pinned it as a limit). The rogue warms the child's credential before
// the stop, so that the server remembers the child as active.
func TestRogue37GAParentWorkingOnAsItsNeverSessionedChildAfterItsClaimIsNotConfirmed(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the tests that start a server per case; make test and CI run them.")
	}
	pn, cn := rogue37gRun(t, true, false, func(ctx context.Context, child rogue37gChild) {
		for range 3 {
			if _, err := child.as.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: child.id})); err != nil {
				t.Fatal(err)
			}
		}
	})
	if pn.ClaimedBy == "" {
		t.Fatalf("record: the parent's claim not shown (%s, confirmed by %q)", pn.Outcome, pn.ConfirmedBy)
	}
	if pn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED || !strings.Contains(pn.UnaccountedReason, cn.NodeId) || !strings.Contains(pn.UnaccountedReason, "after this node's claim") {
		t.Fatalf("record: the parent %s (confirmed by %q, reason %q), want unaccounted, its child %s served after its claim",
			pn.Outcome, pn.ConfirmedBy, pn.UnaccountedReason, cn.NodeId)
	}
	if cn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED {
		t.Fatalf("record: the child %s, want unaccounted", cn.Outcome)
	}
}

// TestRogue37GANeverSessionedChildAtWorkBeforeItsParentsClaimLeavesTheClaim:
// the guard. A child that never opened a session, at work only before its
// parent's claim (the rogue37g rig's warm read), does not weigh against
// the claim: the parent reads confirmed by the control plane, the child
// unaccounted itself.
func TestRogue37GANeverSessionedChildAtWorkBeforeItsParentsClaimLeavesTheClaim(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the tests that start a server per case; make test and CI run them.")
	}
	pn, cn := rogue37gRun(t, true, false, func(context.Context, rogue37gChild) {})
	if pn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_CONFIRMED || pn.ConfirmedBy != "control-plane" {
		t.Fatalf("record: the honest parent %s (confirmed by %q, reason %q), want confirmed by the control plane", pn.Outcome, pn.ConfirmedBy, pn.UnaccountedReason)
	}
	if cn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED || !strings.Contains(cn.UnaccountedReason, "nobody confirmed") {
		t.Fatalf("record: the child %s (reason %q), want unaccounted, nobody having confirmed its exit", cn.Outcome, cn.UnaccountedReason)
	}
}

// TestRogue37GADrainingChildsRefusedSpawnAfterItsParentsClaimLeavesTheClaim:
// the guard of TestRogueChildIsUnaccountedWhileItsCredentialIsRejected in
// a fixed order. An honest parent claims its exit on its drain; its rogue
// child, which never opened a session and is draining, then tries a spawn,
// refused by the stop: nothing was served to the child's credential, and
// the parent reads confirmed.
func TestRogue37GADrainingChildsRefusedSpawnAfterItsParentsClaimLeavesTheClaim(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the tests that start a server per case; make test and CI run them.")
	}
	pn, cn := rogue37gRun(t, false, false, func(ctx context.Context, child rogue37gChild) {
		asChild, cid := child.as, child.id
		for _, kind := range []string{"spawn", "delegate", "refresh"} {
			var err error
			switch kind {
			case "spawn":
				_, err = asChild.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: cid, Name: "more"}))
			case "delegate":
				_, err = asChild.Capability.Delegate(ctx, connect.NewRequest(&tetherv1.DelegateRequest{ParentGrantId: "g_none", HolderNodeId: cid}))
			case "refresh":
				_, err = asChild.Capability.Refresh(ctx, connect.NewRequest(&tetherv1.RefreshRequest{GrantId: "g_none"}))
			}
			if err == nil {
				t.Fatalf("the draining child's %s was served", kind)
			}
		}
	})
	if pn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_CONFIRMED || pn.ConfirmedBy != "control-plane" {
		t.Fatalf("record: the honest parent %s (confirmed by %q, reason %q), want confirmed by the control plane", pn.Outcome, pn.ConfirmedBy, pn.UnaccountedReason)
	}
	if cn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED {
		t.Fatalf("record: the child %s, want unaccounted", cn.Outcome)
	}
}

// TestRogue37GAToolServingANeverSessionedChildsTokenAfterItsParentsClaimIsLife:
// the rogue parent claims its exit and works on through a tool with its
// never-sessioned child's capability token, which the tool introspects
// (answered active: a call of the child's in flight holds the drain open,
// and the grant is revoked only after it), then the call ends, nothing
// open at the record.
// The tool serving the child's token after the parent's claim weighs
// against the claim as the child's requests do.
func TestRogue37GAToolServingANeverSessionedChildsTokenAfterItsParentsClaimIsLife(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the tests that start a server per case; make test and CI run them.")
	}
	pn, cn := rogue37gRun(t, false, true, func(ctx context.Context, child rogue37gChild) {
		if in := introspect(t, child.tool, child.token); !in.Active {
			t.Fatalf("the child's token during the drain, introspected by a tool: inactive (%s)", in.Reason)
		}
		// Nothing left open at the record: the call ends.
		if _, err := child.tool.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: child.call, GateId: "resource-1"})); err != nil {
			t.Fatal(err)
		}
	})
	if pn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED || !strings.Contains(pn.UnaccountedReason, cn.NodeId) || !strings.Contains(pn.UnaccountedReason, "after this node's claim") {
		t.Fatalf("record: the parent %s (confirmed by %q, reason %q), want unaccounted, its child's token served after its claim",
			pn.Outcome, pn.ConfirmedBy, pn.UnaccountedReason)
	}
}

// TestRogue37GAToolCallWithANeverSessionedChildsTokenAfterItsParentsClaimIsLife:
// the rogue parent ends its session and claims its exit before any stop,
// then works through a tool with its never-sessioned child's capability
// token: the gate begins and ends a call (not refused: no stop covers the
// child yet), and reports a request it served with the token (a seen
// report). Its operator then stops it. The calls begun and served after
// the claim weigh against it, nothing of them open at the record.
func TestRogue37GAToolCallWithANeverSessionedChildsTokenAfterItsParentsClaimIsLife(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the tests that start a server per case; make test and CI run them.")
	}
	for _, seen := range []bool{false, true} {
		t.Run(map[bool]string{false: "a call begun and ended", true: "a seen report"}[seen], func(t *testing.T) {
			ctx := context.Background()
			clk := clock.NewManual(epoch)
			srv := testserver.Start(t, testserver.WithClock(clk))
			admin := srv.AdminClients()
			parent := register(t, admin, "rogue")
			self := parent.Node.NodeId
			child := spawn(t, srv.Clients(parent.Credential), self, "child")
			cid := child.Node.NodeId
			grant := issueRoot(t, admin, cid, time.Hour, "tool:*")
			tool := srv.Clients(srv.ToolServerToken(t, "resource-1"))
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
			if seen {
				_, err := tool.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: grant.token, Tool: "tether:seen", GateId: "resource-1"}))
				if connect.CodeOf(err) != connect.CodeFailedPrecondition {
					t.Fatalf("a seen report: %v", err)
				}
			} else {
				c, err := tool.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: grant.token, Tool: "shell", GateId: "resource-1"}))
				if err != nil {
					t.Fatal(err)
				}
				if _, err := tool.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: c.Msg.Call.CallId, GateId: "resource-1"})); err != nil {
					t.Fatal(err)
				}
			}
			clk.Advance(time.Second)
			term := terminate(t, admin, self, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Minute, time.Second, time.Minute)
			clk.Advance(2 * time.Minute)
			waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
			clk.Advance(2 * time.Minute)
			waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
			pn := recordNode(t, record(t, admin, term.TerminationId), self)
			if pn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED || !strings.Contains(pn.UnaccountedReason, cid) || !strings.Contains(pn.UnaccountedReason, "after this node's claim") {
				t.Fatalf("record: the parent %s (confirmed by %q, reason %q), want unaccounted, its child's token at work after its claim",
					pn.Outcome, pn.ConfirmedBy, pn.UnaccountedReason)
			}
		})
	}
}
