package controlplane_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// Evidence comes from outside the workload: each test here lets an agent
// play the rogue through the real server and checks that the record does
// not take its word.

// rawSession is an agent's session stream driven by hand, so that a test
// decides exactly when the agent heartbeats.
type rawSession struct {
	stream *connect.BidiStreamForClient[tetherv1.SessionRequest, tetherv1.SessionResponse]
	cancel context.CancelFunc
}

// endSessionStored moves clk a minute on, ends sess, node's session, and
// waits for its end to be stored.
func endSessionStored(t *testing.T, admin *testserver.Clients, clk *clock.Manual, sess *rawSession, node string) {
	t.Helper()
	clk.Advance(time.Minute)
	sess.close()
	testserver.WaitFor(t, 20*time.Second, "the session's end to be stored", func() bool {
		return getNode(t, admin, node).SessionClosedAt != nil
	})
}

// openSession opens nodeID's session and waits for the control plane's
// answer; it returns the refusal if there is one.
func openSession(t *testing.T, c *testserver.Clients, nodeID string) (*rawSession, error) {
	t.Helper()
	return openSessionIn(t, context.Background(), c, nodeID)
}

// openSessionIn is openSession with the stream bound by parent (a test's
// guard, so that a missing message fails the test instead of hanging it).
func openSessionIn(t *testing.T, parent context.Context, c *testserver.Clients, nodeID string) (*rawSession, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(parent)
	stream := c.Agent.Session(ctx)
	s := &rawSession{stream: stream, cancel: cancel}
	t.Cleanup(s.close)
	if err := stream.Send(&tetherv1.SessionRequest{Kind: &tetherv1.SessionRequest_Hello{Hello: &tetherv1.SessionHello{NodeId: nodeID}}}); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	resp, err := stream.Receive()
	if err != nil {
		return nil, err
	}
	if resp.GetOpened() == nil {
		t.Fatalf("first session message is %T, want opened", resp.Kind)
	}
	return s, nil
}

// heartbeat sends one heartbeat and returns once it is acknowledged, or the
// error the session ended with.
func (s *rawSession) heartbeat() error {
	if err := s.stream.Send(&tetherv1.SessionRequest{Kind: &tetherv1.SessionRequest_Heartbeat{Heartbeat: &tetherv1.SessionHeartbeat{}}}); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	for {
		resp, err := s.stream.Receive()
		if err != nil {
			return err
		}
		if resp.GetHeartbeatAck() != nil {
			return nil
		}
	}
}

// close ends the session as a process that died would.
func (s *rawSession) close() {
	_ = s.stream.CloseRequest()
	s.cancel()
	_ = s.stream.CloseResponse()
}

func getNode(t *testing.T, c *testserver.Clients, nodeID string) *tetherv1.Node {
	t.Helper()
	resp, err := c.Agent.GetNode(context.Background(), connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: nodeID}))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg.Node
}

func recordNode(t *testing.T, rec *tetherv1.ReconciliationRecord, nodeID string) *tetherv1.RecordNode {
	t.Helper()
	for _, n := range rec.Nodes {
		if n.NodeId == nodeID {
			return n
		}
	}
	t.Fatalf("node %s is not in the record", nodeID)
	return nil
}

func contradictionKinds(cs []*tetherv1.Contradiction) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.Kind
	}
	return out
}

// wantExitedRefusal: the node's activity after its exit was confirmed is
// refused with failed_precondition, naming the state.
func wantExitedRefusal(t *testing.T, what string, err error) {
	t.Helper()
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "exit was confirmed") {
		t.Fatalf("%s after the exit was confirmed: %v, want failed_precondition saying the exit was confirmed", what, err)
	}
}

