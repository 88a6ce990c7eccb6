package controlplane_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The thirty-second hostile pass, stop rules: the rogue is an agent an
// operator bounded by a rule on how its calls end or how long they take,
// and it has fresh descendants make them.

// rogue32aCall has token's holder begin a call through gate, the clock
// move by took, and the call end (failed when fail).
func rogue32aCall(t *testing.T, clk *clock.Manual, gate *testserver.Clients, token string, took time.Duration, fail bool) {
	t.Helper()
	ctx := context.Background()
	begun, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: token, Tool: "fetch", GateId: "r32a-gate"}))
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	clk.Advance(took)
	if _, err := gate.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: begun.Msg.Call.CallId, GateId: "r32a-gate", Failed: fail})); err != nil {
		t.Fatalf("end: %v", err)
	}
}

// An operator held the rogue to 100 seconds of tool calls, and to its
// slow calls with three failures: call_seconds_total, call_seconds_max
// and calls_by_outcome were per node, so the rogue had two children and a
// grandchild under each, spawned after the rules, make a 30-second call
// each and one failed call each (120 seconds and four failures, no node
// above 30 seconds or one failure) and no rule could stop it
// (subtree_failures counts failures, not how the other calls ended nor
// how long they took). subtree_call_seconds_total,
// subtree_call_seconds_max and subtree_calls_by_outcome add them up, so
// the rules file for the rogue, naming what they read, and for no
// descendant; the per-node rule never fires.
func TestRogue32ACallTimeSplitAmongGrandchildrenCountsAgainstTheSubtreesRule(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	rogue := register(t, admin, "rogue")
	perNode := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: rogue.Node.NodeId, Name: "call-time", Expression: `observed.call_seconds_total > 100.0`})
	timed := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: rogue.Node.NodeId, Name: "subtree-call-time", Expression: `observed.subtree_call_seconds_total > 100.0`})
	slowest := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: rogue.Node.NodeId, Name: "subtree-slowest-call", Expression: `observed.subtree_call_seconds_max >= 30.0 && observed.subtree_calls_by_outcome[?"failed"].orValue(0) >= 3`})

	var nodes []*tetherv1.SpawnResponse
	for i := range 2 {
		kid := spawn(t, srv.Clients(rogue.Credential), rogue.Node.NodeId, fmt.Sprintf("kid-%d", i))
		nodes = append(nodes, kid, spawn(t, srv.Clients(kid.Credential), kid.Node.NodeId, "grandchild"))
	}
	gate := srv.Clients(srv.ToolServerToken(t, "r32a-gate"))
	for _, n := range nodes {
		tok := issueRoot(t, admin, n.Node.NodeId, time.Hour, "tool:*").token
		rogue32aCall(t, clk, gate, tok, 30*time.Second, false)
		rogue32aCall(t, clk, gate, tok, 0, true)
	}
	for _, rule := range []*tetherv1.StopRule{timed, slowest} {
		p := waitRuleProposal(t, srv, rule.RuleId)
		if p.NodeId != rogue.Node.NodeId {
			t.Fatalf("rule %s filed for %s, want the rogue %s", rule.Name, p.NodeId, rogue.Node.NodeId)
		}
	}
	p := ruleProposals(t, srv, timed.RuleId)[0]
	if v := valueOf(p.Rule.Values, `observed.subtree_call_seconds_total`); v.GetValue() != "120" || v.SelfReported {
		t.Fatalf("proposal values %v, want observed.subtree_call_seconds_total = 120, observed", p.Rule.Values)
	}
	tr, err := admin.StopRule.TestStopRule(context.Background(), connect.NewRequest(&tetherv1.TestStopRuleRequest{NodeId: rogue.Node.NodeId, RuleId: perNode.RuleId}))
	if err != nil {
		t.Fatal(err)
	}
	if tr.Msg.Result {
		t.Fatal("the per-node rule is true: the rogue made no call of its own")
	}
	got := tr.Msg.Observed
	if got.SubtreeCallSecondsTotal != 120 || got.SubtreeCallSecondsMax != 30 || got.SubtreeCallsByOutcome["completed"] != 4 || got.SubtreeCallsByOutcome["failed"] != 4 || got.CallSecondsTotal != 0 {
		t.Fatalf("the rogue's observations %v, want 120 s of calls in its subtree, the longest 30 s, 4 completed and 4 failed, none of its own", got)
	}
	for _, rule := range []*tetherv1.StopRule{timed, slowest, perNode} {
		for _, p := range ruleProposals(t, srv, rule.RuleId) {
			if p.NodeId != rogue.Node.NodeId || rule == perNode {
				t.Fatalf("rule %s filed for %s: each node is judged on its own subtree", rule.Name, p.NodeId)
			}
		}
	}
}
