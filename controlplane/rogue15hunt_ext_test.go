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
	"github.com/tetherhq/tether/supervisor"
	"github.com/tetherhq/tether/supervisor/stoprule"
)

// The fifteenth rogue pass: the stop rules' evaluator and the record's
// evidence, through the real server (Badger on disk, HTTP/2, real JWTs).

// slowRule is an expression within the cost budget that never fires and
// takes the evaluator as long as any: loops over the node's labels (the
// agent's own, chosen by its parent) are the slowest per cost unit.
func slowRule(loops int) string {
	parts := make([]string, 0, loops+1)
	for range loops {
		parts = append(parts, `observed.node_labels.all(a, a != "z")`)
	}
	return strings.Join(append(parts, "observed.calls < 0"), " && ")
}

// A rogue cannot buy the stop-rule evaluator's time with many rules each
// within the budget. The evaluator — one for the whole cluster — runs
// every rule in effect at a node each time the node reports its counters;
// a rule's worst case is bounded (stoprule.CostBudget), and so was the
// number of rules an agent attaches to one node (64), but not their sum:
// a rogue that gave itself 32 long labels and 64 rules of 6,000 cost
// units each (loops over those labels, never true) had each of its
// ReportCounters calls — one request of its rate budget — cost the
// evaluator 64 near-budget evaluations (a figure is logged), during which
// no other tree's rule is evaluated, however urgent. Agents' rules on one
// node now cost together at most stoprule.MaxAgentRuleCostPerNode (one
// rule's budget): the rogue's second expensive rule is refused
// resource_exhausted saying so, and nothing is stored; a cheap rule still
// fits beside the first, and its operator's rule on the rogue's node, on
// the operators' side, is not counted against the agents' sum. (Fails
// with the rogue's second expensive rule accepted.)
func TestARogueCannotBuyTheRuleEvaluatorsTimeWithManyRulesWithinBudget(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	ctx := context.Background()
	planner := register(t, admin, "planner")
	labels := map[string]string{}
	for i := range 32 {
		labels[fmt.Sprintf("l%02d", i)] = strings.Repeat("v", 60)
	}
	rogue := spawnLabelled(t, srv.Clients(planner.Credential), planner.Node.NodeId, "rogue", labels)
	rc := srv.Clients(rogue.Credential)
	expensive := slowRule(36)
	c, err := stoprule.Compile(expensive)
	if err != nil {
		t.Fatal(err)
	}
	if c.Cost <= stoprule.CostBudget/2 || c.Cost > stoprule.CostBudget {
		t.Fatalf("the probe's rule costs %d; want more than half the budget of %d", c.Cost, stoprule.CostBudget)
	}

	accepted := 0
	var refusal error
	for i := range stoprule.MaxRulesPerNode {
		_, err := rc.StopRule.AddStopRule(ctx, connect.NewRequest(&tetherv1.AddStopRuleRequest{NodeId: rogue.Node.NodeId, Name: fmt.Sprintf("slow-%02d", i), Expression: expensive}))
		if err != nil {
			refusal = err
			break
		}
		accepted++
	}
	// What the rules it was given cost the evaluator: one report.
	stats := srv.StopRuleStats()
	evals, nanos := stats.Evaluations.Load(), stats.EvalNanos.Load()
	testserver.WaitFor(t, 20*time.Second, "the evaluator to settle", func() bool {
		before := stats.Evaluations.Load()
		if _, err := rc.StopRule.ListStopRules(ctx, connect.NewRequest(&tetherv1.ListStopRulesRequest{NodeId: rogue.Node.NodeId})); err != nil {
			t.Fatal(err)
		}
		return stats.Evaluations.Load() == before && before >= evals
	})
	evals, nanos = stats.Evaluations.Load(), stats.EvalNanos.Load()
	if _, err := rc.StopRule.ReportCounters(ctx, connect.NewRequest(&tetherv1.ReportCountersRequest{NodeId: rogue.Node.NodeId, Counters: map[string]float64{"n": 1}})); err != nil {
		t.Fatal(err)
	}
	testserver.WaitFor(t, 60*time.Second, "the report's evaluation", func() bool {
		return stats.Evaluations.Load() >= evals+int64(accepted)
	})
	t.Logf("%d rules of cost %d accepted; one ReportCounters cost the evaluator %d evaluations, %v (machine load applies)",
		accepted, c.Cost, stats.Evaluations.Load()-evals, time.Duration(stats.EvalNanos.Load()-nanos))

	if accepted != 1 {
		t.Fatalf("the rogue attached %d rules of cost %d to its node (each within the budget of %d); want the second refused", accepted, c.Cost, stoprule.CostBudget)
	}
	if connect.CodeOf(refusal) != connect.CodeResourceExhausted || !strings.Contains(refusal.Error(), "cost") {
		t.Fatalf("the second expensive rule: %v, want resource_exhausted naming the cost", refusal)
	}
	list, err := admin.StopRule.ListStopRules(ctx, connect.NewRequest(&tetherv1.ListStopRulesRequest{NodeId: rogue.Node.NodeId}))
	if err != nil || len(list.Msg.Rules) != 1 {
		t.Fatalf("rules on the rogue's node: %v %v, want the one accepted", list.Msg.GetRules(), err)
	}
	addRule(t, rc, &tetherv1.AddStopRuleRequest{NodeId: rogue.Node.NodeId, Name: "cheap", Expression: `observed.calls > 1000`})
	addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: rogue.Node.NodeId, Name: "operators-own", Expression: expensive})
}

