package controlplane_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// A rogue that keeps many calls in flight only between two evaluations —
// it begins a burst and ends it before the evaluator reads its node — is
// never seen by a rule over the level calls_in_flight. The high-water
// mark calls_in_flight_max is written in each call's own transaction, so
// the burst is judged at its peak whenever the rule is read.
func TestRogue26ABurstOfCallsEndedBeforeAnyRuleReadsIsSeenAtItsPeak(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	root := register(t, admin, "planner")
	worker := spawn(t, srv.Clients(root.Credential), root.Node.NodeId, "worker")
	grant := issueRoot(t, admin, worker.Node.NodeId, time.Hour, "tool:*")
	gate := srv.Clients(srv.ToolServerToken(t, "rules-gate"))
	ctx := context.Background()

	const burst = 8
	var ids []string
	for range burst {
		begun, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: grant.token, Tool: "shell", GateId: "rules-gate"}))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, begun.Msg.Call.CallId)
	}
	for _, id := range ids {
		if _, err := gate.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: id, GateId: "rules-gate"})); err != nil {
			t.Fatal(err)
		}
	}
	// One more call alone: the peak stays the burst's.
	gateCall(t, srv, grant.token, "shell", false)

	// The operator writes the rules after the burst: the level reads 0.
	level := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: worker.Node.NodeId, Name: "level", Expression: `observed.calls_in_flight >= 8`})
	peak := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: worker.Node.NodeId, Name: "peak", Expression: `observed.calls_in_flight_max >= 8`})
	above := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: worker.Node.NodeId, Name: "above", Expression: `observed.calls_in_flight_max > 8`})
	p := waitRuleProposal(t, srv, peak.RuleId)
	if v := valueOf(p.Rule.Values, "observed.calls_in_flight_max"); v.GetValue() != "8" || v.SelfReported {
		t.Fatalf("proposal's values %v, want calls_in_flight_max = 8 observed by the control plane", p.Rule.Values)
	}
	tr, err := admin.StopRule.TestStopRule(ctx, connect.NewRequest(&tetherv1.TestStopRuleRequest{NodeId: worker.Node.NodeId, RuleId: above.RuleId}))
	if err != nil {
		t.Fatal(err)
	}
	if tr.Msg.Result || tr.Msg.Observed.CallsInFlight != 0 || tr.Msg.Observed.CallsInFlightMax != burst || tr.Msg.Observed.Calls != burst+1 {
		t.Fatalf("observed %v (fired %v), want 0 in flight, a peak of %d and %d calls", tr.Msg.Observed, tr.Msg.Result, burst, burst+1)
	}
	if got := ruleProposals(t, srv, level.RuleId); len(got) != 0 {
		t.Fatalf("the level rule filed %d proposals with nothing in flight", len(got))
	}
}
