package main

import (
	"context"
	"strings"
	"testing"

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
