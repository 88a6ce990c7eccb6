package mcpgate_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/internal/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// A rogue agent opens MCP sessions on the gateway in a loop and never
// closes them: each is held in the gateway's memory, and the gateway is
// the one every other agent's tool calls go through. Its sessions beyond
// the per-node maximum are refused at initialize (CodeTooManySessions,
// saying what to do), closing one makes room for one more, and another
// node still connects and calls while the rogue sits at its maximum.
func TestARogueThatOpensSessionsInALoopIsHeldToItsShare(t *testing.T) {
	w := newWorld(t, "mcp:test/echo")
	var open []*mcp.ClientSession
	for range mcpgate.DefaultMaxSessionsPerNode {
		open = append(open, connectAgent(t, w.endpoint, w.grant.Token, nil))
	}
	refused := func(what string) {
		t.Helper()
		client := mcp.NewClient(&mcp.Implementation{Name: "rogue", Version: "1"}, nil)
		hc := &http.Client{Transport: bearer{token: func() string { return w.grant.Token }, next: http.DefaultTransport}}
		cs, err := client.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: w.endpoint, HTTPClient: hc}, nil)
		if err == nil {
			_ = cs.Close()
			t.Fatalf("%s: the gateway opened a session beyond the maximum of %d per node", what, mcpgate.DefaultMaxSessionsPerNode)
		}
		if !strings.Contains(err.Error(), "MCP sessions open on this gateway, the maximum") {
			t.Fatalf("%s: %v, want a refusal saying the node is at its maximum of sessions", what, err)
		}
	}
	refused("session 17")
	refused("session 17 again")

	// Another node is not held back by the rogue's sessions.
	ctx := context.Background()
	other, err := w.admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "other"}))
	if err != nil {
		t.Fatal(err)
	}
	grant, err := w.admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{
		HolderNodeId: other.Msg.Node.NodeId, Scopes: []string{"mcp:test/echo"}, Ttl: durationpb.New(time.Hour),
	}))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := callText(t, connectAgent(t, w.endpoint, grant.Msg.Token, nil), "echo", map[string]any{"text": "hi"}); err != nil || got != "hi" {
		t.Fatalf("another node's call while the rogue is at its maximum: %q, %v", got, err)
	}

	// Closing a session (DELETE) makes room for one more, and no more.
	if err := open[0].Close(); err != nil {
		t.Fatal(err)
	}
	var again *mcp.ClientSession
	testserver.WaitFor(t, 20*time.Second, "the gateway to count the closed session out", func() bool {
		client := mcp.NewClient(&mcp.Implementation{Name: "rogue", Version: "1"}, nil)
		hc := &http.Client{Transport: bearer{token: func() string { return w.grant.Token }, next: http.DefaultTransport}}
		cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: w.endpoint, HTTPClient: hc}, nil)
		if err != nil {
			return false
		}
		again = cs
		t.Cleanup(func() { _ = cs.Close() })
		return true
	})
	if got, err := callText(t, again, "echo", map[string]any{"text": "again"}); err != nil || got != "again" {
		t.Fatalf("echo on the new session: %q, %v", got, err)
	}
	refused("session 17 after the swap")
}
