package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// cli runs the tether command in process against url with token.
func cli(t *testing.T, url, token string, args ...string) (string, error) {
	t.Helper()
	cmd := newRootCommand()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetIn(strings.NewReader(""))
	cmd.SetArgs(append([]string{"--addr", url, "--token", token}, args...))
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

func mustCLI(t *testing.T, url, token string, args ...string) string {
	t.Helper()
	out, err := cli(t, url, token, args...)
	if err != nil {
		t.Fatalf("tether %s: %v", strings.Join(args, " "), err)
	}
	return out
}

func TestGrantCommands(t *testing.T) {
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
	leafNode, err := srv.Clients(childCred).Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: childID, Name: "helper"}))
	if err != nil {
		t.Fatal(err)
	}

	var issued tetherv1.IssueRootResponse
	out := mustCLI(t, srv.URL, srv.Admin, "grant", "root", "--holder", rootID, "--scope", "tool:*", "--scope", "s3:read:logs/*", "-o", "json")
	if err := protojson.Unmarshal([]byte(out), &issued); err != nil {
		t.Fatalf("grant root -o json: %v\n%s", err, out)
	}
	gRoot := issued.Grant.GrantId

	out = mustCLI(t, srv.URL, rootCred, "grant", "delegate", "--from", gRoot, "--holder", childID, "--scope", "tool:shell", "--scope", "tool:fs:*")
	if !strings.Contains(out, "holder:      "+childID) || !strings.Contains(out, "chain:       "+gRoot) {
		t.Fatalf("grant delegate:\n%s", out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	childToken := lines[len(lines)-1]
	var delegated tetherv1.DelegateResponse
	out = mustCLI(t, srv.URL, childCred, "grant", "delegate", "--from", grantIDOf(t, srv.URL, srv.Admin, childID), "--holder", leafNode.Msg.Node.NodeId, "--scope", "tool:shell", "-o", "json")
	if err := protojson.Unmarshal([]byte(out), &delegated); err != nil {
		t.Fatal(err)
	}
	gChild, gLeaf := delegated.Grant.ParentGrantId, delegated.Grant.GrantId

	// Escalation is refused, naming the scope.
	_, err = cli(t, srv.URL, childCred, "grant", "delegate", "--from", gChild, "--holder", leafNode.Msg.Node.NodeId, "--scope", "tool:net")
	if ce := new(connect.Error); !errors.As(err, &ce) || ce.Code() != connect.CodePermissionDenied || !strings.Contains(ce.Message(), `"tool:net"`) {
		t.Fatalf("escalating through the CLI: %v", err)
	}

	out = mustCLI(t, srv.URL, srv.Admin, "grant", "tree", gRoot)
	want := []string{
		gRoot + " → " + rootID + " [active] tool:*,s3:read:logs/*",
		"└── " + gChild + " → " + childID + " [active] tool:shell,tool:fs:*",
		"    └── " + gLeaf + " → " + leafNode.Msg.Node.NodeId + " [active] tool:shell",
	}
	if got := strings.Split(strings.TrimSpace(out), "\n"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("grant tree:\n%s\nwant:\n%s", out, strings.Join(want, "\n"))
	}

	out = mustCLI(t, srv.URL, rootCred, "grant", "revoke", gChild, "--reason", "leaked")
	if !strings.Contains(out, "revoked "+gChild) {
		t.Fatalf("grant revoke:\n%s", out)
	}
	out = mustCLI(t, srv.URL, srv.Admin, "grant", "tree", gRoot)
	if !strings.Contains(out, gChild+" → "+childID+" [revoked]") || !strings.Contains(out, gLeaf+" → "+leafNode.Msg.Node.NodeId+" [revoked via "+gChild+"]") {
		t.Fatalf("grant tree after the revocation:\n%s", out)
	}
	out = mustCLI(t, srv.URL, srv.Admin, "grant", "show", gLeaf)
	if !strings.Contains(out, "state:       revoked via "+gChild) || !strings.Contains(out, "by agent:"+rootID+" (leaked)") {
		t.Fatalf("grant show:\n%s", out)
	}
	out = mustCLI(t, srv.URL, srv.Admin, "grant", "ls", "--subtree", childID)
	if rows := strings.Split(strings.TrimSpace(out), "\n"); len(rows) != 3 || !strings.HasPrefix(rows[0], "GRANT") || strings.Count(out, "revoked") != 2 || strings.HasPrefix(out, gRoot) {
		t.Fatalf("grant ls --subtree:\n%s", out)
	}

	out, err = cli(t, srv.URL, srv.Admin, "token", "introspect", childToken)
	if !errors.Is(err, errInactive) || !strings.Contains(out, "active:   no") || !strings.Contains(out, "revoked") {
		t.Fatalf("token introspect of a revoked token: %v\n%s", err, out)
	}
	if _, err := cli(t, srv.URL, srv.Admin, "token", "refresh", gLeaf); err == nil {
		t.Fatal("refreshed a grant below a revoked one")
	}
	fresh := strings.TrimSpace(mustCLI(t, srv.URL, srv.Admin, "token", "refresh", gRoot))
	out = mustCLI(t, srv.URL, srv.Admin, "token", "introspect", fresh)
	if !strings.Contains(out, "active:   yes") || !strings.Contains(out, "holder:   "+rootID) {
		t.Fatalf("token introspect of a fresh token:\n%s", out)
	}
	if _, err := cli(t, srv.URL, srv.Admin, "grant", "revoke"); err == nil || !strings.Contains(err.Error(), "exactly one target") {
		t.Fatalf("grant revoke without a target: %v", err)
	}
}

// grantIDOf returns the only grant a node holds.
func grantIDOf(t *testing.T, url, token, nodeID string) string {
	t.Helper()
	out := mustCLI(t, url, token, "grant", "ls", "--holder", nodeID, "-o", "json")
	var grants []map[string]any
	if err := json.Unmarshal([]byte(out), &grants); err != nil || len(grants) != 1 {
		t.Fatalf("grant ls --holder %s -o json: %v\n%s", nodeID, err, out)
	}
	return grants[0]["grantId"].(string)
}
