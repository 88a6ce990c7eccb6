package controlplane_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor"
	"github.com/tetherhq/tether/supervisor/ledger"
)

// The eighth rogue pass: what the seventh left open. Each test plays one
// rogue through the real server (Badger on disk, real HTTP, real JWTs, the
// manual clock).

// openCalls counts a node's calls in flight, as an operator lists them.
func openCalls(t *testing.T, admin *testserver.Clients, node string) int {
	t.Helper()
	resp, err := admin.Tool.ListCalls(context.Background(), connect.NewRequest(&tetherv1.ListCallsRequest{NodeId: node}))
	if err != nil {
		t.Fatal(err)
	}
	return len(resp.Msg.Calls)
}

// A rogue begins tool calls on its node and never ends them: through a
// tool server it controls, or through a shared gate (an MCP gateway) whose
// upstream it keeps busy. Each open call is work for the termination that
// stops the node (a cancel order, an acknowledgement to wait for, a line
// in the record) and keeps a drain waiting, so without a bound a rogue
// inflates its termination at will. A node holds at most
// ledger.MaxOpenCallsPerNode calls in flight through one gate: the next
// begin is refused resource_exhausted, in words, and writes nothing; other
// nodes' calls through the same gate, and the node's through another gate,
// go on, and a call ended frees a slot.
func TestARogueCannotKeepUnboundedCallsOpenOnItsNode(t *testing.T) {
	srv := testserver.Start(t, testserver.WithClock(clock.NewManual(epoch)))
	admin := srv.AdminClients()
	ctx := context.Background()
	rogue := register(t, admin, "rogue")
	other := register(t, admin, "other")
	rogueToken := issueRoot(t, admin, rogue.Node.NodeId, time.Hour, "tool:*").token
	otherToken := issueRoot(t, admin, other.Node.NodeId, time.Hour, "tool:*").token
	gate := srv.Clients(srv.ToolServerToken(t, "gate-1"))
	begin := func(token string) (*tetherv1.ToolCall, error) {
		resp, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: token, Tool: "shell"}))
		if err != nil {
			return nil, err
		}
		return resp.Msg.Call, nil
	}

	var first *tetherv1.ToolCall
	for i := range ledger.MaxOpenCallsPerNode {
		c, err := begin(rogueToken)
		if err != nil {
			t.Fatalf("call %d of %d: %v", i+1, ledger.MaxOpenCallsPerNode, err)
		}
		if first == nil {
			first = c
		}
	}
	_, err := begin(rogueToken)
	if connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("call %d, with %d in flight on the node: %v, want resource_exhausted", ledger.MaxOpenCallsPerNode+1, ledger.MaxOpenCallsPerNode, err)
	}
	want := fmt.Sprintf("node %s already has %d tool calls in flight through gate gate-1, the maximum per node and gate", rogue.Node.NodeId, ledger.MaxOpenCallsPerNode)
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("the refusal says %q, want it to say %q", err.Error(), want)
	}
	if n := openCalls(t, admin, rogue.Node.NodeId); n != ledger.MaxOpenCallsPerNode {
		t.Fatalf("%d calls in flight on the rogue's node after the refusal, want %d (a refusal writes nothing)", n, ledger.MaxOpenCallsPerNode)
	}
	if _, err := begin(otherToken); err != nil {
		t.Fatalf("another node's call through the same gate: %v", err)
	}
	// A gate fills only its own room: a rogue tool server holding an
	// agent's token (every token it is shown) cannot lock the agent out of
	// the other gates.
	if _, err := srv.Clients(srv.ToolServerToken(t, "gate-2")).Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: rogueToken, Tool: "shell"})); err != nil {
		t.Fatalf("the node's call through another gate: %v", err)
	}
	if n := openCalls(t, admin, rogue.Node.NodeId); n != ledger.MaxOpenCallsPerNode+1 {
		t.Fatalf("%d calls in flight on the node, want %d", n, ledger.MaxOpenCallsPerNode+1)
	}
	if _, err := gate.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: first.CallId})); err != nil {
		t.Fatal(err)
	}
	if _, err := begin(rogueToken); err != nil {
		t.Fatalf("a call once one of the node's calls ended: %v", err)
	}
}

