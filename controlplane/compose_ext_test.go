package controlplane_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor"
)

// composeWorld is a parent agent P (registered by the operator) with a
// child C and a grandchild G, each holding a tool grant, on a server with a
// manual clock. Terminations that meet in this tree must compose.
type composeWorld struct {
	srv               *testserver.Server
	clk               *clock.Manual
	admin             *testserver.Clients
	gate              *testserver.Clients // the tool server gate-1
	parent            *tetherv1.RegisterRootResponse
	child, grandchild *tetherv1.SpawnResponse
}

func newComposeWorld(t *testing.T) *composeWorld {
	t.Helper()
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	parent := register(t, admin, "parent")
	child := spawn(t, srv.Clients(parent.Credential), parent.Node.NodeId, "child")
	grandchild := spawn(t, srv.Clients(child.Credential), child.Node.NodeId, "grandchild")
	return &composeWorld{srv: srv, clk: clk, admin: admin, parent: parent, child: child, grandchild: grandchild}
}

// beginCall starts a tool call of node (reported by the tool server
// gate-1) that nobody ends: it stays in flight until a termination
// accounts for it.
func (w *composeWorld) beginCall(t *testing.T, node string) string {
	t.Helper()
	ctx := context.Background()
	issued, err := w.admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: node, Scopes: []string{"tool:*"}, Ttl: durationpb.New(time.Hour)}))
	if err != nil {
		t.Fatal(err)
	}
	if w.gate == nil {
		w.gate = w.srv.Clients(w.srv.ToolServerToken(t, "gate-1"))
	}
	call, err := w.gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: issued.Msg.Token, Tool: "shell", GateId: "gate-1"}))
	if err != nil {
		t.Fatal(err)
	}
	return call.Msg.Call.CallId
}

func (w *composeWorld) node(t *testing.T, id string) *tetherv1.Node {
	t.Helper()
	n, err := w.admin.Agent.GetNode(context.Background(), connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: id}))
	if err != nil {
		t.Fatal(err)
	}
	return n.Msg.Node
}

// recordNodes indexes a record's nodes, failing if one is listed twice.
func recordNodes(t *testing.T, rec *tetherv1.ReconciliationRecord) map[string]*tetherv1.RecordNode {
	t.Helper()
	out := map[string]*tetherv1.RecordNode{}
	for _, n := range rec.Nodes {
		if out[n.NodeId] != nil {
			t.Fatalf("record %s lists node %s twice", rec.RecordId, n.NodeId)
		}
		out[n.NodeId] = n
	}
	return out
}

func callIDs(rec *tetherv1.ReconciliationRecord) map[string]tetherv1.CallResolution {
	out := map[string]tetherv1.CallResolution{}
	for _, c := range rec.ToolCalls {
		out[c.CallId] = c.Resolution
	}
	return out
}

