package controlplane_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor"
	"github.com/tetherhq/tether/supervisor/stoprule"
)

// Stop rules through the real server: the agent proposes (writes when it
// should stop); the control plane observes, evaluates, files the proposal
// and lets the operator's policy decide.

// gateCall makes one tool call on token through a tool server's gate and
// ends it (failed when fail is set). The gate is the admin token for now;
// this is the one place to switch it to a tool-server principal.
func gateCall(t *testing.T, srv *testserver.Server, token, tool string, fail bool) {
	t.Helper()
	gate := srv.Clients(srv.ToolServerToken(t, "rules-gate"))
	ctx := context.Background()
	begun, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: token, Tool: tool, GateId: "rules-gate"}))
	if err != nil {
		t.Fatalf("begin %s: %v", tool, err)
	}
	if _, err := gate.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: begun.Msg.Call.CallId, GateId: "rules-gate", Failed: fail})); err != nil {
		t.Fatalf("end %s: %v", tool, err)
	}
}

func addRule(t *testing.T, c *testserver.Clients, req *tetherv1.AddStopRuleRequest) *tetherv1.StopRule {
	t.Helper()
	resp, err := c.StopRule.AddStopRule(context.Background(), connect.NewRequest(req))
	if err != nil {
		t.Fatalf("add rule %s: %v", req.Name, err)
	}
	return resp.Msg.Rule
}

// ruleProposals lists the proposals a rule filed.
func ruleProposals(t *testing.T, srv *testserver.Server, ruleID string) []*tetherv1.StopProposal {
	t.Helper()
	resp, err := srv.AdminClients().Supervisor.ListProposals(context.Background(), connect.NewRequest(&tetherv1.ListProposalsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	var out []*tetherv1.StopProposal
	for _, p := range resp.Msg.Proposals {
		if p.Rule.GetRuleId() == ruleID {
			out = append(out, p)
		}
	}
	return out
}

func waitRuleProposal(t *testing.T, srv *testserver.Server, ruleID string) *tetherv1.StopProposal {
	t.Helper()
	var got []*tetherv1.StopProposal
	testserver.WaitFor(t, 20*time.Second, "rule "+ruleID+" to file its proposal", func() bool {
		got = ruleProposals(t, srv, ruleID)
		return len(got) > 0
	})
	return got[0]
}

func valueOf(vs []*tetherv1.StopRuleValue, name string) *tetherv1.StopRuleValue {
	for _, v := range vs {
		if v.Name == name {
			return v
		}
	}
	return nil
}

func withStopPolicy(p supervisor.ProposalPolicy) testserver.Option {
	return func(cfg *controlplane.Config) { cfg.StopPolicy = p }
}

// startWithRuleAction starts a server on a manual clock at epoch whose
// stop policy acts on a rule of severity with mode.
func startWithRuleAction(t *testing.T, severity string, mode supervisor.Mode) (*testserver.Server, *clock.Manual) {
	t.Helper()
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), withStopPolicy(supervisor.ProposalPolicy{
		RuleActions: []supervisor.RuleAction{{Severity: severity, Mode: mode}},
	}))
	return srv, clk
}

// beginShellCall issues holder a root grant (an hour, tool:*) and has it
// begin a "shell" call through gate "gate-1", left open; it returns the
// gate's clients and the call's id.
func beginShellCall(t *testing.T, srv *testserver.Server, admin *testserver.Clients, holder string) (gate *testserver.Clients, call string) {
	t.Helper()
	grant := issueRoot(t, admin, holder, time.Hour, "tool:*")
	gate = srv.Clients(srv.ToolServerToken(t, "gate-1"))
	begun, err := gate.Tool.BeginCall(context.Background(), connect.NewRequest(&tetherv1.BeginCallRequest{Token: grant.token, Tool: "shell", GateId: "gate-1"}))
	if err != nil {
		t.Fatal(err)
	}
	return gate, begun.Msg.Call.CallId
}

