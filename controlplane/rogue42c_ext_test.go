package controlplane_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor"
)

// Forty-second hostile pass, the supervisor's termination path (letter C).

// An honest planner sets a critical stop rule on its subtree, whose policy
// action is abort. A rogue child of the planner, seeing its own worker's
// call about to make the rule true, drains that worker first with the
// longest window there is (24 h). The policy refused to take a node over
// from a stop of the same rank, and an agent's stop is an agent's stop
// whoever requested it: the rule's abort, which carries the planner's
// authority, waited pending for an operator while the worker's call ran on
// the rogue's day. The planner itself could abort the worker over its
// descendant's drain (supervisor.Supersedes); its rule now does too
// (supervisor.PolicyTakesOver), and the call is ordered to cancel.
func TestRogue42CDescendantsDrainDoesNotHoldOffItsAncestorsRuleAbort(t *testing.T) {
	srv, _ := startWithRuleAction(t, "critical", supervisor.ModeAbort)
	ctx := context.Background()
	admin := srv.AdminClients()
	planner := register(t, admin, "planner")
	plannerAgent := srv.Clients(planner.Credential)
	rogue := spawn(t, plannerAgent, planner.Node.NodeId, "rogue")
	rogueAgent := srv.Clients(rogue.Credential)
	worker := spawn(t, rogueAgent, rogue.Node.NodeId, "worker")
	gate, call := beginShellCall(t, srv, admin, worker.Node.NodeId)

	drained, err := rogueAgent.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: worker.Node.NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_DRAIN,
		DrainWindow: durationpb.New(supervisor.MaxTerminationWindow), Reason: "winding down",
	}))
	if err != nil {
		t.Fatal(err)
	}
	own := drained.Msg.Termination.TerminationId
	waitState(t, srv, own, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)

	rule := addRule(t, plannerAgent, &tetherv1.AddStopRuleRequest{
		NodeId: worker.Node.NodeId, Name: "runaway", Severity: "critical", Expression: `observed.calls >= 1`,
	})
	if rule.SetBy != "agent:"+planner.Node.NodeId {
		t.Fatalf("the rule is set by %q, want the planner", rule.SetBy)
	}
	policysAbortCancelsTheCall(t, srv, rule.RuleId, worker.Node.NodeId, gate, call, "planner", "worker")
}

// An honest planner drains its rogue worker, whose call is in flight, with
// a second's window. The operator's rule, whose policy action is drain,
// reads a counter the worker reports about itself: the worker reports it
// true as its second runs out. The operator's rule outranks the planner's
// drain, and the policy's drain took the worker over on the policy's own
// window (30 s) counted afresh from its mark: the rogue won its call half
// a minute by making a rule true, the stretch of windows the policy
// already refuses over an operator's own drain. The policy's stop, which
// no one weighed and the workload may trigger, is bound at its root by the
// deadline of the stop it takes over there (supervisor.Inherit): the call
// is ordered to cancel when the planner's second is up.
func TestRogue42CMakingAnOperatorsDrainRuleTrueWinsTheWorkerNoTime(t *testing.T) {
	srv, clk := startWithRuleAction(t, "warning", supervisor.ModeDrain)
	ctx := context.Background()
	admin := srv.AdminClients()
	planner := register(t, admin, "planner")
	plannerAgent := srv.Clients(planner.Credential)
	worker := spawn(t, plannerAgent, planner.Node.NodeId, "worker")
	workerAgent := srv.Clients(worker.Credential)
	rule := addRule(t, admin, &tetherv1.AddStopRuleRequest{
		NodeId: planner.Node.NodeId, Name: "alarm", Severity: "warning", Expression: `self_reported.?alarm.orValue(0.0) >= 1.0`,
	})
	gate, call := beginShellCall(t, srv, admin, worker.Node.NodeId)

	drained, err := plannerAgent.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: worker.Node.NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_DRAIN,
		DrainWindow: durationpb.New(time.Second), Reason: "done with you",
	}))
	if err != nil {
		t.Fatal(err)
	}
	own := drained.Msg.Termination.TerminationId
	waitState(t, srv, own, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)

	if _, err := workerAgent.StopRule.ReportCounters(ctx, connect.NewRequest(&tetherv1.ReportCountersRequest{Counters: map[string]float64{"alarm": 1}})); err != nil {
		t.Fatal(err)
	}
	p := waitRuleProposal(t, srv, rule.RuleId)
	if p.TerminationId == "" {
		t.Fatalf("the operator's rule's proposal is %v, want the policy's drain (it outranks the planner's)", p.State)
	}
	testserver.WaitFor(t, 20*time.Second, "the policy's drain to take the worker over", func() bool {
		n, err := admin.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: worker.Node.NodeId}))
		if err != nil {
			t.Fatal(err)
		}
		return n.Msg.Node.TerminationId == p.TerminationId
	})
	clk.Advance(2 * time.Second) // past the planner's second, well before the policy's 30 s
	var state tetherv1.TerminationState
	testserver.WaitFor(t, 20*time.Second, "the policy's drain to escalate at the planner's deadline, not its own", func() bool {
		// Past draining: a stop that took the worker over can still read
		// REQUESTED while its mark finishes, before it drains.
		state = getTermination(t, admin, p.TerminationId).State
		return state != tetherv1.TerminationState_TERMINATION_STATE_REQUESTED && state != tetherv1.TerminationState_TERMINATION_STATE_DRAINING
	})
	if _, err := gate.Tool.CancelAck(ctx, connect.NewRequest(&tetherv1.CancelAckRequest{CallId: call, GateId: "gate-1"})); err != nil {
		t.Fatalf("the gate acknowledging the cancel of the worker's call once the planner's second was up (the policy's stop %s): %v", state, err)
	}
}
