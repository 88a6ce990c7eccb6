package controlplane_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
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