// policysAbortCancelsTheCall checks that rule's proposal is the policy's
// abort (no wait for an operator while node drains on a window a lower
// authority chose), waits for that abort to take node over, and has the
// gate acknowledge its cancel of call: the call is ordered to cancel now,
// not a day from now. setter and node name them in failures.
func policysAbortCancelsTheCall(t *testing.T, srv *testserver.Server, ruleID, nodeID string, gate *testserver.Clients, call, setter, node string) {
	t.Helper()
	ctx := context.Background()
	p := waitRuleProposal(t, srv, ruleID)
	if p.TerminationId == "" || p.DecidedBy != "policy:stop-rule-action" || p.Mode != tetherv1.TerminationMode_TERMINATION_MODE_ABORT {
		t.Fatalf("the %s's rule's proposal is %v (decided by %q, termination %q): want the policy's abort, not a wait for an operator while the %s drains on a 24 h window", setter, p.State, p.DecidedBy, p.TerminationId, node)
	}
	testserver.WaitFor(t, 20*time.Second, "the policy's abort to take the "+node+" over", func() bool {
		n, err := srv.AdminClients().Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: nodeID}))
		if err != nil {
			t.Fatal(err)
		}
		return n.Msg.Node.State == tetherv1.NodeState_NODE_STATE_ABORTING && n.Msg.Node.TerminationId == p.TerminationId
	})
	if _, err := gate.Tool.CancelAck(ctx, connect.NewRequest(&tetherv1.CancelAckRequest{CallId: call, GateId: "gate-1"})); err != nil {
		t.Fatalf("the gate acknowledging the abort's cancel of the %s's call: %v", node, err)
	}
}

func TestStopRuleOverObservedToolCallsFilesExactlyOneProposal(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	root := register(t, admin, "planner")
	worker := spawn(t, srv.Clients(root.Credential), root.Node.NodeId, "worker")
	grant := issueRoot(t, admin, worker.Node.NodeId, time.Hour, "tool:*")
	planner := srv.Clients(root.Credential)
	// The planner writes when its worker should stop.
	rule := addRule(t, planner, &tetherv1.AddStopRuleRequest{
		NodeId: worker.Node.NodeId, Name: "shell-budget", Severity: "warning",
		Expression: `observed.calls_by_tool[?"shell"].orValue(0) >= 3`,
	})
	if rule.SetBy != "agent:"+root.Node.NodeId || rule.Action != "propose" {
		t.Fatalf("stored rule %v", rule)
	}
	for range 3 {
		gateCall(t, srv, grant.token, "shell", false)
	}
	p := waitRuleProposal(t, srv, rule.RuleId)
	if p.NodeId != worker.Node.NodeId || p.State != tetherv1.ProposalState_PROPOSAL_STATE_PENDING {
		t.Fatalf("proposal %v, want a pending proposal for the worker", p)
	}
	v := valueOf(p.Rule.Values, `observed.calls_by_tool["shell"]`)
	if n, _ := strconv.Atoi(v.GetValue()); n < 3 || v.SelfReported {
		t.Fatalf("proposal's values %v, want shell calls >= 3 observed by the control plane", p.Rule.Values)
	}
	if !strings.Contains(p.Reason, "shell-budget") || p.Rule.Expression != rule.Expression {
		t.Fatalf("proposal does not name the rule: %q / %v", p.Reason, p.Rule)
	}
	// The rule stays true with every further call; it has fired. A second
	// rule firing later is the sign that the evaluator has seen them all.
	marker := addRule(t, planner, &tetherv1.AddStopRuleRequest{NodeId: worker.Node.NodeId, Name: "marker", Expression: `observed.calls >= 6`})
	for range 3 {
		gateCall(t, srv, grant.token, "shell", false)
	}
	waitRuleProposal(t, srv, marker.RuleId)
	if got := ruleProposals(t, srv, rule.RuleId); len(got) != 1 {
		t.Fatalf("rule filed %d proposals, want exactly one", len(got))
	}
	// Test evaluates without acting.
	tr, err := planner.StopRule.TestStopRule(context.Background(), connect.NewRequest(&tetherv1.TestStopRuleRequest{NodeId: worker.Node.NodeId, RuleId: rule.RuleId}))
	if err != nil {
		t.Fatal(err)
	}
	if !tr.Msg.Result || tr.Msg.Observed.Calls != 6 || tr.Msg.Observed.CallsByOutcome["completed"] != 6 {
		t.Fatalf("test: %v", tr.Msg)
	}
	if got := ruleProposals(t, srv, rule.RuleId); len(got) != 1 {
		t.Fatalf("TestStopRule acted: %d proposals", len(got))
	}
}