// A rogue whose node is draining keeps calling its tools through a gate:
// each begin is refused, and each refusal used to be kept and listed in
// the termination's record, with no bound but the gate's rate times the
// window. Every refusal also woke the termination, whose every pass read
// all of them again. The record lists the first
// ledger.MaxRefusedCallsListedPerNode refusals of each node; later ones are
// refused alike (failed_precondition, saying they are not listed) and
// only counted (since the twenty-fourth pass). The bound is per node: the rogue's refusals do not crowd
// another node's out of the record.
func TestARogueRefusedWhileDrainingCannotGrowTheRecordWithoutBound(t *testing.T) {
	w := newComposeWorld(t)
	ctx := context.Background()
	rogueToken := issueRoot(t, w.admin, w.child.Node.NodeId, time.Hour, "tool:*").token
	otherToken := issueRoot(t, w.admin, w.grandchild.Node.NodeId, time.Hour, "tool:*").token
	held := w.beginCall(t, w.child.Node.NodeId) // keeps the drain open
	term := terminate(t, w.admin, w.child.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Hour, time.Second, 0)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)

	begin := func(token string) error {
		_, err := w.gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: token, Tool: "shell", GateId: "gate-1"}))
		return err
	}
	for i := range 3 * ledger.MaxRefusedCallsListedPerNode {
		err := begin(rogueToken)
		if connect.CodeOf(err) != connect.CodeFailedPrecondition {
			t.Fatalf("refusal %d of the draining rogue: %v, want failed_precondition", i+1, err)
		}
		if i >= ledger.MaxRefusedCallsListedPerNode && !strings.Contains(err.Error(), "not listed") {
			t.Fatalf("refusal %d says %q; want it to say the refusal is not listed", i+1, err.Error())
		}
	}
	if err := begin(otherToken); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("the grandchild's call during the drain: %v, want failed_precondition", err)
	}
	if _, err := w.gate.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: held, GateId: "gate-1"})); err != nil {
		t.Fatal(err)
	}
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	refused := map[string]int{}
	for _, c := range record(t, w.admin, term.TerminationId).ToolCalls {
		if c.Resolution == tetherv1.CallResolution_CALL_RESOLUTION_REJECTED_DRAINING {
			refused[c.NodeId]++
		}
	}
	if refused[w.child.Node.NodeId] != ledger.MaxRefusedCallsListedPerNode {
		t.Fatalf("the record lists %d refused calls of the rogue, want %d (the first ones; the rest are not listed)", refused[w.child.Node.NodeId], ledger.MaxRefusedCallsListedPerNode)
	}
	if refused[w.grandchild.Node.NodeId] != 1 {
		t.Fatalf("the record lists %d refused calls of the grandchild, want its 1", refused[w.grandchild.Node.NodeId])
	}
}