// TestAnOperatorAbortTakesOverAnAgentsLongDrainOfItsChild plays the rogue
// parent: it drains its own child with a 24 h window (while the child and
// grandchild keep calls open) to shield them. The operator's abort of the
// parent takes the whole subtree over at once: every node aborted, every
// call cancelled and accounted once, one record listing every node once
// with the agent's termination named; the agent's termination finishes at
// once, superseded, without waiting out its window.
func TestAnOperatorAbortTakesOverAnAgentsLongDrainOfItsChild(t *testing.T) {
	w := newComposeWorld(t)
	childCall := w.beginCall(t, w.child.Node.NodeId)
	grandchildCall := w.beginCall(t, w.grandchild.Node.NodeId)
	agent := w.srv.Clients(w.parent.Credential)
	inner := terminate(t, agent, w.child.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, 24*time.Hour, 24*time.Hour, 24*time.Hour)
	waitState(t, w.srv, inner.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)

	outer := terminate(t, w.admin, w.parent.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 5*time.Second, 10*time.Second)
	// The agent's drain is superseded at once: the clock has not moved.
	innerDone := waitState(t, w.srv, inner.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	if got := innerDone.SupersededBy; len(got) != 1 || got[0] != outer.TerminationId {
		t.Fatalf("inner superseded_by %v, want [%s]", got, outer.TerminationId)
	}
	innerRec := record(t, w.admin, inner.TerminationId)
	innerNodes := recordNodes(t, innerRec)
	for _, id := range []string{w.child.Node.NodeId, w.grandchild.Node.NodeId} {
		n := innerNodes[id]
		if n == nil || n.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_SUPERSEDED || n.SupersededByTerminationId != outer.TerminationId {
			t.Fatalf("inner record's node %s: %v, want superseded by %s", id, n, outer.TerminationId)
		}
	}
	if len(innerRec.Nodes) != 2 || len(innerRec.ToolCalls) != 0 {
		t.Fatalf("inner record: %d nodes and calls %v, want the 2 nodes and no calls (they moved to the outer termination)", len(innerRec.Nodes), callIDs(innerRec))
	}
	// Every node is aborting under the operator's termination.
	for _, id := range []string{w.parent.Node.NodeId, w.child.Node.NodeId, w.grandchild.Node.NodeId} {
		if n := w.node(t, id); n.State != tetherv1.NodeState_NODE_STATE_ABORTING || n.TerminationId != outer.TerminationId {
			t.Fatalf("node %s: %s under %s, want aborting under %s", id, n.State, n.TerminationId, outer.TerminationId)
		}
	}
	if got := getTermination(t, w.admin, outer.TerminationId); len(got.TookOverFrom) != 1 || got.TookOverFrom[0] != inner.TerminationId || got.Progress.GetAcksPending() != 2 {
		t.Fatalf("outer: took_over_from %v, acks pending %d; want [%s] and both calls' cancel orders", got.TookOverFrom, got.Progress.GetAcksPending(), inner.TerminationId)
	}
	w.clk.Advance(6 * time.Second) // past the cancel-ack timeout: nobody acks
	waitState(t, w.srv, outer.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	w.clk.Advance(11 * time.Second) // past the confirm timeout: nobody confirms
	waitState(t, w.srv, outer.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)

	rec := record(t, w.admin, outer.TerminationId)
	nodes := recordNodes(t, rec)
	if len(nodes) != 3 {
		t.Fatalf("outer record lists %d nodes, want the 3 of the subtree", len(nodes))
	}
	if n := nodes[w.parent.Node.NodeId]; n.InnerTerminationId != "" {
		t.Fatalf("the parent was never another termination's: %v", n)
	}
	for _, id := range []string{w.child.Node.NodeId, w.grandchild.Node.NodeId} {
		n := nodes[id]
		if n.InnerTerminationId != inner.TerminationId || n.InnerOutcome != tetherv1.InnerOutcome_INNER_OUTCOME_TAKEN_OVER_DRAINING || n.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED {
			t.Fatalf("outer record's node %s: %v, want taken over from %s while draining, unaccounted", id, n, inner.TerminationId)
		}
	}
	calls := callIDs(rec)
	if len(calls) != 2 || calls[childCall] != tetherv1.CallResolution_CALL_RESOLUTION_CANCEL_UNACKNOWLEDGED || calls[grandchildCall] != tetherv1.CallResolution_CALL_RESOLUTION_CANCEL_UNACKNOWLEDGED {
		t.Fatalf("outer record's calls %v, want both calls once, cancel_unacknowledged", calls)
	}
	for _, id := range []string{w.parent.Node.NodeId, w.child.Node.NodeId, w.grandchild.Node.NodeId} {
		if n := w.node(t, id); n.State != tetherv1.NodeState_NODE_STATE_TERMINATED {
			t.Fatalf("node %s is %s after the outer termination", id, n.State)
		}
	}
	// The grants of the subtree are revoked: the child's credential is dead.
	if _, err := w.srv.Clients(w.child.Credential).Auth.WhoAmI(context.Background(), connect.NewRequest(&tetherv1.WhoAmIRequest{})); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("the child's credential after the outer termination: %v", err)
	}
}

// TestAnOperatorAbortOfANodeAnAgentIsDrainingIsAcceptedAndEscalates: the
// operator aborts the very node an agent is draining (with a 24 h window):
// accepted, the node goes aborting and its call gets a cancel order at
// once. Rogue variants are refused: the agent cannot re-drain what the
// operator now aborts, and a node being stopped cannot start terminations.
func TestAnOperatorAbortOfANodeAnAgentIsDrainingIsAcceptedAndEscalates(t *testing.T) {
	w := newComposeWorld(t)
	ctx := context.Background()
	call := w.beginCall(t, w.child.Node.NodeId)
	agent := w.srv.Clients(w.parent.Credential)
	inner := terminate(t, agent, w.child.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, 24*time.Hour, time.Hour, 24*time.Hour)
	waitState(t, w.srv, inner.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)
	// Stopping, the child is the workload: it may not terminate its own
	// child (and so pick a window of its own for it).
	_, err := w.srv.Clients(w.child.Credential).Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{NodeId: w.grandchild.Node.NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_DRAIN}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("a draining agent terminating its child: %v, want failed_precondition", err)
	}

	outer := terminate(t, w.admin, w.child.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Minute, time.Minute)
	testserver.WaitFor(t, 10*time.Second, "the abort to take the child over", func() bool {
		n := w.node(t, w.child.Node.NodeId)
		return n.State == tetherv1.NodeState_NODE_STATE_ABORTING && n.TerminationId == outer.TerminationId
	})
	testserver.WaitFor(t, 10*time.Second, "the call's cancel order", func() bool {
		return getTermination(t, w.admin, outer.TerminationId).Progress.GetAcksPending() == 1
	})
	waitState(t, w.srv, inner.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	// The agent cannot take the node back with a drain of its own.
	_, err = agent.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{NodeId: w.child.Node.NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, DrainWindow: durationpb.New(24 * time.Hour)}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), outer.TerminationId) {
		t.Fatalf("the agent re-draining the node the operator aborts: %v, want failed_precondition naming %s", err, outer.TerminationId)
	}
	// Nor with an abort: an operator's termination outranks an agent's.
	_, err = agent.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{NodeId: w.child.Node.NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT, CancelAckTimeout: durationpb.New(24 * time.Hour)}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("the agent aborting the node the operator aborts: %v, want failed_precondition", err)
	}
	w.clk.Advance(2 * time.Minute)
	waitState(t, w.srv, outer.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	w.clk.Advance(2 * time.Minute)
	waitState(t, w.srv, outer.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, w.admin, outer.TerminationId)
	nodes := recordNodes(t, rec)
	if len(nodes) != 2 || nodes[w.child.Node.NodeId].InnerTerminationId != inner.TerminationId || nodes[w.grandchild.Node.NodeId].InnerTerminationId != inner.TerminationId {
		t.Fatalf("outer record nodes %v, want child and grandchild taken over from %s", rec.Nodes, inner.TerminationId)
	}
	if calls := callIDs(rec); len(calls) != 1 || calls[call] != tetherv1.CallResolution_CALL_RESOLUTION_CANCEL_UNACKNOWLEDGED {
		t.Fatalf("outer record calls %v, want the child's call once", calls)
	}
	if calls := callIDs(record(t, w.admin, inner.TerminationId)); len(calls) != 0 {
		t.Fatalf("the superseded record lists calls %v: a call is accounted for once", calls)
	}
}

