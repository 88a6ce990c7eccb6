package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestARulesEvaluationErrorCannotRewriteTheOperatorsScreen: a parent
// agent sets a rule on its child whose map key (a CEL string, escapes and
// all) is an escape sequence that clears the screen, a line break and a
// forged `result:` line. `tether rule test --rule` printed the
// evaluation's error ("no such key: …") raw: the operator's screen was
// cleared and read "result:  true". It is printed as printable shows any
// agent's text now, and so is the rule (its name and expression). (Fails
// if the output holds an escape character, or a second line that starts
// "result:".)
func TestARulesEvaluationErrorCannotRewriteTheOperatorsScreen(t *testing.T) {
	srv := testserver.Start(t)
	ctx := context.Background()
	admin := srv.AdminClients()
	root, err := admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "rogue"}))
	if err != nil {
		t.Fatal(err)
	}
	rogue := srv.Clients(root.Msg.Credential)
	child, err := rogue.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: root.Msg.Node.NodeId, Name: "worker"}))
	if err != nil {
		t.Fatal(err)
	}
	forged := `\u001b[2J\u001b[H\nresult:  true (cost 1)\n`
	rule, err := rogue.StopRule.AddStopRule(ctx, connect.NewRequest(&tetherv1.AddStopRuleRequest{
		NodeId: child.Msg.Node.NodeId, Name: "innocent",
		Expression: `observed.calls_by_tool["` + forged + `"] > 0`,
	}))
	if err != nil {
		t.Fatal(err)
	}
	out := mustCLI(t, srv.URL, srv.Admin, "rule", "test", child.Msg.Node.NodeId, "--rule", rule.Msg.Rule.RuleId)
	if strings.ContainsRune(out, '\x1b') {
		t.Errorf("tether rule test printed an escape character:\n%q", out)
	}
	results := 0
	for line := range strings.Lines(out) {
		if strings.HasPrefix(line, "result:") {
			results++
		}
	}
	if results != 1 || !strings.Contains(out, "result:  false") || !strings.Contains(out, `\x1b[2J`) {
		t.Errorf("tether rule test printed %d result lines, want one (false) and the key written out:\n%s", results, out)
	}
}

// TestAStopRulesPendingProposalIsListedByProposalLs: `tether proposal ls
// --node N --pending` read the node's pending index, which a stop rule's
// proposal was not in: the operator's rule had filed a proposal waiting
// for them, and the listing said none. (Fails if the listing, of the node
// or of every node, lacks the rule's pending proposal.)
func TestAStopRulesPendingProposalIsListedByProposalLs(t *testing.T) {
	srv := testserver.Start(t)
	ctx := context.Background()
	admin := srv.AdminClients()
	root, err := admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "worker"}))
	if err != nil {
		t.Fatal(err)
	}
	node := root.Msg.Node.NodeId
	if _, err := admin.StopRule.AddStopRule(ctx, connect.NewRequest(&tetherv1.AddStopRuleRequest{NodeId: node, Name: "tiny-budget", Expression: `self_reported.?cost_usd.orValue(0.0) > 1.0`})); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Clients(root.Msg.Credential).StopRule.ReportCounters(ctx, connect.NewRequest(&tetherv1.ReportCountersRequest{Counters: map[string]float64{"cost_usd": 2}})); err != nil {
		t.Fatal(err)
	}
	var proposal string
	testserver.WaitFor(t, 20*time.Second, "the rule's proposal", func() bool {
		got, err := admin.Supervisor.ListProposals(ctx, connect.NewRequest(&tetherv1.ListProposalsRequest{NodeId: node}))
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Msg.Proposals) == 1 {
			proposal = got.Msg.Proposals[0].ProposalId
		}
		return proposal != ""
	})
	for _, args := range [][]string{{"proposal", "ls", "--node", node, "--pending"}, {"proposal", "ls", "--pending"}} {
		if out := mustCLI(t, srv.URL, srv.Admin, args...); !strings.Contains(out, proposal) || !strings.Contains(out, "pending") {
			t.Errorf("tether %s lacks the rule's pending proposal %s:\n%s", strings.Join(args, " "), proposal, out)
		}
	}
}
