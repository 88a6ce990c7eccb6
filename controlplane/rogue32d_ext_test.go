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

// The thirty-second rogue pass (helper D), the control plane's side of the
// MCP gateway's reports.

// A tool server's report that it served the holder of a token past its
// expiry is that holder's dead credential at work, as one of a revoked
// grant is: after the holder's claim of exit, a contradiction. The control
// plane could not verify an expired token and refused the report noting
// nothing, so a rogue that claimed its exit and outlived its token (no one
// renews a claimed node's) was served by its gateway — over stdio its
// ping and initialize, over HTTP a 401 — with the record reading its exit
// confirmed. (Fails if the report of the expired token notes nothing.)
func TestRogue32DSeenReportOfAnExpiredTokenContradictsAClaim(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx := context.Background()
	root := register(t, admin, "root")
	self := root.Node.NodeId
	agent := srv.Clients(root.Credential)
	grant := issueRoot(t, admin, self, 10*time.Minute, "tool:shell")
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
	clk.Advance(time.Minute)
	sess.close()
	testserver.WaitFor(t, time.Minute, "the control plane to see the session end", func() bool { return getNode().SessionClosedAt != nil })
	clk.Advance(time.Minute)
	if _, err := agent.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: self, Reason: "done"})); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Hour) // the token long expired
	if err := seen(); err == nil {
		t.Fatal("the report of an expired token began a call")
	}
	n := getNode()
	if len(n.Contradictions) != 1 || n.Contradictions[0].Kind != "request" {
		t.Fatalf("contradictions after the report of a claimed node's expired token: %v; want one, of a request", n.Contradictions)
	}

	// A token that does not verify but for its expiry names no one.
	forged := grant.token[:len(grant.token)-4] + "AAAA"
	if forged == grant.token {
		forged = grant.token[:len(grant.token)-4] + "BBBB"
	}
	if _, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: forged, Tool: ledger.SeenTool, GateId: "gate-1"})); err == nil {
		t.Fatal("the report of a forged token began a call")
	}
	if n := getNode(); len(n.Contradictions) != 1 {
		t.Fatalf("a forged expired token was noted on its named holder: %v", n.Contradictions)
	}
}
