package controlplane_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The thirtieth hostile pass, stop rules: the rogue is an agent an
// operator bounded by a rule on its node, and it spawns children to do
// what the rule bounds, so that no node of its subtree ever reaches the
// bound on its own counters.

// rogue30cTree registers a rogue root and spawns n children under it,
// each with a grant of its own; it returns the rogue and the children's
// tokens.
func rogue30cTree(t *testing.T, admin *testserver.Clients, clients func(token string) *testserver.Clients, n int) (*tetherv1.RegisterRootResponse, []*tetherv1.SpawnResponse, []string) {
	t.Helper()
	rogue := register(t, admin, "rogue")
	var kids []*tetherv1.SpawnResponse
	var tokens []string
	for i := range n {
		kid := spawn(t, clients(rogue.Credential), rogue.Node.NodeId, fmt.Sprintf("kid-%d", i))
		kids = append(kids, kid)
		tokens = append(tokens, issueRoot(t, admin, kid.Node.NodeId, time.Hour, "tool:*").token)
	}
	return rogue, kids, tokens
}

// rogue30cCall makes one tool call on token through gate and ends it.
func rogue30cCall(t *testing.T, gate *testserver.Clients, token string, fail bool) {
	t.Helper()
	ctx := context.Background()
	begun, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: token, Tool: "shell", GateId: "r30c-gate"}))
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	if _, err := gate.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: begun.Msg.Call.CallId, GateId: "r30c-gate", Failed: fail})); err != nil {
		t.Fatalf("end: %v", err)
	}
}

// A rule judged each node on its own counters: an operator held the rogue
// to `observed.calls > 6`, and the rogue had four children make two calls
// each — eight calls, no node above two — and was never stopped. The
// counters subtree_calls and subtree_failures add up the node and every
// descendant it ever had, each call counting itself into its ancestors'
// totals in its own transaction, so the operator's rule on them stops the
// rogue whichever node made the calls; the per-node rule keeps its
// meaning.
func TestRogue30CCallsSplitAmongChildrenCountAgainstTheSubtreesRule(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	rogue, kids, tokens := rogue30cTree(t, admin, srv.Clients, 4)
	perNode := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: rogue.Node.NodeId, Name: "calls", Expression: `observed.calls > 6`})
	whole := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: rogue.Node.NodeId, Name: "subtree-calls", Expression: `observed.subtree_calls > 6`})
	failing := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: rogue.Node.NodeId, Name: "subtree-failures", Expression: `observed.subtree_failures > 3`})

	gate := srv.Clients(srv.ToolServerToken(t, "r30c-gate"))
	for _, tok := range tokens {
		rogue30cCall(t, gate, tok, false)
		rogue30cCall(t, gate, tok, true)
	}
	for _, rule := range []*tetherv1.StopRule{whole, failing} {
		p := waitRuleProposal(t, srv, rule.RuleId)
		if p.NodeId != rogue.Node.NodeId {
			t.Fatalf("rule %s filed for %s, want the rogue %s", rule.Name, p.NodeId, rogue.Node.NodeId)
		}
	}
	ctx := context.Background()
	tr, err := admin.StopRule.TestStopRule(ctx, connect.NewRequest(&tetherv1.TestStopRuleRequest{NodeId: rogue.Node.NodeId, RuleId: perNode.RuleId}))
	if err != nil {
		t.Fatal(err)
	}
	if tr.Msg.Result || tr.Msg.Observed.Calls != 0 || tr.Msg.Observed.SubtreeCalls != 8 || tr.Msg.Observed.SubtreeFailures != 4 {
		t.Fatalf("the rogue's observations %v (per-node rule %v), want 0 calls of its own, 8 in its subtree, 4 failed", tr.Msg.Observed, tr.Msg.Result)
	}
	kid, err := admin.StopRule.TestStopRule(ctx, connect.NewRequest(&tetherv1.TestStopRuleRequest{NodeId: kids[0].Node.NodeId, RuleId: whole.RuleId}))
	if err != nil {
		t.Fatal(err)
	}
	if kid.Msg.Result || kid.Msg.Observed.Calls != 2 || kid.Msg.Observed.SubtreeCalls != 2 || kid.Msg.Observed.SubtreeFailures != 1 {
		t.Fatalf("a child's observations %v (fired %v), want its own 2 calls, 1 failed", kid.Msg.Observed, kid.Msg.Result)
	}
	for _, rule := range []*tetherv1.StopRule{perNode, whole, failing} {
		for _, p := range ruleProposals(t, srv, rule.RuleId) {
			if p.NodeId != rogue.Node.NodeId || rule == perNode {
				t.Fatalf("rule %s filed for %s: a rule is judged at each node on that node's subtree", rule.Name, p.NodeId)
			}
		}
	}
}