func TestStopRuleWithAnAutoAbortPolicyAbortsTheSubtreeAndTheRecordNamesTheRule(t *testing.T) {
	clk := clock.NewManual(time.Now().UTC())
	srv := testserver.Start(t, testserver.WithClock(clk), withStopPolicy(supervisor.ProposalPolicy{
		RuleActions: []supervisor.RuleAction{{Severity: "critical", Mode: supervisor.ModeAbort}},
	}))
	admin := srv.AdminClients()
	root := register(t, admin, "planner")
	worker := spawn(t, srv.Clients(root.Credential), root.Node.NodeId, "worker")
	helper := spawn(t, srv.Clients(worker.Credential), worker.Node.NodeId, "helper")
	grant := issueRoot(t, admin, worker.Node.NodeId, time.Hour, "tool:*")
	rule := addRule(t, admin, &tetherv1.AddStopRuleRequest{
		NodeId: worker.Node.NodeId, Name: "failing-tools", Severity: "critical",
		Expression: `observed.failures >= 2 && observed.failures * 2 >= observed.calls`,
	})
	gateCall(t, srv, grant.token, "http", true)
	gateCall(t, srv, grant.token, "http", true)
	p := waitRuleProposal(t, srv, rule.RuleId)
	if p.TerminationId == "" || p.DecidedBy != "policy:stop-rule-action" || p.Mode != tetherv1.TerminationMode_TERMINATION_MODE_ABORT {
		t.Fatalf("proposal %v, want approved by the policy as an abort", p)
	}
	var term *tetherv1.Termination
	testserver.WaitFor(t, 20*time.Second, "the abort to terminate", func() bool {
		clk.Advance(time.Minute) // past the cancel-ack and confirm windows
		term = getTermination(t, admin, p.TerminationId)
		return term.State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	rec := record(t, admin, term.TerminationId)
	if rec.Mode != tetherv1.TerminationMode_TERMINATION_MODE_ABORT || len(rec.Nodes) != 2 {
		t.Fatalf("record mode %v nodes %d, want the worker's subtree (2) aborted", rec.Mode, len(rec.Nodes))
	}
	if outcomes := nodeOutcomes(rec); len(outcomes) != 2 || outcomes[helper.Node.NodeId] == 0 {
		t.Fatalf("record nodes %v", outcomes)
	}
	if rec.StopRule.GetRuleId() != rule.RuleId || rec.StopRule.Name != "failing-tools" || rec.StopRule.SelfReported {
		t.Fatalf("record names rule %v", rec.StopRule)
	}
	if v := valueOf(rec.StopRule.Values, "observed.failures"); v == nil || v.Value != "2" || v.SelfReported {
		t.Fatalf("record's values %v, want observed.failures=2", rec.StopRule.Values)
	}
}

func TestChildCannotRemoveOrWeakenItsParentsRule(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	root := register(t, admin, "planner")
	parent := srv.Clients(root.Credential)
	childResp := spawn(t, parent, root.Node.NodeId, "worker")
	child := srv.Clients(childResp.Credential)
	grandchild := spawn(t, child, childResp.Node.NodeId, "helper")
	ctx := context.Background()
	parentRule := addRule(t, parent, &tetherv1.AddStopRuleRequest{NodeId: childResp.Node.NodeId, Name: "spawn-cap", Expression: `observed.subtree_size > 5`})
	operatorRule := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: root.Node.NodeId, Name: "too-deep", Expression: `observed.depth > 8`})

	code := func(err error) connect.Code { return connect.CodeOf(err) }
	for _, ruleID := range []string{parentRule.RuleId, operatorRule.RuleId} {
		_, err := child.StopRule.RemoveStopRule(ctx, connect.NewRequest(&tetherv1.RemoveStopRuleRequest{RuleId: ruleID}))
		if code(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), "set by") {
			t.Fatalf("the child removing rule %s: %v, want permission_denied naming who set it", ruleID, err)
		}
	}
	// An agent cannot remove its operator's rule either, even at the root.
	if _, err := parent.StopRule.RemoveStopRule(ctx, connect.NewRequest(&tetherv1.RemoveStopRuleRequest{RuleId: operatorRule.RuleId})); code(err) != connect.CodePermissionDenied {
		t.Fatalf("the root removing the operator's rule: %v", err)
	}
	// Weakening by shadowing: a looser rule of the same name is refused.
	_, err := child.StopRule.AddStopRule(ctx, connect.NewRequest(&tetherv1.AddStopRuleRequest{NodeId: childResp.Node.NodeId, Name: "spawn-cap", Expression: `observed.subtree_size > 1000`}))
	if code(err) != connect.CodeAlreadyExists {
		t.Fatalf("the child shadowing its parent's rule: %v, want already_exists", err)
	}
	// Reaching up or across is refused; selectors are for operators.
	for _, req := range []*tetherv1.AddStopRuleRequest{
		{NodeId: root.Node.NodeId, Name: "up", Expression: `false`},
		{LabelSelector: "team=research", Name: "wide", Expression: `false`},
	} {
		if _, err := child.StopRule.AddStopRule(ctx, connect.NewRequest(req)); code(err) != connect.CodePermissionDenied {
			t.Fatalf("the child adding %s: %v, want permission_denied", req.Name, err)
		}
	}
	// The child may tighten: its own rule on itself and its descendants.
	own := addRule(t, child, &tetherv1.AddStopRuleRequest{NodeId: grandchild.Node.NodeId, Name: "helper-calls", Expression: `observed.calls > 100`})
	// What the grandchild lives under: every rule, inherited ones marked.
	list, err := srv.Clients(grandchild.Credential).StopRule.ListStopRules(ctx, connect.NewRequest(&tetherv1.ListStopRulesRequest{NodeId: grandchild.Node.NodeId}))
	if err != nil {
		t.Fatal(err)
	}
	inherited := map[string]bool{}
	for _, r := range list.Msg.Rules {
		inherited[r.Name] = r.Inherited
	}
	if len(list.Msg.Rules) != 3 || !inherited["spawn-cap"] || !inherited["too-deep"] || inherited["helper-calls"] {
		t.Fatalf("rules in effect at the grandchild: %v", list.Msg.Rules)
	}
	// The grandchild cannot remove the rule its parent put on it; the
	// parent's parent can (it is a rule of its subtree's agents).
	if _, err := srv.Clients(grandchild.Credential).StopRule.RemoveStopRule(ctx, connect.NewRequest(&tetherv1.RemoveStopRuleRequest{RuleId: own.RuleId})); code(err) != connect.CodePermissionDenied {
		t.Fatalf("the grandchild removing its parent's rule: %v", err)
	}
	if _, err := parent.StopRule.RemoveStopRule(ctx, connect.NewRequest(&tetherv1.RemoveStopRuleRequest{RuleId: own.RuleId})); err != nil {
		t.Fatalf("the root removing its descendant's rule: %v", err)
	}
	// Nothing the child tried changed its parent's rules.
	all, err := admin.StopRule.ListStopRules(ctx, connect.NewRequest(&tetherv1.ListStopRulesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if len(all.Msg.Rules) != 2 {
		t.Fatalf("rules stored: %v, want the parent's and the operator's", all.Msg.Rules)
	}
}

func TestSelfReportedCounterDrivesARuleAndIsLabelledInTheRecord(t *testing.T) {
	clk := clock.NewManual(time.Now().UTC())
	srv := testserver.Start(t, testserver.WithClock(clk), withStopPolicy(supervisor.ProposalPolicy{
		RuleActions: []supervisor.RuleAction{{Labels: map[string]string{"budget": "cost"}, Mode: supervisor.ModeAbort}},
	}))
	admin := srv.AdminClients()
	root := register(t, admin, "planner")
	worker := spawn(t, srv.Clients(root.Credential), root.Node.NodeId, "worker")
	me := srv.Clients(worker.Credential)
	ctx := context.Background()
	// The agent writes its own rule over what it will report.
	rule := addRule(t, me, &tetherv1.AddStopRuleRequest{
		NodeId: worker.Node.NodeId, Name: "cost-cap", Labels: map[string]string{"budget": "cost"},
		Expression: `self_reported.?cost_usd.orValue(0.0) > 5.0`,
	})
	// Nobody else speaks for the agent's counters.
	for name, c := range map[string]*testserver.Clients{"its parent": srv.Clients(root.Credential), "an operator": admin} {
		_, err := c.StopRule.ReportCounters(ctx, connect.NewRequest(&tetherv1.ReportCountersRequest{NodeId: worker.Node.NodeId, Counters: map[string]float64{"cost_usd": 100}}))
		if connect.CodeOf(err) != connect.CodePermissionDenied {
			t.Fatalf("%s reporting the worker's counters: %v, want permission_denied", name, err)
		}
	}
	if _, err := me.StopRule.ReportCounters(ctx, connect.NewRequest(&tetherv1.ReportCountersRequest{Counters: map[string]float64{"cost_usd": 2, "tokens": 1200}})); err != nil {
		t.Fatal(err)
	}
	if _, err := me.StopRule.ReportCounters(ctx, connect.NewRequest(&tetherv1.ReportCountersRequest{Counters: map[string]float64{"cost_usd": 7.5}})); err != nil {
		t.Fatal(err)
	}
	p := waitRuleProposal(t, srv, rule.RuleId)
	if !p.Rule.SelfReported {
		t.Fatalf("proposal's rule %v, want it labelled self-reported", p.Rule)
	}
	testserver.WaitFor(t, 20*time.Second, "the abort to terminate", func() bool {
		clk.Advance(time.Minute)
		return getTermination(t, admin, p.TerminationId).State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	rec := record(t, admin, p.TerminationId)
	v := valueOf(rec.StopRule.GetValues(), "self_reported.cost_usd")
	if !rec.StopRule.GetSelfReported() || v == nil || !v.SelfReported || v.Value != "7.5" {
		t.Fatalf("record's rule %v, want self_reported.cost_usd=7.5 labelled self-reported", rec.StopRule)
	}
	if !strings.Contains(rec.Reason, "(self-reported)") {
		t.Fatalf("record's reason %q does not label the self-reported value", rec.Reason)
	}
}

func TestMalformedAndOverBudgetRulesAreRefusedWithPositions(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	root := register(t, admin, "planner")
	ctx := context.Background()
	for _, tc := range []struct {
		expression, want string
		code             connect.Code
	}{
		{`observed.calls >`, "1:17", connect.CodeInvalidArgument},
		{`observed.calls > 3 &&` + "\n" + `  observed.nope > 1`, "2:11: undefined field 'nope'", connect.CodeInvalidArgument},
		{`observed.calls`, "want bool", connect.CodeInvalidArgument},
		{`observed.calls_by_tool.all(a, observed.calls_by_tool.all(b, observed.calls_by_tool.all(c, a + b + c != "")))`, "loops at 1:27, 1:57, 1:87", connect.CodeInvalidArgument},
		{strings.Repeat("observed.calls > 1 || ", 200) + "false", "bytes, more than 2048", connect.CodeInvalidArgument},
	} {
		_, err := srv.Clients(root.Credential).StopRule.AddStopRule(ctx, connect.NewRequest(&tetherv1.AddStopRuleRequest{NodeId: root.Node.NodeId, Name: "bad", Expression: tc.expression}))
		if connect.CodeOf(err) != tc.code || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %s mentioning %q", tc.expression, err, tc.code, tc.want)
		}
		var ce *connect.Error
		if errors.As(err, &ce) && strings.Contains(ce.Message(), "eyJ") {
			t.Errorf("the refusal leaks a token: %q", ce.Message())
		}
	}
	// The over-budget refusal names the budget.
	_, err := admin.StopRule.AddStopRule(ctx, connect.NewRequest(&tetherv1.AddStopRuleRequest{NodeId: root.Node.NodeId, Name: "bad",
		Expression: `observed.calls_by_tool.all(a, observed.calls_by_tool.all(b, observed.calls_by_tool.all(c, a + b + c != "")))`}))
	if err == nil || !strings.Contains(err.Error(), "more than the budget of") {
		t.Fatalf("over budget: %v", err)
	}
	all, err := admin.StopRule.ListStopRules(ctx, connect.NewRequest(&tetherv1.ListStopRulesRequest{}))
	if err != nil || len(all.Msg.Rules) != 0 {
		t.Fatalf("refused rules changed state: %v %v", all.Msg.GetRules(), err)
	}
}

// TestStopRuleCrashBetweenFiringAndProposing: the server stops (as a
// crash) after a rule became true and before its proposal is written, and
// again after it is written; restarted on the same data directory, the
// rule has filed exactly one proposal.
func TestStopRuleCrashBetweenFiringAndProposing(t *testing.T) {
	for _, point := range []string{"before-file", "after-file"} {
		t.Run(point, func(t *testing.T) {
			dir := t.TempDir()
			crashed := make(chan struct{})
			srv := testserver.StartIn(t, dir, func(cfg *controlplane.Config) {
				cfg.StopRuleFault = func(p string) error {
					if p != point {
						return nil
					}
					close(crashed)
					return errors.New("crash")
				}
			})
			admin := srv.AdminClients()
			root := register(t, admin, "planner")
			grant := issueRoot(t, admin, root.Node.NodeId, time.Hour, "tool:*")
			rule := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: root.Node.NodeId, Name: "two-calls", Expression: `observed.calls >= 2`})
			gateCall(t, srv, grant.token, "shell", false)
			// The second call makes the rule true; the server may be gone
			// before it answers.
			// (Reported by the gate, with its tool-server token: ToolService
			// refuses an operator's, and the rule would never fire.)
			gate := srv.Clients(srv.ToolServerToken(t, "rules-gate"))
			_, _ = gate.Tool.BeginCall(context.Background(), connect.NewRequest(&tetherv1.BeginCallRequest{Token: grant.token, Tool: "shell", GateId: "rules-gate"}))
			select {
			case <-crashed:
			case <-time.After(time.Minute): // a guard, not a synchronisation: the crash point was never reached
				t.Fatalf("the rule never reached the %s crash point", point)
			}
			srv.Stop()

			again := testserver.StartIn(t, dir)
			p := waitRuleProposal(t, again, rule.RuleId)
			// Another rule firing later shows the restarted evaluator has
			// looked at the node again, with the first rule still true.
			marker := addRule(t, again.AdminClients(), &tetherv1.AddStopRuleRequest{NodeId: root.Node.NodeId, Name: "marker", Expression: `observed.calls >= 1`})
			waitRuleProposal(t, again, marker.RuleId)
			if got := ruleProposals(t, again, rule.RuleId); len(got) != 1 || got[0].ProposalId != p.ProposalId {
				t.Fatalf("after the crash at %s the rule filed %d proposals, want exactly one", point, len(got))
			}
		})
	}
}