// TestAgentCannotAcknowledgeItsOwnToolCalls: an agent whose call is being
// cancelled learns the call id (knowing it must not be enough) and tries to
// acknowledge the cancellation, or end the call, itself. It is refused; so
// are an operator and another tool server; the ledger does not move, and
// the record says the cancel was never acknowledged while the handler in
// fact still runs.
func TestAgentCannotAcknowledgeItsOwnToolCalls(t *testing.T) {
	w := newToolWorld(t, true) // the gate ignores the order: its handler runs on
	ctx := context.Background()
	release := make(chan struct{})
	defer close(release)
	done := w.startCall(t, release)
	term := terminate(t, w.admin, w.agent.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 5*time.Second, 0)
	testserver.WaitFor(t, 10*time.Second, "the cancel order", func() bool {
		return getTermination(t, w.admin, term.TerminationId).Progress.GetAcksPending() == 1
	})

	rogue := w.srv.Clients(w.agent.Credential)
	if _, err := firstMessage(rogue.Tool.WatchCancels(ctx, connect.NewRequest(&tetherv1.WatchCancelsRequest{GateId: "gate-1"}))); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("the agent watches the gate's cancel orders: %v, want permission_denied", err)
	}
	// The call id leaks anyway (here from the tool server's own feed).
	order, err := firstMessage(w.srv.Clients(w.gateToken).Tool.WatchCancels(ctx, connect.NewRequest(&tetherv1.WatchCancelsRequest{})))
	if err != nil {
		t.Fatal(err)
	}
	callID := order.CallId
	other := w.srv.Clients(w.srv.ToolServerToken(t, "other-gate"))
	attempts := []struct {
		who string
		err error
	}{
		{"the agent's cancel ack", plain(rogue.Tool.CancelAck(ctx, connect.NewRequest(&tetherv1.CancelAckRequest{CallId: callID, GateId: "gate-1"}))).err},
		{"the agent's cancel ack without a gate", plain(rogue.Tool.CancelAck(ctx, connect.NewRequest(&tetherv1.CancelAckRequest{CallId: callID}))).err},
		{"the agent's end of the call", plain(rogue.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: callID, GateId: "gate-1"}))).err},
		{"an operator's cancel ack", plain(w.admin.Tool.CancelAck(ctx, connect.NewRequest(&tetherv1.CancelAckRequest{CallId: callID, GateId: "gate-1"}))).err},
		{"another tool server's cancel ack as gate-1", plain(other.Tool.CancelAck(ctx, connect.NewRequest(&tetherv1.CancelAckRequest{CallId: callID, GateId: "gate-1"}))).err},
		{"another tool server's cancel ack as itself", plain(other.Tool.CancelAck(ctx, connect.NewRequest(&tetherv1.CancelAckRequest{CallId: callID}))).err},
		{"another tool server's end of the call", plain(other.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: callID}))).err},
	}
	for _, a := range attempts {
		if connect.CodeOf(a.err) != connect.CodePermissionDenied {
			t.Errorf("%s: %v, want permission_denied", a.who, a.err)
		}
	}
	if got := getTermination(t, w.admin, term.TerminationId).Progress.GetAcksPending(); got != 1 {
		t.Fatalf("after the refused reports %d acks are pending, want 1 (the ledger must not change)", got)
	}

	w.clk.Advance(6 * time.Second)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, w.admin, term.TerminationId)
	if len(rec.ToolCalls) != 1 {
		t.Fatalf("record lists %d calls, want 1", len(rec.ToolCalls))
	}
	c := rec.ToolCalls[0]
	if c.Resolution != tetherv1.CallResolution_CALL_RESOLUTION_CANCEL_UNACKNOWLEDGED || c.AcknowledgedBy != "" {
		t.Fatalf("the call is %s acknowledged by %q, want cancel_unacknowledged by nobody", c.Resolution, c.AcknowledgedBy)
	}
	if c.BegunBy != "tool:gate-1" || c.EndedBy != "termination:"+term.TerminationId {
		t.Fatalf("call begun by %q and ended by %q, want tool:gate-1 and the termination", c.BegunBy, c.EndedBy)
	}
	select {
	case err := <-done:
		t.Fatalf("the handler ended (%v): the test needs it running to show the record did not take a false ack", err)
	default:
	}
}

