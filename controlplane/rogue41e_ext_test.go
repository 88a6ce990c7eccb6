package controlplane_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"testing"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The forty-first hostile pass, stop rules: the rogue under its planner's
// rule on its subtree's reported spend erases what an honest worker
// reported, by the rounding of the records that add the reports up.

// rogue41eShard is the record of each ancestor a node's reports add to
// (stoprule's growShard: FNV-1a of the node id, of 256).
func rogue41eShard(nodeID string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(nodeID))
	return h.Sum32() % 256
}

// TestRogue41ETheRoguesHugeReportTakenBackDoesNotDodgeItsPlannersRule: two
// honest workers of the rogue reported 60 each, 120 under its planner's
// rule `subtree_reported.cost_usd > 100` on it. The rogue spawned hands
// until one shared the first worker's record of each ancestor, and had it
// report 1e300 and then 0: the record held 60 + 1e300, rounded to 1e300,
// then 0, the rogue's subtree read 60, and the planner's rule never filed.
// The records now round each change up: the rule files for the rogue (and
// for no other node: each worker's own 60 is under the bound).
func TestRogue41ETheRoguesHugeReportTakenBackDoesNotDodgeItsPlannersRule(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	ctx := context.Background()
	planner := register(t, admin, "planner")
	rogue := spawn(t, srv.Clients(planner.Credential), planner.Node.NodeId, "rogue")
	rc := srv.Clients(rogue.Credential)
	report := func(n *tetherv1.SpawnResponse, spent float64) {
		t.Helper()
		if _, err := srv.Clients(n.Credential).StopRule.ReportCounters(ctx, connect.NewRequest(&tetherv1.ReportCountersRequest{Counters: map[string]float64{"cost_usd": spent}})); err != nil {
			t.Fatal(err)
		}
	}
	first := spawn(t, rc, rogue.Node.NodeId, "worker-0")
	var second *tetherv1.SpawnResponse
	for i := 1; second == nil; i++ {
		if w := spawn(t, rc, rogue.Node.NodeId, fmt.Sprintf("worker-%d", i)); rogue41eShard(w.Node.NodeId) != rogue41eShard(first.Node.NodeId) {
			second = w
		}
	}
	report(first, 60)
	report(second, 60)
	var hand *tetherv1.SpawnResponse
	for i := 0; hand == nil; i++ {
		if i == 5000 {
			t.Fatal("no hand of 5000 shares the worker's record")
		}
		if h := spawn(t, rc, rogue.Node.NodeId, fmt.Sprintf("hand-%d", i)); rogue41eShard(h.Node.NodeId) == rogue41eShard(first.Node.NodeId) {
			hand = h
		}
	}
	report(hand, 1e300)
	report(hand, 0)
	rule := addRule(t, srv.Clients(planner.Credential), &tetherv1.AddStopRuleRequest{NodeId: rogue.Node.NodeId, Name: "subtree-spend", Expression: `subtree_reported.?cost_usd.orValue(0.0) > 100.0`})
	tested, err := admin.StopRule.TestStopRule(ctx, connect.NewRequest(&tetherv1.TestStopRuleRequest{NodeId: rogue.Node.NodeId, RuleId: rule.RuleId}))
	if err != nil {
		t.Fatal(err)
	}
	if v := valueOf(tested.Msg.Values, "subtree_reported.cost_usd"); !tested.Msg.Result {
		t.Fatalf("the rogue's subtree spend reads %v (fired %v) after its hand's 1e300 taken back, want at least the workers' 120", v.GetValue(), tested.Msg.Result)
	}
	p := waitRuleProposal(t, srv, rule.RuleId)
	if p.NodeId != rogue.Node.NodeId {
		t.Fatalf("the planner's rule filed for %s, want the rogue %s", p.NodeId, rogue.Node.NodeId)
	}
	for _, p := range ruleProposals(t, srv, rule.RuleId) {
		if p.NodeId != rogue.Node.NodeId {
			t.Fatalf("the planner's rule filed for %s too", p.NodeId)
		}
	}
}
