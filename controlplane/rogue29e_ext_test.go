package controlplane_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/stoprule"
)

// TestRogue29EAChildCannotKeepItsParentsRuleOffItByNamingOneFirst: a
// planner attaches its standard rule, "budget", to each worker it spawns.
// A rogue worker attaches a rule of its own named "budget" — never true —
// before its planner gets to it: the planner's rule on the worker was
// refused already_exists ("rules only add, none is replaced"), and the
// rogue ran under no budget but its own. A name is kept from a descendant
// so that an inherited rule cannot be shadowed; a descendant's rule
// shadows nothing its ancestor adds (both are in effect, rules only add),
// as an agent's never keeps a name from an operator. The planner's rule is
// stored and fires; the rogue still cannot take a name its planner's rule
// holds.
func TestRogue29EAChildCannotKeepItsParentsRuleOffItByNamingOneFirst(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	ctx := context.Background()
	planner := register(t, admin, "planner")
	pc := srv.Clients(planner.Credential)
	rogue := spawn(t, pc, planner.Node.NodeId, "worker")
	rc := srv.Clients(rogue.Credential)

	addRule(t, rc, &tetherv1.AddStopRuleRequest{NodeId: rogue.Node.NodeId, Name: "budget", Expression: `false`})
	budget, err := pc.StopRule.AddStopRule(ctx, connect.NewRequest(&tetherv1.AddStopRuleRequest{
		NodeId: rogue.Node.NodeId, Name: "budget", Expression: `observed.calls >= 1`}))
	if err != nil {
		t.Fatalf("the planner's budget on its worker, after the worker named one of its own so: %v", err)
	}
	// The planner cannot take its own name twice, nor the rogue its
	// planner's.
	if _, err := pc.StopRule.AddStopRule(ctx, connect.NewRequest(&tetherv1.AddStopRuleRequest{
		NodeId: rogue.Node.NodeId, Name: "budget", Expression: `true`})); connect.CodeOf(err) != connect.CodeAlreadyExists {
		t.Fatalf("the planner's second budget on the worker: %v, want already_exists", err)
	}
	addRule(t, pc, &tetherv1.AddStopRuleRequest{NodeId: planner.Node.NodeId, Name: "cap", Expression: `false`})
	if _, err := rc.StopRule.AddStopRule(ctx, connect.NewRequest(&tetherv1.AddStopRuleRequest{
		NodeId: rogue.Node.NodeId, Name: "cap", Expression: `false`})); connect.CodeOf(err) != connect.CodeAlreadyExists {
		t.Fatalf("the rogue shadowing its planner's rule: %v, want already_exists", err)
	}

	gateCall(t, srv, issueRoot(t, admin, rogue.Node.NodeId, time.Hour, "tool:*").token, "shell", false)
	if p := waitRuleProposal(t, srv, budget.Msg.Rule.RuleId); p.NodeId != rogue.Node.NodeId {
		t.Fatalf("the planner's budget filed %v, want a proposal for the rogue", p)
	}
}

// TestRogue29EAChildCannotFillItsRuleSlotsAgainstItsParentsRule: the
// agents' rules on a node are bounded (stoprule.MaxRulesPerNode of them,
// stoprule.MaxAgentRuleCostPerNode together), and the rules a rogue worker
// attached to itself counted against its planner's: a worker that filled
// its node with 64 rules that are never true, or with rules costing the
// whole sum, had its planner's budget rule on it refused
// resource_exhausted, and ran under no rule but its own. An agent's rule
// now counts against the rules set at the node by the agent and its
// ancestors only (the node's own and its descendants' are theirs, as the
// operators' are apart): the planner's rules are stored and fire, and the
// rogue is still held to the bounds on its own node.
func TestRogue29EAChildCannotFillItsRuleSlotsAgainstItsParentsRule(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	ctx := context.Background()
	planner := register(t, admin, "planner")
	pc := srv.Clients(planner.Credential)

	// By count: 64 rules that are never true.
	counted := spawn(t, pc, planner.Node.NodeId, "worker-a")
	cc := srv.Clients(counted.Credential)
	for i := range stoprule.MaxRulesPerNode {
		addRule(t, cc, &tetherv1.AddStopRuleRequest{NodeId: counted.Node.NodeId, Name: fmt.Sprintf("filler-%02d", i), Expression: `false`})
	}
	if _, err := cc.StopRule.AddStopRule(ctx, connect.NewRequest(&tetherv1.AddStopRuleRequest{
		NodeId: counted.Node.NodeId, Name: "one-more", Expression: `false`})); connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("the rogue's rule %d on itself: %v, want resource_exhausted", stoprule.MaxRulesPerNode+1, err)
	}
	byCount, err := pc.StopRule.AddStopRule(ctx, connect.NewRequest(&tetherv1.AddStopRuleRequest{
		NodeId: counted.Node.NodeId, Name: "budget", Expression: `observed.calls >= 1`}))
	if err != nil {
		t.Fatalf("the planner's budget on a worker that filled its rule slots: %v", err)
	}

	// By cost: rules of fewer and fewer loops until the sum is full to
	// the last cost unit a cheap rule needs.
	costly := spawn(t, pc, planner.Node.NodeId, "worker-b")
	kc := srv.Clients(costly.Credential)
	chain := func(terms int) string {
		parts := make([]string, terms)
		for i := range parts {
			parts[i] = fmt.Sprintf("observed.calls < %d", -i)
		}
		return strings.Join(parts, " && ")
	}
	filled := false
	for i, e := range []string{slowRule(40), slowRule(20), slowRule(10), slowRule(5), slowRule(2),
		chain(64), chain(32), chain(16), chain(8), chain(4), chain(2), chain(1)} {
		for j := 0; ; j++ {
			_, err := kc.StopRule.AddStopRule(ctx, connect.NewRequest(&tetherv1.AddStopRuleRequest{
				NodeId: costly.Node.NodeId, Name: fmt.Sprintf("fill-%02d-%02d", i, j), Expression: e}))
			if connect.CodeOf(err) == connect.CodeResourceExhausted && strings.Contains(err.Error(), "cost") {
				filled = e == chain(1)
				break
			}
			if err != nil {
				t.Fatalf("the rogue's rule %d-%d: %v, want it accepted until the sum is full", i, j, err)
			}
		}
	}
	if !filled {
		t.Fatal("the rogue did not fill its node's rules' cost")
	}
	byCost, err := pc.StopRule.AddStopRule(ctx, connect.NewRequest(&tetherv1.AddStopRuleRequest{
		NodeId: costly.Node.NodeId, Name: "budget", Expression: `observed.calls >= 1`}))
	if err != nil {
		t.Fatalf("the planner's budget on a worker that filled its rules' cost: %v", err)
	}

	for _, w := range []struct {
		node, rule string
	}{{counted.Node.NodeId, byCount.Msg.Rule.RuleId}, {costly.Node.NodeId, byCost.Msg.Rule.RuleId}} {
		gateCall(t, srv, issueRoot(t, admin, w.node, time.Hour, "tool:*").token, "shell", false)
		if p := waitRuleProposal(t, srv, w.rule); p.NodeId != w.node {
			t.Fatalf("the planner's budget filed %v, want a proposal for %s", p, w.node)
		}
	}
}