// TestSelfClaimedExitWhileStillActingIsUnaccounted: outside any
// termination, an agent says it exited and keeps going. Its node moves to
// EXITED, every further act is refused and kept as evidence, and a later
// termination's record shows the claim, the contradictions, and the node
// unaccounted.
func TestSelfClaimedExitWhileStillActingIsUnaccounted(t *testing.T) {
	srv := testserver.Start(t, testserver.WithClock(clock.NewManual(epoch)))
	admin := srv.AdminClients()
	ctx := context.Background()
	root := register(t, admin, "rogue")
	self := root.Node.NodeId
	grant := issueRoot(t, admin, self, time.Hour, "tool:*")
	gate := srv.Clients(srv.ToolServerToken(t, "gate-1"))
	agent := srv.Clients(root.Credential)
	sess, err := openSession(t, agent, self)
	if err != nil {
		t.Fatal(err)
	}
	if err := sess.heartbeat(); err != nil {
		t.Fatal(err)
	}

	claimed, err := agent.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: self, Reason: "all done"}))
	if err != nil {
		t.Fatal(err)
	}
	if claimed.Msg.Node.State != tetherv1.NodeState_NODE_STATE_EXITED {
		t.Fatalf("after its exit was confirmed the node is %s, want exited", claimed.Msg.Node.State)
	}
	// It keeps going.
	wantExitedRefusal(t, "a heartbeat", sess.heartbeat())
	_, err = agent.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: self, Name: "more"}))
	wantExitedRefusal(t, "a spawn", err)
	_, err = gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: grant.token, Tool: "shell"}))
	wantExitedRefusal(t, "a tool call", err)
	_, err = agent.Capability.Refresh(ctx, connect.NewRequest(&tetherv1.RefreshRequest{GrantId: grant.grant.GrantId}))
	wantExitedRefusal(t, "a token refresh", err)
	_, err = agent.Lease.Renew(ctx, connect.NewRequest(&tetherv1.RenewRequest{JobId: "job-1"}))
	wantExitedRefusal(t, "a lease renew", err)
	_, err = openSession(t, agent, self)
	wantExitedRefusal(t, "a new session", err)
	// Its word again changes nothing and is no contradiction.
	if _, err := agent.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: self})); err != nil {
		t.Fatal(err)
	}

	n := getNode(t, admin, self)
	want := []string{"heartbeat", "spawn", "tool_call", "refresh", "lease", "session"}
	if n.State != tetherv1.NodeState_NODE_STATE_EXITED || strings.Join(contradictionKinds(n.Contradictions), ",") != strings.Join(want, ",") {
		t.Fatalf("node is %s with contradictions %v, want exited with %v", n.State, contradictionKinds(n.Contradictions), want)
	}
	nodes, err := admin.Agent.ListNodes(ctx, connect.NewRequest(&tetherv1.ListNodesRequest{RootNodeId: self}))
	if err != nil || len(nodes.Msg.Nodes) != 1 || nodes.Msg.Nodes[0].State != tetherv1.NodeState_NODE_STATE_EXITED {
		t.Fatalf("list after the refused spawn: %v %v, want the exited node alone", nodes, err)
	}

	term := terminate(t, admin, self, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Second, time.Hour)
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rn := recordNode(t, record(t, admin, term.TerminationId), self)
	if rn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED || rn.ConfirmedBy != "" {
		t.Fatalf("record: %s confirmed by %q, want unaccounted", rn.Outcome, rn.ConfirmedBy)
	}
	if rn.ClaimedBy != "agent:"+self+" (self)" || rn.ClaimedAt == nil {
		t.Fatalf("record: claimed by %q at %v, want the agent's own claim shown", rn.ClaimedBy, rn.ClaimedAt)
	}
	if len(rn.Contradictions) != len(want) || !strings.Contains(rn.UnaccountedReason, "contradicts") {
		t.Fatalf("record: contradictions %v, reason %q", contradictionKinds(rn.Contradictions), rn.UnaccountedReason)
	}
}

