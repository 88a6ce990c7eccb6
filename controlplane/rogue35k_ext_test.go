package controlplane_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The thirty-fifth hostile pass, stop rules: the rogue keeps many calls
// open at once, split among its children so that no node has many of its
// own.

// An operator held a rogue to 10 calls in flight over its subtree. The
// rogue's three children each begin four calls through a gate and keep
// them open: 12 open, never more than 4 at a node, so a rule on
// calls_in_flight (a node's own) never fired and no variable counted a
// subtree's. subtree_calls_in_flight counts them: the evaluator, woken by
// the children's calls, files the rule's proposal for the rogue naming the
// 12 it read. A child's calls its termination closed (cancel_unacknowledged,
// the gate never acknowledging) stop counting: the rogue then reads 8.
// Before, the rule was refused (no such field).
func TestRogue35KCallsKeptOpenAcrossChildrenFireASubtreeRule(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	rogue := register(t, admin, "rogue")
	rule := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: rogue.Node.NodeId, Name: "subtree-in-flight", Expression: `observed.subtree_calls_in_flight > 10`})
	gate := srv.Clients(srv.ToolServerToken(t, "r33d-gate"))
	var kids []*tetherv1.SpawnResponse
	for i := range 3 {
		kid := spawn(t, srv.Clients(rogue.Credential), rogue.Node.NodeId, fmt.Sprintf("kid%d", i))
		kids = append(kids, kid)
		token := issueRoot(t, admin, kid.Node.NodeId, time.Hour, "tool:*").token
		for range 4 {
			rogue33dBegin(t, gate, token)
		}
	}
	p := rogue33dProposal(t, srv, rule.RuleId, rogue.Node.NodeId)
	// Judged as the calls began: at the 11th or the 12th.
	if v := valueOf(p.Rule.Values, `observed.subtree_calls_in_flight`); (v.GetValue() != "11" && v.GetValue() != "12") || v.SelfReported {
		t.Fatalf("proposal values %v, want observed.subtree_calls_in_flight = 11 or 12, observed", p.Rule.Values)
	}
	if got := rogue35kInFlight(t, admin, rogue.Node.NodeId, rule.RuleId); got != 12 {
		t.Fatalf("12 calls open below the rogue: it reads subtree_calls_in_flight = %d", got)
	}

	term := terminate(t, admin, kids[0].Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 5*time.Second, 0)
	testserver.WaitFor(t, 20*time.Second, "the cancel orders", func() bool {
		return getTermination(t, admin, term.TerminationId).Progress.GetAcksPending() == 4
	})
	clk.Advance(6 * time.Second)
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	if got := rogue35kInFlight(t, admin, rogue.Node.NodeId, rule.RuleId); got != 8 {
		t.Fatalf("the kid's 4 calls closed by its termination: the rogue reads subtree_calls_in_flight = %d, want 8", got)
	}
}

// rogue35kInFlight tests rule at node and returns the subtree_calls_in_flight
// it read, checking that TestStopRule's values and observations agree.
func rogue35kInFlight(t *testing.T, admin *testserver.Clients, node, ruleID string) int64 {
	t.Helper()
	tr, err := admin.StopRule.TestStopRule(context.Background(), connect.NewRequest(&tetherv1.TestStopRuleRequest{NodeId: node, RuleId: ruleID}))
	if err != nil {
		t.Fatal(err)
	}
	got := tr.Msg.Observed.GetSubtreeCallsInFlight()
	if v := valueOf(tr.Msg.Values, `observed.subtree_calls_in_flight`); v.GetValue() != fmt.Sprint(got) || tr.Msg.Result != (got > 10) {
		t.Fatalf("TestStopRule: values %v, result %v, observed subtree_calls_in_flight %d: they disagree", tr.Msg.Values, tr.Msg.Result, got)
	}
	return got
}

// TestRogue35KFencedSideEffectAfterAConfirmedExitIsRefusedOnEtcd is the
// essence of TestRogue35AFencedSideEffectAfterAConfirmedExitIsRefusedAndCounted
// on a server on etcd: a job lease's holder claims its exit (its session
// ended before), then a fenced tool server asks about its side effect
// under its generation. GetLease answers holder_exited with no expiry,
// the fence refuses naming the exit, and the read is kept on the holder
// as a tool call after its confirmed exit.
func TestRogue35KFencedSideEffectAfterAConfirmedExitIsRefusedOnEtcd(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the etcd stores; make test and CI run them.")
	}
	w := newLeaseWorldOnEtcd(t)
	ctx := context.Background()
	toolToken := w.srv.ToolServerToken(t, "rogue35k-tool")
	tool := w.srv.Clients(toolToken)
	fence := &agentsdk.Fence{Check: agentsdk.IssuedGenerations(agentsdk.Dial(w.srv.URL, toolToken, agentsdk.WithHTTPClient(w.srv.HTTP)))}
	job := w.job()
	rogue, d := unary{w.w1C}.send(t, ack(w.offer(t, job, w.w1, 10*time.Minute)))
	wantDecision(t, "the rogue's ack", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_ACKED)
	if err := fence.AdmitContext(ctx, job, rogue.LeaseGeneration); err != nil {
		t.Fatalf("the rogue's side effect before its exit: %v", err)
	}
	w1ExitsThenWritesThroughTheFence(t, w, fence, tool, "rogue35k-tool", job, rogue.LeaseGeneration)
}
