package controlplane_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue38FTestStopRuleReadsTheSubtreesPeak: an operator holds a
// planner's subtree to fewer than 100 calls in flight at once. The
// rogue's two children begin four calls between them and end them; the
// evaluator's count at the planner reads four. TestStopRule, one snapshot
// read on any replica, read the level: 0, whatever the evaluator had
// counted, so an operator trying a bound on the subtree's peak saw none of
// the burst. The evaluator now keeps the peak in the store as it rises,
// and TestStopRule reads it.
func TestRogue38FTestStopRuleReadsTheSubtreesPeak(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	root := register(t, admin, "planner")
	planner := root.Node.NodeId
	rogue := spawn(t, srv.Clients(root.Credential), planner, "rogue")
	var tokens []string
	for _, name := range []string{"kid0", "kid1"} {
		kid := spawn(t, srv.Clients(rogue.Credential), rogue.Node.NodeId, name)
		tokens = append(tokens, issueRoot(t, admin, kid.Node.NodeId, time.Hour, "tool:*").token)
	}
	addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: planner, Name: "peak", Expression: `observed.subtree_calls_in_flight_max >= 100`})
	// A rule added after it that fires: the evaluator has read the first
	// (and started its counts) by then.
	marker := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: planner, Name: "marker", Expression: `observed.subtree_size >= 1`})
	waitRuleProposal(t, srv, marker.RuleId)
	gate := srv.Clients(srv.ToolServerToken(t, "rules-gate"))
	ctx := context.Background()
	var calls []string
	for _, tok := range append(tokens, tokens...) {
		begun, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: tok, Tool: "shell", GateId: "rules-gate"}))
		if err != nil {
			t.Fatal(err)
		}
		calls = append(calls, begun.Msg.Call.CallId)
	}
	for _, id := range calls {
		if _, err := gate.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: id, GateId: "rules-gate"})); err != nil {
			t.Fatal(err)
		}
	}
	var got *tetherv1.TestStopRuleResponse
	testserver.WaitFor(t, 20*time.Second, "TestStopRule to read the subtree's peak of four", func() bool {
		tr, err := admin.StopRule.TestStopRule(ctx, connect.NewRequest(&tetherv1.TestStopRuleRequest{NodeId: planner, Expression: `observed.subtree_calls_in_flight_max >= 4`}))
		if err != nil {
			t.Fatal(err)
		}
		got = tr.Msg
		return tr.Msg.Result
	})
	if got.Observed.SubtreeCallsInFlightMax != 4 || got.Observed.SubtreeCallsInFlight != 0 {
		t.Errorf("TestStopRule read the peak %d and the level %d, want 4 and 0", got.Observed.SubtreeCallsInFlightMax, got.Observed.SubtreeCallsInFlight)
	}
}