// TestAncestorInsideTheStoppedSubtreeOnlyClaims: a parent being stopped
// vouches for its child, whose session is in fact still open: a claim, not
// evidence. The grandparent, outside the stopped subtree, vouches for the
// parent, which never held a session: an attestation, not a claim — but
// weighed, since the thirty-second pass, against the parent's descendants
// as a bare claim is: the child's open session may be the parent at work
// under the credential it was issued at the child's spawn, so the parent
// reads unaccounted, the reason naming the grandparent's attestation and
// the child (TestRogue32BAnAncestorsAttestationIsWeighedAgainstWhatIsStillAtWork
// has the attestation stand when nothing is at work).
func TestAncestorInsideTheStoppedSubtreeOnlyClaims(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx := context.Background()
	grand := register(t, admin, "grand")
	grandC := srv.Clients(grand.Credential)
	parent := spawn(t, grandC, grand.Node.NodeId, "parent")
	parentC := srv.Clients(parent.Credential)
	child := spawn(t, parentC, parent.Node.NodeId, "child")
	if _, err := openSession(t, srv.Clients(child.Credential), child.Node.NodeId); err != nil {
		t.Fatal(err)
	}

	term := terminate(t, admin, parent.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Hour, time.Minute, time.Minute)
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	if _, err := parentC.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: child.Node.NodeId, Reason: "it is gone, trust me"})); err != nil {
		t.Fatal(err)
	}
	if _, err := grandC.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: parent.Node.NodeId, Reason: "reaped"})); err != nil {
		t.Fatal(err)
	}
	// The child's open session keeps the termination waiting for evidence.
	if st := getTermination(t, admin, term.TerminationId).State; st != tetherv1.TerminationState_TERMINATION_STATE_RECONCILING {
		t.Fatalf("with the child's session open the termination is %s, want reconciling", st)
	}
	clk.Advance(2 * time.Minute)
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, admin, term.TerminationId)
	c := recordNode(t, rec, child.Node.NodeId)
	if c.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED || c.ConfirmedBy != "" || !c.SessionOpen {
		t.Fatalf("child: %s confirmed by %q (session open %v), want unaccounted with its session open", c.Outcome, c.ConfirmedBy, c.SessionOpen)
	}
	if c.ClaimedBy != "agent:"+parent.Node.NodeId+" (ancestor)" || !strings.Contains(c.UnaccountedReason, "session") {
		t.Fatalf("child: claimed by %q, reason %q, want the parent's claim and the open session", c.ClaimedBy, c.UnaccountedReason)
	}
	p := recordNode(t, rec, parent.Node.NodeId)
	if p.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED || p.ConfirmedBy != "" || p.ClaimedBy != "" ||
		!strings.Contains(p.UnaccountedReason, "attestation by agent:"+grand.Node.NodeId+" (ancestor)") || !strings.Contains(p.UnaccountedReason, child.Node.NodeId) {
		t.Fatalf("parent: %s confirmed by %q claimed by %q (reason %q), want unaccounted: the grandparent's attestation (not a claim) weighed against the child's open session",
			p.Outcome, p.ConfirmedBy, p.ClaimedBy, p.UnaccountedReason)
	}
}

// TestLauncherAttestationAgreesWithTheEvidence: the process dies (its
// session ends), then its launcher attests the exit: confirmed.
func TestLauncherAttestationAgreesWithTheEvidence(t *testing.T) {
	srv := testserver.Start(t, testserver.WithClock(clock.NewManual(epoch)))
	admin := srv.AdminClients()
	root := register(t, admin, "worker")
	self := root.Node.NodeId
	sess, err := openSession(t, srv.Clients(root.Credential), self)
	if err != nil {
		t.Fatal(err)
	}
	if err := sess.heartbeat(); err != nil {
		t.Fatal(err)
	}
	term := terminate(t, admin, self, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Hour, time.Minute, time.Hour)
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	sess.close()
	testserver.WaitFor(t, 10*time.Second, "the control plane to see the session end", func() bool {
		n := getNode(t, admin, self)
		return n.SessionClosedAt != nil && !n.SessionClosedAt.AsTime().Before(n.SessionOpenedAt.AsTime())
	})
	if _, err := admin.Agent.ConfirmExit(context.Background(), connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: self, Reason: "process exited"})); err != nil {
		t.Fatal(err)
	}
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rn := recordNode(t, record(t, admin, term.TerminationId), self)
	if rn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_CONFIRMED || rn.ConfirmedBy != "operator:admin (launcher)" {
		t.Fatalf("record: %s confirmed by %q (%s), want confirmed by the launcher", rn.Outcome, rn.ConfirmedBy, rn.UnaccountedReason)
	}
	if rn.SessionOpen || rn.SessionClosedAt == nil || len(rn.Contradictions) != 0 || rn.ClaimedBy != "" {
		t.Fatalf("record: session open %v closed %v, contradictions %v, claim %q", rn.SessionOpen, rn.SessionClosedAt, rn.Contradictions, rn.ClaimedBy)
	}
}