// A rogue names another tree's node or grant in a listing's filter, to
// learn whether it exists (the seventh pass closed the reads by id, not
// the listings): ListNodes by root_node_id, ListStopRules and TestStopRule
// by node_id, and ListGrants by derived_from_grant_id, which also named the
// holder of another tree's grant in its refusal, as Refresh and Delegate
// (naming it as the parent grant) did. Each answers an object
// the agent may not read exactly as an id that names nothing (not_found,
// the same message but for the id). ListNodes also read the other tree's
// whole subtree before it refused.
func TestARogueCannotProbeAnotherTreeThroughItsListings(t *testing.T) {
	srv := testserver.Start(t)
	ctx := context.Background()
	admin := srv.AdminClients()
	rogue := register(t, admin, "rogue")
	rc := srv.Clients(rogue.Credential)
	victim := register(t, admin, "victim")
	child := spawn(t, srv.Clients(victim.Credential), victim.Node.NodeId, "child")
	g := issueRoot(t, admin, child.Node.NodeId, time.Hour, "tool:*")
	missingNode, missingGrant := "n_00000000000000000000", "g_00000000000000000000"

	same := func(what, hiddenID, missingID string, ask func(id string) error) {
		t.Helper()
		hidden, missing := ask(hiddenID), ask(missingID)
		if connect.CodeOf(hidden) != connect.CodeNotFound || connect.CodeOf(missing) != connect.CodeNotFound {
			t.Errorf("%s: another tree's answers %v, a missing one %v; want not_found for both", what, hidden, missing)
			return
		}
		h := strings.ReplaceAll(hidden.Error(), hiddenID, "ID")
		m := strings.ReplaceAll(missing.Error(), missingID, "ID")
		if h != m {
			t.Errorf("%s: another tree's answers %q, a missing one %q; want the same", what, h, m)
		}
		if strings.Contains(hidden.Error(), child.Node.NodeId) && hiddenID != child.Node.NodeId {
			t.Errorf("%s: the refusal %q names the other tree's node", what, hidden)
		}
	}
	same("ListNodes", child.Node.NodeId, missingNode, func(id string) error {
		_, err := rc.Agent.ListNodes(ctx, connect.NewRequest(&tetherv1.ListNodesRequest{RootNodeId: id}))
		return err
	})
	same("ListStopRules", child.Node.NodeId, missingNode, func(id string) error {
		_, err := rc.StopRule.ListStopRules(ctx, connect.NewRequest(&tetherv1.ListStopRulesRequest{NodeId: id}))
		return err
	})
	same("TestStopRule", child.Node.NodeId, missingNode, func(id string) error {
		_, err := rc.StopRule.TestStopRule(ctx, connect.NewRequest(&tetherv1.TestStopRuleRequest{NodeId: id, Expression: "calls > 0"}))
		return err
	})
	same("ListGrants by derived_from_grant_id", g.grant.GrantId, missingGrant, func(id string) error {
		_, err := rc.Capability.ListGrants(ctx, connect.NewRequest(&tetherv1.ListGrantsRequest{DerivedFromGrantId: id}))
		return err
	})
	same("Refresh", g.grant.GrantId, missingGrant, func(id string) error {
		_, err := rc.Capability.Refresh(ctx, connect.NewRequest(&tetherv1.RefreshRequest{GrantId: id}))
		return err
	})
	same("Delegate", g.grant.GrantId, missingGrant, func(id string) error {
		_, err := rc.Capability.Delegate(ctx, connect.NewRequest(&tetherv1.DelegateRequest{ParentGrantId: id, HolderNodeId: rogue.Node.NodeId, Scopes: []string{"tool:shell"}}))
		return err
	})
	// Whoever may read them still does.
	vc := srv.Clients(victim.Credential)
	if nodes, err := vc.Agent.ListNodes(ctx, connect.NewRequest(&tetherv1.ListNodesRequest{RootNodeId: child.Node.NodeId})); err != nil || len(nodes.Msg.Nodes) != 1 {
		t.Errorf("the victim listing its child's subtree: %v", err)
	}
	if _, err := vc.StopRule.ListStopRules(ctx, connect.NewRequest(&tetherv1.ListStopRulesRequest{NodeId: child.Node.NodeId})); err != nil {
		t.Errorf("the victim listing its child's rules: %v", err)
	}
	if _, err := vc.Capability.ListGrants(ctx, connect.NewRequest(&tetherv1.ListGrantsRequest{DerivedFromGrantId: g.grant.GrantId})); err != nil {
		t.Errorf("the victim listing what derives from its child's grant: %v", err)
	}
}

// scanCountingStore is the server's real Badger store, counting the keys
// read by scans of the whole tool-call ledger (every call of every tree).
type scanCountingStore struct {
	store.Store
	ledgerKeys atomic.Int64
}

type scanCountingRead struct {
	store.ReadTxn
	s *scanCountingStore
}

type scanCountingTxn struct {
	store.Txn
	s *scanCountingStore
}

func (s *scanCountingStore) count(prefix []byte, fn func(k, v []byte) error) func(k, v []byte) error {
	if string(prefix) != "calls/call/" {
		return fn
	}
	return func(k, v []byte) error { s.ledgerKeys.Add(1); return fn(k, v) }
}

func (r scanCountingRead) Scan(prefix, start []byte, fn func(k, v []byte) error) error {
	return r.ReadTxn.Scan(prefix, start, r.s.count(prefix, fn))
}

func (r scanCountingTxn) Scan(prefix, start []byte, fn func(k, v []byte) error) error {
	return r.Txn.Scan(prefix, start, r.s.count(prefix, fn))
}

func (s *scanCountingStore) View(ctx context.Context, fn func(tx store.ReadTxn) error) error {
	return s.Store.View(ctx, func(tx store.ReadTxn) error { return fn(scanCountingRead{tx, s}) })
}

func (s *scanCountingStore) Update(ctx context.Context, fn func(tx store.Txn) error) error {
	return s.Store.Update(ctx, func(tx store.Txn) error { return fn(scanCountingTxn{tx, s}) })
}