// A rogue cannot flood its operators' queue through its own stop rules. A
// tree's agents share a bound on their pending stop proposals
// (supervisor.MaxPendingProposalsPerTree), but a stop rule's proposal was
// not counted — right for an operator's rule, which carries the operator's
// authority, but an agent's rule carries only the agent's: a rogue that
// attached 64 rules true at once to itself, removed them (its own rules)
// and attached 64 more, filed 64 pending proposals a round, without bound,
// each waiting for an operator and answered in every ListProposals. An
// agent's rule's proposal now counts in its tree's bound: past it the rule
// files nothing (it fires once there is room), and the rogue's own
// ProposeStop is refused; its operator's rules on it still file theirs.
// (Fails with 192 of the rogue's proposals pending after three rounds.)
func TestARogueCannotFloodTheOperatorsQueueThroughItsOwnRules(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	ctx := context.Background()
	root := register(t, admin, "rogue")
	rc := srv.Clients(root.Credential)
	const rounds = 3
	for round := range rounds {
		var ids []string
		for i := range stoprule.MaxRulesPerNode {
			r := addRule(t, rc, &tetherv1.AddStopRuleRequest{NodeId: root.Node.NodeId, Name: fmt.Sprintf("r%d-%02d", round, i), Expression: `observed.calls >= 0`})
			ids = append(ids, r.RuleId)
		}
		// The operator's rule, added last, is evaluated with the rogue's
		// (every rule in effect at the node, one pass): once it filed, so
		// had theirs, or they found no room.
		op := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: root.Node.NodeId, Name: fmt.Sprintf("operator-%d", round), Expression: `observed.calls >= 0`})
		waitRuleProposal(t, srv, op.RuleId)
		for _, id := range ids {
			if _, err := rc.StopRule.RemoveStopRule(ctx, connect.NewRequest(&tetherv1.RemoveStopRuleRequest{RuleId: id})); err != nil {
				t.Fatal(err)
			}
		}
	}
	resp, err := admin.Supervisor.ListProposals(ctx, connect.NewRequest(&tetherv1.ListProposalsRequest{State: tetherv1.ProposalState_PROPOSAL_STATE_PENDING}))
	if err != nil {
		t.Fatal(err)
	}
	agents, operators := 0, 0
	for _, p := range resp.Msg.Proposals {
		switch {
		case strings.HasPrefix(p.Rule.GetSetBy(), "agent:"):
			agents++
		case p.Rule != nil:
			operators++
		}
	}
	if agents > supervisor.MaxPendingProposalsPerTree {
		t.Fatalf("%d proposals of the rogue's rules pending after %d rounds; its tree's bound is %d", agents, rounds, supervisor.MaxPendingProposalsPerTree)
	}
	if operators != rounds {
		t.Fatalf("%d proposals of the operator's rules pending, want %d", operators, rounds)
	}
	_, err = rc.Agent.ProposeStop(ctx, connect.NewRequest(&tetherv1.ProposeStopRequest{Condition: "now", Reason: "one more"}))
	if connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("the rogue's own proposal with its tree full: %v, want resource_exhausted", err)
	}
}