// TestNodesTerminatedEarlierAreListedWithTheirRecord: a child terminated by
// an earlier, finished termination is in the parent's record too, with
// that termination's id, its record id and the outcome it gave.
func TestNodesTerminatedEarlierAreListedWithTheirRecord(t *testing.T) {
	w := newComposeWorld(t)
	first := terminate(t, w.admin, w.child.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 0, 0)
	firstDone := waitState(t, w.srv, first.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	// Terminating it again is refused: it is terminated.
	if _, err := w.admin.Supervisor.Terminate(context.Background(), connect.NewRequest(&tetherv1.TerminateRequest{NodeId: w.child.Node.NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT})); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("aborting a terminated node: %v, want failed_precondition", err)
	}
	outer := terminate(t, w.admin, w.parent.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 0, 0)
	waitState(t, w.srv, outer.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, w.admin, outer.TerminationId)
	nodes := recordNodes(t, rec)
	if len(nodes) != 3 {
		t.Fatalf("outer record lists %d nodes, want 3", len(nodes))
	}
	for _, id := range []string{w.child.Node.NodeId, w.grandchild.Node.NodeId} {
		n := nodes[id]
		if n.InnerTerminationId != first.TerminationId || n.InnerRecordId != firstDone.RecordId || n.InnerOutcome != tetherv1.InnerOutcome_INNER_OUTCOME_TERMINATED || n.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED {
			t.Fatalf("node %s in the outer record: %v, want terminated by %s (record %s), unaccounted there", id, n, first.TerminationId, firstDone.RecordId)
		}
	}
	if got := getTermination(t, w.admin, outer.TerminationId).Progress; got.GetNodesTotal() != 1 || got.GetConfirmations() != 0 {
		t.Fatalf("outer progress %v: its own member is the parent only", got)
	}
}