// Rules over what changes without a write the evaluator watches — the
// clock, the leases — are evaluated again as the control plane's clock
// moves.
func TestStopRulesOverTimeAndLeases(t *testing.T) {
	clk := clock.NewManual(time.Now().UTC())
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	root := register(t, admin, "planner")
	worker := spawn(t, srv.Clients(root.Credential), root.Node.NodeId, "worker")
	old := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: root.Node.NodeId, Name: "too-old", Expression: `observed.age_seconds > 7200.0`})
	leases := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: worker.Node.NodeId, Name: "lease-hoarder", Expression: `observed.leases_held >= 2`})
	ctx := context.Background()
	for _, job := range []string{"job-a", "job-b"} {
		if _, err := admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: worker.Node.NodeId, LeaseDuration: durationpb.New(5 * time.Minute)})); err != nil {
			t.Fatal(err)
		}
	}
	// Leases are read at evaluation time: the next tick of the evaluator
	// (on the manual clock) sees them.
	clk.Advance(stoprule.DefaultTick)
	var got []*tetherv1.StopProposal
	testserver.WaitFor(t, 20*time.Second, "the lease rule to fire", func() bool {
		got = ruleProposals(t, srv, leases.RuleId)
		return len(got) == 1
	})
	if v := valueOf(got[0].Rule.Values, "observed.leases_held"); v.GetValue() != "2" {
		t.Fatalf("values %v", got[0].Rule.Values)
	}
	if len(ruleProposals(t, srv, old.RuleId)) != 0 {
		t.Fatal("too-old fired before the clock moved")
	}
	clk.Advance(3 * time.Hour)
	testserver.WaitFor(t, 20*time.Second, "the age rule to fire", func() bool {
		return len(ruleProposals(t, srv, old.RuleId)) == 2 // the planner and its worker
	})
}

