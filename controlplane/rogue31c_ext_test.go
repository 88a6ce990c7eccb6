package controlplane_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The thirty-first hostile pass, stop rules: the rogue is an agent an
// operator bounded by a rule on its subtree, and it splits what the rule
// bounds among children and grandchildren it spawns after the rule.

// rogue31cCall makes one call of tool on token through gate and ends it.
func rogue31cCall(t *testing.T, gate *testserver.Clients, token, tool string, fail bool) {
	t.Helper()
	ctx := context.Background()
	begun, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: token, Tool: tool, GateId: "r31c-gate"}))
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	if _, err := gate.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: begun.Msg.Call.CallId, GateId: "r31c-gate", Failed: fail})); err != nil {
		t.Fatalf("end: %v", err)
	}
}

// An operator held the rogue to three calls of delete_db over its
// subtree. subtree_calls counts every tool together, so a bound on it
// is no bound on one tool among many reads, and calls_by_tool is per
// node: the rogue's children and grandchild, spawned after the rule,
// made one delete_db call each (four, no node above one) among many
// reads. subtree_calls_by_tool and subtree_failures_by_tool count a
// tool's calls over the subtree however they are split, so the rule
// files for the rogue, naming the count it read, and for no descendant.
func TestRogue31CCallsToOneToolSplitAmongDescendantsCountAgainstTheSubtreesRule(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	rogue := register(t, admin, "rogue")
	byTool := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: rogue.Node.NodeId, Name: "delete-db", Expression: `observed.subtree_calls_by_tool["delete_db"] > 3`})
	failing := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: rogue.Node.NodeId, Name: "delete-db-failures", Expression: `observed.subtree_failures_by_tool["delete_db"] >= 2`})

	var tokens []string
	var kids []*tetherv1.SpawnResponse
	for i := range 3 {
		kids = append(kids, spawn(t, srv.Clients(rogue.Credential), rogue.Node.NodeId, fmt.Sprintf("kid-%d", i)))
	}
	kids = append(kids, spawn(t, srv.Clients(kids[2].Credential), kids[2].Node.NodeId, "grandchild"))
	for _, kid := range kids {
		tokens = append(tokens, issueRoot(t, admin, kid.Node.NodeId, time.Hour, "tool:*").token)
	}
	gate := srv.Clients(srv.ToolServerToken(t, "r31c-gate"))
	for i, tok := range tokens {
		for range 3 {
			rogue31cCall(t, gate, tok, "read", false)
		}
		rogue31cCall(t, gate, tok, "delete_db", i%2 == 0)
	}
	for _, rule := range []*tetherv1.StopRule{byTool, failing} {
		p := waitRuleProposal(t, srv, rule.RuleId)
		if p.NodeId != rogue.Node.NodeId {
			t.Fatalf("rule %s filed for %s, want the rogue %s", rule.Name, p.NodeId, rogue.Node.NodeId)
		}
	}
	p := ruleProposals(t, srv, byTool.RuleId)[0]
	if v := valueOf(p.Rule.Values, `observed.subtree_calls_by_tool["delete_db"]`); v.GetValue() != "4" || v.SelfReported {
		t.Fatalf("proposal values %v, want observed.subtree_calls_by_tool[\"delete_db\"] = 4, observed", p.Rule.Values)
	}
	tr, err := admin.StopRule.TestStopRule(context.Background(), connect.NewRequest(&tetherv1.TestStopRuleRequest{NodeId: rogue.Node.NodeId, RuleId: byTool.RuleId}))
	if err != nil {
		t.Fatal(err)
	}
	if got := tr.Msg.Observed; got.SubtreeCallsByTool["delete_db"] != 4 || got.SubtreeCallsByTool["read"] != 12 || got.SubtreeFailuresByTool["delete_db"] != 2 || len(got.CallsByTool) != 0 {
		t.Fatalf("the rogue's observations %v, want 4 delete_db and 12 read calls in its subtree, 2 delete_db failed, none of its own", got)
	}
	for _, rule := range []*tetherv1.StopRule{byTool, failing} {
		for _, p := range ruleProposals(t, srv, rule.RuleId) {
			if p.NodeId != rogue.Node.NodeId {
				t.Fatalf("rule %s filed for %s: each node is judged on its own subtree", rule.Name, p.NodeId)
			}
		}
	}
}

// A rogue filled its records with tools: eight children each called 64
// tools of 121 characters (a scope tool:<name> is at most 128), so that
// reading the rogue's subtree's counts by tool decodes some 64 KB.
// TestStopRule of an expression reading them, on its own node, decoded
// them all for the one request the call took at the Gate: it is now
// charged a request per SubtreeToolBytesPerRequest decoded, taken even
// past what the budget has left, so a full budget buys a tenth as many
// such tests or fewer; a test not reading them costs its one request.
func TestRogue31CTestingTheSubtreesToolCountsIsPricedByTheirSize(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the 512 tool calls this test makes; make test and CI run them.")
	}
	const burst = 1000
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) { cfg.RateLimit, cfg.RateBurst = 100, burst })
	admin := srv.AdminClients()
	rogue := register(t, admin, "rogue")
	gate := srv.Clients(srv.ToolServerToken(t, "r31c-gate"))
	for i := range 8 {
		kid := spawn(t, srv.Clients(rogue.Credential), rogue.Node.NodeId, fmt.Sprintf("kid-%d", i))
		tok := issueRoot(t, admin, kid.Node.NodeId, time.Hour, "tool:*").token
		for j := range 64 {
			rogue31cCall(t, gate, tok, fmt.Sprintf("%s%d%02d", strings.Repeat("t", 118), i, j), false)
		}
		clk.Advance(2 * burst / 100 * time.Second)
	}
	c := srv.Clients(rogue.Credential)
	tests := 0
	var refusal error
	for refusal == nil && tests <= burst {
		_, refusal = c.StopRule.TestStopRule(context.Background(), connect.NewRequest(&tetherv1.TestStopRuleRequest{NodeId: rogue.Node.NodeId, Expression: `observed.subtree_calls_by_tool["delete_db"] > 0`}))
		if refusal == nil {
			tests++
		}
	}
	wantLimit(t, "the rogue past its budget", refusal, connect.CodeResourceExhausted, "rate limit")
	if tests > burst/10 {
		t.Fatalf("a budget of %d requests bought %d tests decoding the rogue's 512 tools, want at most %d", burst, tests, burst/10)
	}
	// Refilled, a test that does not read them costs its one request.
	clk.Advance(2 * burst / 100 * time.Second)
	for i := range burst / 2 {
		if _, err := c.StopRule.TestStopRule(context.Background(), connect.NewRequest(&tetherv1.TestStopRuleRequest{NodeId: rogue.Node.NodeId, Expression: `observed.subtree_calls > 0`})); err != nil {
			t.Fatalf("test %d not reading the tools on a budget of %d: %v", i, burst, err)
		}
	}
}
