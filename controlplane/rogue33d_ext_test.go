package controlplane_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/stoprule"
	"github.com/tetherhq/tether/supervisor/tree"
)

// The thirty-third hostile pass, stop rules: the rogue is an agent an
// operator bounded by a rule on how long its calls take, and it never
// ends them.

// rogue33dBegin has token's holder begin a call through gate and leaves
// it open; it returns the call's id.
func rogue33dBegin(t *testing.T, gate *testserver.Clients, token string) string {
	t.Helper()
	begun, err := gate.Tool.BeginCall(context.Background(), connect.NewRequest(&tetherv1.BeginCallRequest{Token: token, Tool: "fetch", GateId: "r33d-gate"}))
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	return begun.Msg.Call.CallId
}

// rogue33dTick moves clk by d once the evaluator has armed its tick (so
// that the tick fires at the new time).
func rogue33dTick(t *testing.T, clk *clock.Manual, d time.Duration) {
	t.Helper()
	testserver.WaitFor(t, 20*time.Second, "the evaluator to arm its tick", func() bool { return clk.Armed(clk.Now().Add(stoprule.DefaultTick)) })
	clk.Advance(d)
}

// rogue33dProposal waits for rule's proposal for node.
func rogue33dProposal(t *testing.T, srv *testserver.Server, ruleID, node string) *tetherv1.StopProposal {
	t.Helper()
	var got *tetherv1.StopProposal
	testserver.WaitFor(t, 20*time.Second, "rule "+ruleID+" to file its proposal for "+node, func() bool {
		for _, p := range ruleProposals(t, srv, ruleID) {
			if p.NodeId == node {
				got = p
			}
		}
		return got != nil
	})
	return got
}

// An operator held the rogue to 100 seconds of tool calls over its
// subtree, and its agents to no call over 100 seconds. A call's time
// counted only at its end, so the rogue, and a child it spawned after the
// rules, each began one call and never ended it: an hour later no rule
// had fired, and none ever would. Now a call counts its time while open,
// and the evaluator judges a node with calls open again every tick: the
// subtree rule files for the rogue once the two open calls add up past
// 100 seconds (the kid's 110 and the rogue's own 80, naming what it read),
// the per-call rule for the kid once its call is 110 seconds open and for
// the rogue only once its own is (the kid's call is not the rogue's own).
func TestRogue33DCallsHeldOpenForeverCountAgainstCallTimeRules(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	rogue := register(t, admin, "rogue")
	subtree := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: rogue.Node.NodeId, Name: "subtree-call-time", Expression: `observed.subtree_call_seconds_total > 100.0`})
	own := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: rogue.Node.NodeId, Name: "slow-call", Expression: `observed.call_seconds_max > 100.0`})
	kid := spawn(t, srv.Clients(rogue.Credential), rogue.Node.NodeId, "kid")
	gate := srv.Clients(srv.ToolServerToken(t, "r33d-gate"))
	rogue33dBegin(t, gate, issueRoot(t, admin, kid.Node.NodeId, time.Hour, "tool:*").token)
	clk.Advance(30 * time.Second)
	rogue33dBegin(t, gate, issueRoot(t, admin, rogue.Node.NodeId, time.Hour, "tool:*").token)

	rogue33dTick(t, clk, 80*time.Second) // the kid's call 110 s open, the rogue's 80 s
	p := rogue33dProposal(t, srv, subtree.RuleId, rogue.Node.NodeId)
	if v := valueOf(p.Rule.Values, `observed.subtree_call_seconds_total`); v.GetValue() != "190" || v.SelfReported {
		t.Fatalf("proposal values %v, want observed.subtree_call_seconds_total = 190 (110 s and 80 s open), observed", p.Rule.Values)
	}
	p = rogue33dProposal(t, srv, own.RuleId, kid.Node.NodeId)
	if v := valueOf(p.Rule.Values, `observed.call_seconds_max`); v.GetValue() != "110" {
		t.Fatalf("the kid's proposal values %v, want observed.call_seconds_max = 110", p.Rule.Values)
	}
	for _, p := range ruleProposals(t, srv, own.RuleId) {
		if p.NodeId == rogue.Node.NodeId {
			t.Fatalf("the rogue's own call is 80 s open; the 100-second rule filed for it: %v", p.Rule.Values)
		}
	}
	rogue33dTick(t, clk, 30*time.Second) // the rogue's own call 110 s open
	p = rogue33dProposal(t, srv, own.RuleId, rogue.Node.NodeId)
	if v := valueOf(p.Rule.Values, `observed.call_seconds_max`); v.GetValue() != "110" {
		t.Fatalf("the rogue's proposal values %v, want observed.call_seconds_max = 110", p.Rule.Values)
	}
}

