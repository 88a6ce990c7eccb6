package controlplane_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/ledger"
)

// The thirtieth rogue pass (helper A), the control plane's side of the MCP
// gateway's report that it served a node (ledger.SeenTool).

// A tool server's report that it served a token's holder begins nothing
// and needs no scope: for a running node with its session open it changes
// nothing (no call in the ledger, no write), and after the node's claim of
// exit it is kept as a contradiction. (Fails if the report begins a call,
// or is not kept after the claim.)
func TestRogue30ASeenReportBeginsNothingAndContradictsAClaim(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx := context.Background()
	root := register(t, admin, "root")
	self := root.Node.NodeId
	agent := srv.Clients(root.Credential)
	grant := issueRoot(t, admin, self, time.Hour, "tool:shell")
	gate := srv.Clients(srv.ToolServerToken(t, "gate-1"))
	seen := func() error {
		_, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: grant.token, Tool: ledger.SeenTool, GateId: "gate-1"}))
		return err
	}
	getNode := func() *tetherv1.Node {
		resp, err := admin.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: self}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg.Node
	}

	sess, err := openSession(t, agent, self)
	if err != nil {
		t.Fatal(err)
	}
	before := getNode()
	if err := seen(); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("the report of a running node: %v; want failed_precondition (nothing begun)", err)
	}
	calls, err := admin.Tool.ListCalls(ctx, connect.NewRequest(&tetherv1.ListCallsRequest{NodeId: self}))
	if err != nil {
		t.Fatal(err)
	}
	if len(calls.Msg.Calls) != 0 {
		t.Fatalf("the report began %d calls: %v", len(calls.Msg.Calls), calls.Msg.Calls)
	}
	if after := getNode(); !after.LastSeenAt.AsTime().Equal(before.LastSeenAt.AsTime()) || len(after.Contradictions) != 0 {
		t.Fatalf("the report of a running node with its session open changed it: last seen %v → %v, contradictions %v", before.LastSeenAt.AsTime(), after.LastSeenAt.AsTime(), after.Contradictions)
	}

	clk.Advance(time.Minute)
	sess.close()
	testserver.WaitFor(t, time.Minute, "the control plane to see the session end", func() bool { return getNode().SessionClosedAt != nil })
	clk.Advance(time.Minute)
	if _, err := agent.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: self, Reason: "done"})); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Minute)
	if err := seen(); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("the report after the claim: %v; want failed_precondition (nothing begun)", err)
	}
	n := getNode()
	if len(n.Contradictions) != 1 || n.Contradictions[0].Kind != "request" {
		t.Fatalf("contradictions after the report of a claimed node: %v; want one, of a request", n.Contradictions)
	}
}