// TestAnAgentsDrainLeavesAnOperatorsAbortAlone: an agent drains the parent
// of a node the operator is aborting (the agent's termination is outer but
// of a lower authority). The operator's abort keeps the node; the agent's
// record lists it superseded by the operator's termination; the node is
// never handed to the agent's window.
func TestAnAgentsDrainLeavesAnOperatorsAbortAlone(t *testing.T) {
	w := newComposeWorld(t)
	w.beginCall(t, w.grandchild.Node.NodeId)
	op := terminate(t, w.admin, w.grandchild.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Hour, time.Hour)
	waitState(t, w.srv, op.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_ABORTING)
	agentTerm := terminate(t, w.srv.Clients(w.parent.Credential), w.child.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, 24*time.Hour, 0, 0)
	waitState(t, w.srv, agentTerm.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	nodes := recordNodes(t, record(t, w.admin, agentTerm.TerminationId))
	if n := nodes[w.grandchild.Node.NodeId]; len(nodes) != 2 || n.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_SUPERSEDED || n.SupersededByTerminationId != op.TerminationId {
		t.Fatalf("agent's record nodes %v, want the grandchild superseded by %s", nodes, op.TerminationId)
	}
	if n := w.node(t, w.grandchild.Node.NodeId); n.State != tetherv1.NodeState_NODE_STATE_ABORTING || n.TerminationId != op.TerminationId {
		t.Fatalf("grandchild %s under %s, want still aborting under the operator's %s", n.State, n.TerminationId, op.TerminationId)
	}
	if got := getTermination(t, w.admin, op.TerminationId); got.State != tetherv1.TerminationState_TERMINATION_STATE_ABORTING || len(got.SupersededBy) != 0 {
		t.Fatalf("operator's termination: %s superseded_by %v", got.State, got.SupersededBy)
	}
}

// TestKill9DuringATakeoverCoversEveryNodeExactlyOnce kills the real server
// right after an operator's abort of a parent whose child an agent is
// draining with a 24 h window, restarts it on the same data directory, and
// checks that the takeover completed across the restart: one record per
// termination, every node in the outer record exactly once, every call in
// exactly one record.
func TestKill9DuringATakeoverCoversEveryNodeExactlyOnce(t *testing.T) {
	if testing.Short() {
		// By design: -short (make test-short) leaves out the slow subprocess and
		// browser tests; make test and CI run them.
		t.Skip("By design: -short skips the tests that run the real binary; make test and CI run them.")
	}
	dir := t.TempDir()
	proc := testserver.StartProcess(t, dir)
	admin := proc.Clients(proc.Admin)
	ctx := context.Background()
	parent := register(t, admin, "parent")
	child := spawn(t, proc.Clients(parent.Credential), parent.Node.NodeId, "child")
	grandchild := spawn(t, proc.Clients(child.Credential), child.Node.NodeId, "grandchild")
	gate := proc.Clients(proc.ToolServerToken(t, "gate-1"))
	var calls []string
	for _, node := range []string{child.Node.NodeId, grandchild.Node.NodeId} {
		issued, err := admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: node, Scopes: []string{"tool:*"}, Ttl: durationpb.New(time.Hour)}))
		if err != nil {
			t.Fatal(err)
		}
		call, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: issued.Msg.Token, Tool: "shell", GateId: "gate-1"}))
		if err != nil {
			t.Fatal(err)
		}
		calls = append(calls, call.Msg.Call.CallId)
	}
	inner := terminate(t, proc.Clients(parent.Credential), child.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, 24*time.Hour, 24*time.Hour, 24*time.Hour)
	testserver.WaitFor(t, 10*time.Second, "the agent's drain", func() bool {
		return getTermination(t, admin, inner.TerminationId).State == tetherv1.TerminationState_TERMINATION_STATE_DRAINING
	})
	outer := terminate(t, admin, parent.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Second, time.Second)
	proc.Kill() // the takeover is before or after the kill: either way it must complete

	again := testserver.StartProcess(t, dir)
	admin = again.Clients(again.Admin)
	for _, id := range []string{inner.TerminationId, outer.TerminationId} {
		testserver.WaitFor(t, 30*time.Second, "termination "+id+" to complete after the restart", func() bool {
			return getTermination(t, admin, id).State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
		})
	}
	recs, err := admin.Supervisor.ListRecords(ctx, connect.NewRequest(&tetherv1.ListRecordsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	perTermination := map[string]int{}
	callRecords := map[string]int{}
	for _, r := range recs.Msg.Records {
		perTermination[r.TerminationId]++
		for _, c := range r.ToolCalls {
			callRecords[c.CallId]++
		}
	}
	if perTermination[inner.TerminationId] != 1 || perTermination[outer.TerminationId] != 1 {
		t.Fatalf("records per termination %v, want exactly one each", perTermination)
	}
	for _, c := range calls {
		if callRecords[c] != 1 {
			t.Fatalf("call %s is in %d records, want exactly 1", c, callRecords[c])
		}
	}
	rec := record(t, admin, outer.TerminationId)
	nodes := recordNodes(t, rec)
	if len(nodes) != 3 || nodes[parent.Node.NodeId] == nil {
		t.Fatalf("outer record nodes %v, want the 3 of the subtree", rec.Nodes)
	}
	for _, id := range []string{child.Node.NodeId, grandchild.Node.NodeId} {
		if n := nodes[id]; n == nil || n.InnerTerminationId != inner.TerminationId || n.InnerOutcome != tetherv1.InnerOutcome_INNER_OUTCOME_TAKEN_OVER_DRAINING {
			t.Fatalf("outer record's node %s: %v, want taken over from %s", id, n, inner.TerminationId)
		}
	}
	if got := callIDs(rec); len(got) != 2 {
		t.Fatalf("outer record calls %v, want both", got)
	}
	for _, n := range record(t, admin, inner.TerminationId).Nodes {
		if n.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_SUPERSEDED || n.SupersededByTerminationId != outer.TerminationId {
			t.Fatalf("inner record's node %v, want superseded by %s", n, outer.TerminationId)
		}
	}
}

// TestADescendantAgentCannotLoosenItsAncestorsTermination: the parent
// agent drains its grandchild; the child in between (not being stopped
// itself) plays the rogue and tries to take the grandchild over with a
// 24 h drain, or an abort with a 24 h cancel-ack timeout, of its own. Both
// are refused: only the agent that started a termination, an ancestor of
// it, or an operator may supersede it. The parent itself may escalate.
func TestADescendantAgentCannotLoosenItsAncestorsTermination(t *testing.T) {
	w := newComposeWorld(t)
	ctx := context.Background()
	w.beginCall(t, w.grandchild.Node.NodeId)
	parent := w.srv.Clients(w.parent.Credential)
	inner := terminate(t, parent, w.grandchild.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, 10*time.Second, time.Second, time.Second)
	waitState(t, w.srv, inner.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)
	rogue := w.srv.Clients(w.child.Credential)
	for _, req := range []*tetherv1.TerminateRequest{
		{NodeId: w.grandchild.Node.NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, DrainWindow: durationpb.New(24 * time.Hour)},
		{NodeId: w.grandchild.Node.NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT, CancelAckTimeout: durationpb.New(24 * time.Hour)},
	} {
		if _, err := rogue.Supervisor.Terminate(ctx, connect.NewRequest(req)); connect.CodeOf(err) != connect.CodeFailedPrecondition {
			t.Fatalf("the child taking over its parent's %s termination: %v, want failed_precondition", req.Mode, err)
		}
	}
	if n := w.node(t, w.grandchild.Node.NodeId); n.TerminationId != inner.TerminationId || n.State != tetherv1.NodeState_NODE_STATE_DRAINING {
		t.Fatalf("after the refusals the grandchild is %s under %s", n.State, n.TerminationId)
	}
	// The parent escalates its own drain to an abort. Its call's gate
	// has the agents' least acknowledgement window to answer the cancel
	// (rogue46h), which passes silent.
	outer := terminate(t, parent, w.grandchild.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 0, 0)
	waitState(t, w.srv, outer.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_ABORTING)
	w.clk.Advance(supervisor.MinAgentCancelAckTimeout)
	waitState(t, w.srv, inner.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	done := waitState(t, w.srv, outer.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	if len(done.TookOverFrom) != 1 || done.TookOverFrom[0] != inner.TerminationId {
		t.Fatalf("the parent's abort took over from %v, want [%s]", done.TookOverFrom, inner.TerminationId)
	}
}
