package controlplane_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
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