// A rogue whose labels match the operator's auto-approve policy (it
// chooses its children's labels) proposes its own stop on condition
// calls>=N, with N far beyond its calls. Judging the condition read every
// call of every tree in the ledger, in a write transaction, for each
// proposal: a rogue spawning labelled children, eight proposals each, had
// the server read the whole ledger again and again. The condition is
// judged on the node's own call counter now (the stop rules' count, kept
// in the ledger's transactions), and still approves when it holds.
func TestARogueCannotMakeItsProposalReadEveryTreesCalls(t *testing.T) {
	b, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	st := &scanCountingStore{Store: b}
	srv := testserver.Start(t, testserver.WithClock(clock.NewManual(epoch)), func(cfg *controlplane.Config) {
		cfg.Store = st
		cfg.StopPolicy = supervisor.ProposalPolicy{AutoApprove: map[string]string{"stop": "self"}}
	})
	admin := srv.AdminClients()
	ctx := context.Background()
	gate := srv.Clients(srv.ToolServerToken(t, "gate-1"))
	call := func(token string) {
		t.Helper()
		begun, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: token, Tool: "shell"}))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := gate.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: begun.Msg.Call.CallId})); err != nil {
			t.Fatal(err)
		}
	}
	victim := register(t, admin, "victim")
	victimToken := issueRoot(t, admin, victim.Node.NodeId, time.Hour, "tool:*").token
	for range 100 {
		call(victimToken)
	}
	rogue := registerLabelled(t, admin, "rogue", map[string]string{"stop": "self"})
	rc := srv.Clients(rogue.Credential)
	rogueToken := issueRoot(t, admin, rogue.Node.NodeId, time.Hour, "tool:*").token
	call(rogueToken)
	call(rogueToken)

	propose := func(condition string) *tetherv1.StopProposal {
		t.Helper()
		resp, err := rc.Agent.ProposeStop(ctx, connect.NewRequest(&tetherv1.ProposeStopRequest{Condition: condition, Reason: "done"}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg.Proposal
	}
	st.ledgerKeys.Store(0)
	if p := propose("calls>=1000000000"); p.State != tetherv1.ProposalState_PROPOSAL_STATE_PENDING {
		t.Fatalf("a proposal on calls>=1000000000 with 2 calls is %s, want pending", p.State)
	}
	if p := propose("calls>=3"); p.State != tetherv1.ProposalState_PROPOSAL_STATE_PENDING {
		t.Fatalf("a proposal on calls>=3 with 2 calls is %s, want pending", p.State)
	}
	if n := st.ledgerKeys.Load(); n != 0 {
		t.Fatalf("judging the rogue's two conditions read %d calls of the whole ledger (every tree's), want none", n)
	}
	call(rogueToken)
	if p := propose("calls>=3"); p.State != tetherv1.ProposalState_PROPOSAL_STATE_APPROVED {
		t.Fatalf("a proposal on calls>=3 with 3 calls is %s, want approved by the policy", p.State)
	}
}

// ruleWorld is a rogue parent agent (registered by the operator) with a
// child that holds a tool grant, an operator's rule on the child that is
// true once one of its calls fails, and a policy that drains what such a
// rule proposes: the operator's stop, taken by the control plane.
type ruleWorld struct {
	srv    *testserver.Server
	clk    *clock.Manual
	admin  *testserver.Clients
	parent *testserver.Clients
	child  *tetherv1.SpawnResponse
	token  string
	gate   *testserver.Clients
	rule   *tetherv1.StopRule
}

func newRuleWorld(t *testing.T) *ruleWorld {
	t.Helper()
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), withStopPolicy(supervisor.ProposalPolicy{
		RuleActions: []supervisor.RuleAction{{Severity: "critical", Mode: supervisor.ModeDrain}},
	}))
	admin := srv.AdminClients()
	parent := register(t, admin, "parent")
	pc := srv.Clients(parent.Credential)
	child := spawn(t, pc, parent.Node.NodeId, "child")
	w := &ruleWorld{srv: srv, clk: clk, admin: admin, parent: pc, child: child,
		token: issueRoot(t, admin, child.Node.NodeId, time.Hour, "tool:*").token,
		gate:  srv.Clients(srv.ToolServerToken(t, "gate-1"))}
	w.rule = addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: child.Node.NodeId, Name: "no-failures", Severity: "critical", Expression: `observed.failures >= 1`})
	return w
}

// begin starts a call of the child that nobody ends.
func (w *ruleWorld) begin(t *testing.T) string {
	t.Helper()
	begun, err := w.gate.Tool.BeginCall(context.Background(), connect.NewRequest(&tetherv1.BeginCallRequest{Token: w.token, Tool: "shell", GateId: "gate-1"}))
	if err != nil {
		t.Fatal(err)
	}
	return begun.Msg.Call.CallId
}