// TestSpawnRuleFiresOnExactSpawnCounts: spawns are counted into growth
// records of their ancestors rather than into the ancestors' counters; a
// rule over the spawn counters fires on the exact count, and the counters
// read back exact, while spawns arrive concurrently from several clients.
func TestSpawnRuleFiresOnExactSpawnCounts(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	root := register(t, admin, "planner")
	mid := spawn(t, admin, root.Node.NodeId, "mid")
	rule := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: root.Node.NodeId, Name: "fan-out", Expression: `observed.subtree_size > 250`})
	var wg sync.WaitGroup
	for w := range 4 {
		c := srv.Clients(srv.Admin)
		wg.Go(func() {
			for i := w; i < 249; i += 4 {
				if _, err := c.Agent.Spawn(context.Background(), connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: mid.Node.NodeId, Name: "w" + strconv.Itoa(i)})); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	// 1 + mid + 249 = 251 nodes: the 249th spawn under mid made it true.
	p := waitRuleProposal(t, srv, rule.RuleId)
	if v := valueOf(p.Rule.Values, "observed.subtree_size"); v.GetValue() != "251" {
		t.Fatalf("proposal's values %v, want observed.subtree_size = 251", p.Rule.Values)
	}
	for _, tc := range []struct {
		node                string
		size, depth, spawns int64
	}{{root.Node.NodeId, 251, 2, 1}, {mid.Node.NodeId, 250, 1, 249}} {
		tr, err := admin.StopRule.TestStopRule(context.Background(), connect.NewRequest(&tetherv1.TestStopRuleRequest{NodeId: tc.node, Expression: "true"}))
		if err != nil {
			t.Fatal(err)
		}
		if o := tr.Msg.Observed; o.SubtreeSize != tc.size || o.SubtreeDepth != tc.depth || o.Spawns != tc.spawns {
			t.Errorf("node %s: subtree_size %d, subtree_depth %d, spawns %d; want %d, %d, %d", tc.node, o.SubtreeSize, o.SubtreeDepth, o.Spawns, tc.size, tc.depth, tc.spawns)
		}
	}
}
