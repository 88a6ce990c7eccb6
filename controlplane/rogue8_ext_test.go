package controlplane_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/ledger"
)

// The eighth rogue pass: what the seventh left open. Each test plays one
// rogue through the real server (Badger on disk, real HTTP, real JWTs, the
// manual clock).

// openCalls counts a node's calls in flight, as an operator lists them.
func openCalls(t *testing.T, admin *testserver.Clients, node string) int {
	t.Helper()
	resp, err := admin.Tool.ListCalls(context.Background(), connect.NewRequest(&tetherv1.ListCallsRequest{NodeId: node}))
	if err != nil {
		t.Fatal(err)
	}
	return len(resp.Msg.Calls)
}

// A rogue begins tool calls on its node and never ends them: through a
// tool server it controls, or through a shared gate (an MCP gateway) whose
// upstream it keeps busy. Each open call is work for the termination that
// stops the node (a cancel order, an acknowledgement to wait for, a line
// in the record) and keeps a drain waiting, so without a bound a rogue
// inflates its termination at will. A node holds at most
// ledger.MaxOpenCallsPerNode calls in flight: the next begin is refused
// resource_exhausted, in words, and writes nothing; other nodes' calls
// through the same gate go on, and a call ended frees a slot.
func TestARogueCannotKeepUnboundedCallsOpenOnItsNode(t *testing.T) {
	srv := testserver.Start(t, testserver.WithClock(clock.NewManual(epoch)))
	admin := srv.AdminClients()
	ctx := context.Background()
	rogue := register(t, admin, "rogue")
	other := register(t, admin, "other")
	rogueToken := issueRoot(t, admin, rogue.Node.NodeId, time.Hour, "tool:*").token
	otherToken := issueRoot(t, admin, other.Node.NodeId, time.Hour, "tool:*").token
	gate := srv.Clients(srv.ToolServerToken(t, "gate-1"))
	begin := func(token string) (*tetherv1.ToolCall, error) {
		resp, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: token, Tool: "shell"}))
		if err != nil {
			return nil, err
		}
		return resp.Msg.Call, nil
	}

	var first *tetherv1.ToolCall
	for i := range ledger.MaxOpenCallsPerNode {
		c, err := begin(rogueToken)
		if err != nil {
			t.Fatalf("call %d of %d: %v", i+1, ledger.MaxOpenCallsPerNode, err)
		}
		if first == nil {
			first = c
		}
	}
	_, err := begin(rogueToken)
	if connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("call %d, with %d in flight on the node: %v, want resource_exhausted", ledger.MaxOpenCallsPerNode+1, ledger.MaxOpenCallsPerNode, err)
	}
	want := fmt.Sprintf("node %s already has %d tool calls in flight, the maximum per node", rogue.Node.NodeId, ledger.MaxOpenCallsPerNode)
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("the refusal says %q, want it to say %q", err.Error(), want)
	}
	if n := openCalls(t, admin, rogue.Node.NodeId); n != ledger.MaxOpenCallsPerNode {
		t.Fatalf("%d calls in flight on the rogue's node after the refusal, want %d (a refusal writes nothing)", n, ledger.MaxOpenCallsPerNode)
	}
	if _, err := begin(otherToken); err != nil {
		t.Fatalf("another node's call through the same gate: %v", err)
	}
	if _, err := gate.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: first.CallId})); err != nil {
		t.Fatal(err)
	}
	if _, err := begin(rogueToken); err != nil {
		t.Fatalf("a call once one of the node's calls ended: %v", err)
	}
}