func (w *ruleWorld) fail(t *testing.T, call string) {
	t.Helper()
	if _, err := w.gate.Tool.EndCall(context.Background(), connect.NewRequest(&tetherv1.EndCallRequest{CallId: call, GateId: "gate-1", Failed: true})); err != nil {
		t.Fatal(err)
	}
}

// The operator's rule fires on the child and the policy drains it, on the
// control plane's default windows. The rogue parent then drains its child
// itself with a day-long window, to take the node over and let the
// child's call run on for the day. The stop an operator's rule started
// carried the child's own authority (an agent's), so the parent's drain
// took it over. It carries the authority of whoever set the rule (here
// the operator): the parent's drain is refused, failed_precondition, and
// the node stays with the rule's termination.
func TestARogueCannotTakeOverTheStopItsOperatorsRuleStarted(t *testing.T) {
	w := newRuleWorld(t)
	ctx := context.Background()
	w.begin(t) // runs on
	w.fail(t, w.begin(t))
	p := waitRuleProposal(t, w.srv, w.rule.RuleId)
	if p.TerminationId == "" || p.DecidedBy != "policy:stop-rule-action" {
		t.Fatalf("the rule's proposal %v, want approved by the policy", p)
	}
	testserver.WaitFor(t, 20*time.Second, "the rule's termination to mark the child", func() bool {
		return getNode(t, w.admin, w.child.Node.NodeId).TerminationId == p.TerminationId
	})
	_, err := w.parent.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: w.child.Node.NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, Reason: "mine",
		DrainWindow: durationpb.New(24 * time.Hour), ConfirmTimeout: durationpb.New(24 * time.Hour),
	}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("the rogue parent's day-long drain of the child the operator's rule is stopping: %v, want failed_precondition", err)
	}
	if n := getNode(t, w.admin, w.child.Node.NodeId); n.TerminationId != p.TerminationId {
		t.Fatalf("the child is stopped by termination %s, want the rule's %s", n.TerminationId, p.TerminationId)
	}
}

// The rogue parent drains its child first, with a day-long window, while
// the child's calls run; then one of them fails and the operator's rule on
// the child becomes true. Rules were judged only on running nodes, so the
// rule never fired and the parent's drain shielded the child from it for
// the day. The rule fires on a node an agent's termination is stopping,
// and its drain (the operator's authority) takes the node over.
func TestARogueCannotShieldItsChildFromAnOperatorsRuleByDrainingItFirst(t *testing.T) {
	w := newRuleWorld(t)
	ctx := context.Background()
	w.begin(t) // runs on
	failing := w.begin(t)
	mine, err := w.parent.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: w.child.Node.NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, Reason: "mine",
		DrainWindow: durationpb.New(24 * time.Hour), ConfirmTimeout: durationpb.New(24 * time.Hour),
	}))
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, w.srv, mine.Msg.Termination.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)
	w.fail(t, failing)
	p := waitRuleProposal(t, w.srv, w.rule.RuleId)
	if p.TerminationId == "" || p.DecidedBy != "policy:stop-rule-action" {
		t.Fatalf("the rule's proposal %v, want approved by the policy", p)
	}
	testserver.WaitFor(t, 20*time.Second, "the rule's termination to take the child over", func() bool {
		return getNode(t, w.admin, w.child.Node.NodeId).TerminationId == p.TerminationId
	})
}

// The operator drains the child itself, on a short window of its own.
// A rogue then makes the operator's rule on the child true (its call
// fails): were the policy's drain to take the node over, as it takes it
// from an agent's, the rogue would stretch its operator's window to the
// policy's. The policy's stop outranks only an agent's termination: the
// proposal waits for the operator, and the node stays with the operator's
// drain.
func TestARogueCannotStretchItsOperatorsDrainByMakingARuleTrue(t *testing.T) {
	w := newRuleWorld(t)
	w.begin(t) // runs on
	failing := w.begin(t)
	term := terminate(t, w.admin, w.child.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Second, time.Second, time.Hour)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)
	w.fail(t, failing)
	p := waitRuleProposal(t, w.srv, w.rule.RuleId)
	if p.State != tetherv1.ProposalState_PROPOSAL_STATE_PENDING || p.TerminationId != "" {
		t.Fatalf("the rule's proposal on the node the operator drains is %s (termination %q), want pending for the operator", p.State, p.TerminationId)
	}
	if n := getNode(t, w.admin, w.child.Node.NodeId); n.TerminationId != term.TerminationId {
		t.Fatalf("the child is stopped by termination %s, want the operator's %s", n.TerminationId, term.TerminationId)
	}
}