// TestActivityAfterALauncherAttestationIsUnaccounted: the launcher says the
// process exited, but its session is still alive and heartbeats: the
// heartbeat is refused and the record does not believe the launcher.
func TestActivityAfterALauncherAttestationIsUnaccounted(t *testing.T) {
	srv := testserver.Start(t, testserver.WithClock(clock.NewManual(epoch)))
	admin := srv.AdminClients()
	root := register(t, admin, "worker")
	self := root.Node.NodeId
	sess, err := openSession(t, srv.Clients(root.Credential), self)
	if err != nil {
		t.Fatal(err)
	}
	term := terminate(t, admin, self, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Hour, time.Minute, time.Hour)
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	if _, err := admin.Agent.ConfirmExit(context.Background(), connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: self, Reason: "process exited"})); err != nil {
		t.Fatal(err)
	}
	// The heartbeat is refused. (The contradiction settles the node, so the
	// record may be written, and the node terminated, before the session
	// answers: then the session ends as terminated.)
	if err := sess.heartbeat(); connect.CodeOf(err) != connect.CodeUnauthenticated {
		wantExitedRefusal(t, "a heartbeat", err)
	}
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rn := recordNode(t, record(t, admin, term.TerminationId), self)
	if rn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED || rn.ConfirmedBy != "" {
		t.Fatalf("record: %s confirmed by %q, want unaccounted", rn.Outcome, rn.ConfirmedBy)
	}
	if kinds := contradictionKinds(rn.Contradictions); len(kinds) != 1 || kinds[0] != "heartbeat" || rn.Contradictions[0].At == nil {
		t.Fatalf("record: contradictions %v, want the heartbeat with its time", kinds)
	}
}

// TestContradictionsAreBounded: a node that floods after its claim keeps
// being refused, but its node grows by a bounded number of entries.
func TestContradictionsAreBounded(t *testing.T) {
	srv := testserver.Start(t, testserver.WithClock(clock.NewManual(epoch)))
	admin := srv.AdminClients()
	ctx := context.Background()
	root := register(t, admin, "flood")
	agent := srv.Clients(root.Credential)
	if _, err := agent.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: root.Node.NodeId})); err != nil {
		t.Fatal(err)
	}
	for range 50 {
		_, err := agent.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: root.Node.NodeId}))
		wantExitedRefusal(t, "a read", err)
	}
	if n := len(getNode(t, admin, root.Node.NodeId).Contradictions); n != 16 {
		t.Fatalf("%d contradictions kept, want the first 16", n)
	}
}

