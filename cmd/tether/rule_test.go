package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

func TestRuleCommands(t *testing.T) {
	srv := testserver.Start(t)
	ctx := context.Background()
	admin := srv.AdminClients()
	root, err := admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "planner"}))
	if err != nil {
		t.Fatal(err)
	}
	rootID, rootCred := root.Msg.Node.NodeId, root.Msg.Credential
	child, err := srv.Clients(rootCred).Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: rootID, Name: "worker"}))
	if err != nil {
		t.Fatal(err)
	}
	childID, childCred := child.Msg.Node.NodeId, child.Msg.Credential

	// The planner (its own credential) bounds its worker.
	var added tetherv1.AddStopRuleResponse
	out := mustCLI(t, srv.URL, rootCred, "rule", "add", "--node", childID, "--name", "spawn-cap", "--severity", "critical", "--label", "team=research",
		"observed.subtree_size > 20", "-o", "json")
	if err := protojson.Unmarshal([]byte(out), &added); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if added.Rule.SetBy != "agent:"+rootID || added.Rule.Labels["team"] != "research" || added.EstimatedCost == 0 || added.CostBudget == 0 {
		t.Fatalf("added %v", &added)
	}
	// A bad rule: the position reaches the user.
	if _, err := cli(t, srv.URL, srv.Admin, "rule", "add", "--node", childID, "--name", "bad", "observed.calls >"); err == nil || !strings.Contains(err.Error(), "1:17") {
		t.Fatalf("bad rule: %v", err)
	}
	// The worker lists what binds it, and cannot remove it.
	out = mustCLI(t, srv.URL, childCred, "rule", "list", childID)
	if !strings.Contains(out, "spawn-cap") || !strings.Contains(out, added.Rule.RuleId) {
		t.Fatalf("list:\n%s", out)
	}
	if _, err := cli(t, srv.URL, childCred, "rule", "rm", added.Rule.RuleId); err == nil || !strings.Contains(err.Error(), "permission_denied") {
		t.Fatalf("the worker removing its parent's rule: %v", err)
	}
	// Test evaluates without acting, and shows what the rule read.
	out = mustCLI(t, srv.URL, srv.Admin, "rule", "test", rootID, "observed.subtree_size >= 2 && observed.spawns == 1")
	if !strings.Contains(out, "result:  true") || !strings.Contains(out, "observed.subtree_size = 2") || !strings.Contains(out, "observed.spawns = 1") {
		t.Fatalf("test:\n%s", out)
	}
	out = mustCLI(t, srv.URL, srv.Admin, "rule", "test", childID, "--rule", added.Rule.RuleId)
	if !strings.Contains(out, "result:  false") {
		t.Fatalf("test --rule:\n%s", out)
	}
	var all []json.RawMessage
	if err := json.Unmarshal([]byte(mustCLI(t, srv.URL, srv.Admin, "rule", "list", "-o", "json")), &all); err != nil || len(all) != 1 {
		t.Fatalf("list all: %v %d", err, len(all))
	}
	if out := mustCLI(t, srv.URL, rootCred, "rule", "rm", added.Rule.RuleId); !strings.Contains(out, "removed "+added.Rule.RuleId) {
		t.Fatalf("rm: %s", out)
	}
	if out := mustCLI(t, srv.URL, srv.Admin, "rule", "list"); strings.Contains(out, "spawn-cap") {
		t.Fatalf("after rm:\n%s", out)
	}
}