// A rogue under an honest planner begins a call and never ends it; its
// operator aborts it, the gate never acknowledges the cancel, and the
// termination closes the call cancel_unacknowledged. Open calls now count
// their time at their ancestors until they end; a call the termination
// closed must end there too, or the planner's subtree would count the
// rogue's dead call forever and its operator's rule on call time stop the
// planner for it. The planner's subtree counts the call as it ended: the
// seconds until the termination stopped waiting, not a second more.
func TestRogue33DACallItsTerminationClosedStopsCountingAtItsAncestors(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	planner := register(t, admin, "planner")
	rule := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: planner.Node.NodeId, Name: "subtree-call-time", Expression: `observed.subtree_call_seconds_total > 1000.0`})
	rogue := spawn(t, srv.Clients(planner.Credential), planner.Node.NodeId, "rogue")
	gate := srv.Clients(srv.ToolServerToken(t, "r33d-gate"))
	rogue33dBegin(t, gate, issueRoot(t, admin, rogue.Node.NodeId, time.Hour, "tool:*").token)
	term := terminate(t, admin, rogue.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 5*time.Second, 0)
	testserver.WaitFor(t, 20*time.Second, "the cancel order", func() bool {
		return getTermination(t, admin, term.TerminationId).Progress.GetAcksPending() == 1
	})
	clk.Advance(6 * time.Second)
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	if c := record(t, admin, term.TerminationId).ToolCalls; len(c) != 1 || c[0].Resolution != tetherv1.CallResolution_CALL_RESOLUTION_CANCEL_UNACKNOWLEDGED {
		t.Fatalf("record calls %v, want the call closed cancel_unacknowledged", c)
	}
	rogue33dTick(t, clk, time.Hour)
	tr, err := admin.StopRule.TestStopRule(context.Background(), connect.NewRequest(&tetherv1.TestStopRuleRequest{NodeId: planner.Node.NodeId, RuleId: rule.RuleId}))
	if err != nil {
		t.Fatal(err)
	}
	v := valueOf(tr.Msg.Values, `observed.subtree_call_seconds_total`)
	if tr.Msg.Result || v == nil || v.Value == "0" || len(v.Value) > 2 {
		t.Fatalf("an hour after the rogue's call was closed the planner's subtree reads %v (result %v), want the seconds until it was closed", tr.Msg.Values, tr.Msg.Result)
	}
	if got := ruleProposals(t, srv, rule.RuleId); len(got) != 0 {
		t.Fatalf("the rule filed %v for the rogue's closed call", got)
	}
}

// An embedder raised TreeLimits.MaxLabels to 64. The stop rules' cost
// estimate bounds a node's labels at 32, so an operator's rule that loops
// over them twice, accepted as within the budget, costs past it on a node
// of 64 labels: its evaluation is stopped at the budget, fails, and never
// fires, and a rogue's parent gives it 64 labels to be past the rule. A
// server whose tree allows more labels than the estimate bounds is now
// refused at its start, naming the bound.
func TestRogue33DTreeLimitsPastTheRulesLabelBoundAreRefused(t *testing.T) {
	limits := tree.DefaultLimits
	limits.MaxLabels = stoprule.MaxLabels + 32
	_, err := controlplane.New(context.Background(), controlplane.Config{DataDir: t.TempDir(), Logger: quietLogger(), TreeLimits: limits})
	if err == nil || !strings.Contains(err.Error(), "MaxLabels") || !strings.Contains(err.Error(), "32") {
		t.Fatalf("a tree of 64 labels a node served: %v, want a refusal naming MaxLabels and the bound of 32", err)
	}
	limits.MaxLabels = stoprule.MaxLabels
	srv, err := controlplane.New(context.Background(), controlplane.Config{DataDir: t.TempDir(), Logger: quietLogger(), TreeLimits: limits})
	if err != nil {
		t.Fatalf("a tree of 32 labels a node: %v", err)
	}
	srv.Close()
}