// The subtree totals are written with the calls and the reports, not
// kept in the evaluator's memory: a control plane killed -9 and restarted
// still has the calls and the spend the rogue spread over its children
// before, and adds the ones after to them.
func TestRogue30CSubtreeTotalsSurviveAKill(t *testing.T) {
	if testing.Short() {
		// By design: -short (make test-short) leaves out the slow subprocess and
		// browser tests; make test and CI run them.
		t.Skip("By design: -short skips the tests that run the real binary; make test and CI run them.")
	}
	dir := t.TempDir()
	proc := testserver.StartProcess(t, dir)
	admin := proc.Clients(proc.Admin)
	rogue, kids, tokens := rogue30cTree(t, admin, proc.Clients, 3)
	gate := proc.Clients(proc.ToolServerToken(t, "r30c-gate"))
	ctx := context.Background()
	for i, tok := range tokens {
		rogue30cCall(t, gate, tok, false)
		rogue30cCall(t, gate, tok, false)
		if _, err := proc.Clients(kids[i].Credential).StopRule.ReportCounters(ctx, connect.NewRequest(&tetherv1.ReportCountersRequest{Counters: map[string]float64{"cost_usd": 10}})); err != nil {
			t.Fatal(err)
		}
	}
	proc.Kill()

	again := testserver.StartProcess(t, dir)
	admin = again.Clients(again.Admin)
	gate = again.Clients(again.ToolServerToken(t, "r30c-gate"))
	rogue30cCall(t, gate, tokens[0], false)
	if _, err := again.Clients(kids[0].Credential).StopRule.ReportCounters(ctx, connect.NewRequest(&tetherv1.ReportCountersRequest{Counters: map[string]float64{"cost_usd": 15}})); err != nil {
		t.Fatal(err)
	}
	rule, err := admin.StopRule.AddStopRule(ctx, connect.NewRequest(&tetherv1.AddStopRuleRequest{NodeId: rogue.Node.NodeId, Name: "subtree-calls", Expression: `observed.subtree_calls >= 7 && subtree_reported.cost_usd >= 35.0`}))
	if err != nil {
		t.Fatal(err)
	}
	var filed *tetherv1.StopProposal
	testserver.WaitFor(t, 20*time.Second, "the subtree rule to file", func() bool {
		resp, err := admin.Supervisor.ListProposals(ctx, connect.NewRequest(&tetherv1.ListProposalsRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range resp.Msg.Proposals {
			if p.Rule.GetRuleId() == rule.Msg.Rule.RuleId {
				filed = p
			}
		}
		return filed != nil
	})
	if v := valueOf(filed.Rule.Values, "observed.subtree_calls"); filed.NodeId != rogue.Node.NodeId || v.GetValue() != strconv.Itoa(7) || v.SelfReported {
		t.Fatalf("proposal for %s with values %v, want the rogue's subtree_calls = 7 observed", filed.NodeId, filed.Rule.Values)
	}
	if v := valueOf(filed.Rule.Values, "subtree_reported.cost_usd"); v.GetValue() != "35" || !v.SelfReported {
		t.Fatalf("proposal's values %v, want the rogue's subtree_reported.cost_usd = 35 (10 + 10 + 15, replacing 10), self-reported", filed.Rule.Values)
	}
}

// A spend the agents report was judged on each node's own report: an
// agent held to `self_reported.cost_usd > 25.0` had its four children
// spend 8 each and report it, 32 in all, and was never stopped.
// subtree_reported adds up each counter over the node and every
// descendant it ever had (each report adding its change to its ancestors'
// totals in its own transaction), so the rule over it on the rogue files
// for it, its value labelled self-reported.
func TestRogue30CSpendSplitAmongChildrenCountsAgainstTheSubtreesRule(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	rogue, kids, _ := rogue30cTree(t, admin, srv.Clients, 4)
	perNode := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: rogue.Node.NodeId, Name: "spend", Expression: `self_reported.?cost_usd.orValue(0.0) > 25.0`})
	ctx := context.Background()
	for _, kid := range kids {
		c := srv.Clients(kid.Credential)
		// Reported twice: each report replaces the counter, and the
		// subtree's total follows the replacement, not the sum of reports.
		for _, spent := range []float64{5, 8} {
			if _, err := c.StopRule.ReportCounters(ctx, connect.NewRequest(&tetherv1.ReportCountersRequest{Counters: map[string]float64{"cost_usd": spent}})); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The rule is added once every report is in, so that it reads them
	// all.
	whole := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: rogue.Node.NodeId, Name: "subtree-spend", Expression: `subtree_reported.?cost_usd.orValue(0.0) > 25.0`})
	p := waitRuleProposal(t, srv, whole.RuleId)
	if v := valueOf(p.Rule.Values, "subtree_reported.cost_usd"); p.NodeId != rogue.Node.NodeId || v.GetValue() != "32" || !v.SelfReported {
		t.Fatalf("proposal for %s with values %v, want the rogue's subtree_reported.cost_usd = 32, self-reported", p.NodeId, p.Rule.Values)
	}
	for _, rule := range []*tetherv1.StopRule{perNode, whole} {
		for _, p := range ruleProposals(t, srv, rule.RuleId) {
			if p.NodeId != rogue.Node.NodeId || rule == perNode {
				t.Fatalf("rule %s filed for %s", rule.Name, p.NodeId)
			}
		}
	}
	kid, err := admin.StopRule.TestStopRule(ctx, connect.NewRequest(&tetherv1.TestStopRuleRequest{NodeId: kids[0].Node.NodeId, RuleId: whole.RuleId}))
	if err != nil {
		t.Fatal(err)
	}
	if v := valueOf(kid.Msg.Values, "subtree_reported.cost_usd"); kid.Msg.Result || v.GetValue() != "8" {
		t.Fatalf("a child's subtree spend %v (fired %v), want its own 8", kid.Msg.Values, kid.Msg.Result)
	}
}
