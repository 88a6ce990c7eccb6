package controlplane_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The thirty-fourth hostile pass, stop rules: the rogue is an agent an
// operator held to no call over 300 seconds anywhere in its subtree.

// An operator's rule on the rogue bounds its subtree's longest call at 300
// seconds. The rogue's child keeps one call open and, beside it, twenty
// short ones it ends and opens afresh every 100 seconds. The subtree's
// longest open call counted as the oldest mean age of a shard's open
// calls: 400 s and twenty of at most 100 s read about 114 s, and the rule
// never fired however long the call stayed open. Now the rule files for
// the rogue at the first tick past 300 seconds, naming the long call's
// 400; once the calls end they stop counting as open (a call's end takes
// it out of the listing the subtree's longest open call is read from).
func TestRogue34DShortCallsKeptOpenDoNotHideALongOneFromTheSubtreesRule(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	rogue := register(t, admin, "rogue")
	rule := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: rogue.Node.NodeId, Name: "subtree-slow-call", Expression: `observed.subtree_call_seconds_max > 300.0`})
	kid := spawn(t, srv.Clients(rogue.Credential), rogue.Node.NodeId, "kid")
	gate := srv.Clients(srv.ToolServerToken(t, "r33d-gate"))
	token := issueRoot(t, admin, kid.Node.NodeId, time.Hour, "tool:*").token
	long := rogue33dBegin(t, gate, token)
	var short []string
	for range 20 {
		short = append(short, rogue33dBegin(t, gate, token))
	}
	for range 4 {
		rogue33dTick(t, clk, 100*time.Second)
		token = issueRoot(t, admin, kid.Node.NodeId, time.Hour, "tool:*").token // (tokens live minutes)
		for i, id := range short {
			if _, err := gate.Tool.EndCall(context.Background(), connect.NewRequest(&tetherv1.EndCallRequest{CallId: id, GateId: "r33d-gate"})); err != nil {
				t.Fatalf("end: %v", err)
			}
			short[i] = rogue33dBegin(t, gate, token)
		}
	}
	p := rogue33dProposal(t, srv, rule.RuleId, rogue.Node.NodeId)
	if v := valueOf(p.Rule.Values, `observed.subtree_call_seconds_max`); v.GetValue() != "400" || v.SelfReported {
		t.Fatalf("proposal values %v, want observed.subtree_call_seconds_max = 400 (the long call), observed", p.Rule.Values)
	}
	// Every call ends but one begun now: a call's end takes it out of the
	// listing, so 1,000 s later the subtree's longest call is that one's
	// 1,000 s (the long call took 400), not a call ended long ago.
	ctx := context.Background()
	for _, id := range append(short, long) {
		if _, err := gate.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: id, GateId: "r33d-gate"})); err != nil {
			t.Fatalf("end: %v", err)
		}
	}
	rogue33dBegin(t, gate, issueRoot(t, admin, kid.Node.NodeId, time.Hour, "tool:*").token)
	clk.Advance(1000 * time.Second)
	tr, err := admin.StopRule.TestStopRule(ctx, connect.NewRequest(&tetherv1.TestStopRuleRequest{NodeId: rogue.Node.NodeId, Expression: `observed.subtree_call_seconds_max == 1000.0`}))
	if err != nil {
		t.Fatal(err)
	}
	if !tr.Msg.Result {
		t.Fatalf("the calls ended, one 1,000 s open: the rogue's subtree reads %v, want observed.subtree_call_seconds_max = 1000", tr.Msg.Values)
	}
}