// TestKill9KeepsAClaimAndItsContradictions: the claim and the activity that
// contradicts it are durable: after kill -9 the node is still exited, its
// credential still refused, and the record still says unaccounted.
func TestKill9KeepsAClaimAndItsContradictions(t *testing.T) {
	if testing.Short() {
		// By design: -short (make test-short) leaves out the slow subprocess and
		// browser tests; make test and CI run them.
		t.Skip("By design: -short skips the tests that run the real binary; make test and CI run them.")
	}
	dir, addr := t.TempDir(), testserver.FreeAddr(t)
	proc := testserver.StartProcessOn(t, dir, addr)
	admin := proc.Clients(proc.Admin)
	ctx := context.Background()
	root := register(t, admin, "rogue")
	self := root.Node.NodeId
	agent := proc.Clients(root.Credential)
	if _, err := agent.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: self, Reason: "done"})); err != nil {
		t.Fatal(err)
	}
	_, err := agent.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: self, Name: "more"}))
	wantExitedRefusal(t, "a spawn", err)

	proc.Kill()
	proc = testserver.StartProcessOn(t, dir, addr)
	admin = proc.Clients(proc.Admin)
	agent = proc.Clients(root.Credential)
	n := getNode(t, admin, self)
	if n.State != tetherv1.NodeState_NODE_STATE_EXITED || len(n.ExitConfirmations) != 1 || n.ExitConfirmations[0].Kind != "self" || len(n.Contradictions) != 1 {
		t.Fatalf("after kill -9 the node is %s with confirmations %v and contradictions %v", n.State, n.ExitConfirmations, contradictionKinds(n.Contradictions))
	}
	_, err = agent.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: self, Name: "again"}))
	wantExitedRefusal(t, "a spawn after the restart", err)

	term := terminate(t, admin, self, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Second, time.Hour)
	testserver.WaitFor(t, 20*time.Second, "the termination to end", func() bool {
		return getTermination(t, admin, term.TerminationId).State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	rn := recordNode(t, record(t, admin, term.TerminationId), self)
	if rn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED || rn.ClaimedBy != "agent:"+self+" (self)" || len(rn.Contradictions) != 2 {
		t.Fatalf("record after kill -9: %s, claimed by %q, contradictions %v", rn.Outcome, rn.ClaimedBy, contradictionKinds(rn.Contradictions))
	}
}

// TestASecondSilentSessionIsNotHiddenByClosingTheFirst: a rogue opens two
// sessions, closes one and claims its exit over RPC while the other stays
// open and silent. The control plane keeps each session: the record says
// the session is still open, and the claim is not taken.
func TestASecondSilentSessionIsNotHiddenByClosingTheFirst(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	root := register(t, admin, "rogue")
	self := root.Node.NodeId
	agent := srv.Clients(root.Credential)
	if _, err := openSession(t, agent, self); err != nil { // the silent one
		t.Fatal(err)
	}
	shown, err := openSession(t, agent, self)
	if err != nil {
		t.Fatal(err)
	}
	shown.close()
	testserver.WaitFor(t, 10*time.Second, "the control plane to see one session end", func() bool {
		n := getNode(t, admin, self)
		return n.SessionClosedAt != nil && len(n.OpenSessions) == 1
	})
	if _, err := agent.Agent.ConfirmExit(context.Background(), connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: self})); err != nil {
		t.Fatal(err)
	}
	term := terminate(t, admin, self, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Second, time.Minute)
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	clk.Advance(2 * time.Minute)
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rn := recordNode(t, record(t, admin, term.TerminationId), self)
	if rn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED || !rn.SessionOpen || rn.ConfirmedBy != "" {
		t.Fatalf("record: %s (session open %v, confirmed by %q), want unaccounted with a session open", rn.Outcome, rn.SessionOpen, rn.ConfirmedBy)
	}
}

// TestKill9EndsTheSessionsOfThePreviousRun: a session open when the
// control plane is killed ended with it; after the restart the node has no
// open session, and a launcher's attestation is confirmed.
func TestKill9EndsTheSessionsOfThePreviousRun(t *testing.T) {
	if testing.Short() {
		// By design: -short (make test-short) leaves out the slow subprocess and
		// browser tests; make test and CI run them.
		t.Skip("By design: -short skips the tests that run the real binary; make test and CI run them.")
	}
	dir, addr := t.TempDir(), testserver.FreeAddr(t)
	proc := testserver.StartProcessOn(t, dir, addr)
	admin := proc.Clients(proc.Admin)
	root := register(t, admin, "worker")
	self := root.Node.NodeId
	sess, err := openSession(t, proc.Clients(root.Credential), self)
	if err != nil {
		t.Fatal(err)
	}
	if err := sess.heartbeat(); err != nil {
		t.Fatal(err)
	}
	if n := getNode(t, admin, self); len(n.OpenSessions) != 1 {
		t.Fatalf("before the kill: %d sessions open, want 1", len(n.OpenSessions))
	}
	proc.Kill()
	proc = testserver.StartProcessOn(t, dir, addr)
	admin = proc.Clients(proc.Admin)
	if n := getNode(t, admin, self); len(n.OpenSessions) != 0 || n.SessionClosedAt == nil {
		t.Fatalf("after the restart: sessions %v, closed at %v, want none open", n.OpenSessions, n.SessionClosedAt)
	}
	term := terminate(t, admin, self, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Second, time.Hour)
	if _, err := admin.Agent.ConfirmExit(context.Background(), connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: self, Reason: "process exited"})); err != nil {
		t.Fatal(err)
	}
	testserver.WaitFor(t, 20*time.Second, "the termination to end", func() bool {
		return getTermination(t, admin, term.TerminationId).State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	rn := recordNode(t, record(t, admin, term.TerminationId), self)
	if rn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_CONFIRMED || rn.ConfirmedBy != "operator:admin (launcher)" {
		t.Fatalf("record after kill -9: %s confirmed by %q (%s)", rn.Outcome, rn.ConfirmedBy, rn.UnaccountedReason)
	}
}
