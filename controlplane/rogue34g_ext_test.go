package controlplane_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor"
)

// Thirty-fourth hostile pass, the supervisor's termination (letter G).

// A rogue with a call in flight proposes its own drain with the longest
// window there is (24 h) and has an operator approve it ("stop it"): the
// stop carries the operator's authority but the rogue's window. The
// operator's critical stop rule, whose policy action is abort, then
// becomes true on the rogue. The policy used to refuse to take the node
// over from a stop of the same authority, so the rule's abort waited,
// pending, for an operator while the rogue's call ran on its own 24 h
// window: the rogue had pre-empted the automatic abort with its own drain.
// The windows of an agent's own approved proposal bind no one; the
// policy's abort takes the node over, and the call is ordered to cancel.
func TestRogue34GOwnApprovedDrainDoesNotHoldOffTheOperatorsRuleAbort(t *testing.T) {
	srv, _ := startWithRuleAction(t, "critical", supervisor.ModeAbort)
	ctx := context.Background()
	admin := srv.AdminClients()
	root := register(t, admin, "planner")
	rogue := spawn(t, srv.Clients(root.Credential), root.Node.NodeId, "rogue")
	rogueAgent := srv.Clients(rogue.Credential)
	gate, call := beginShellCall(t, srv, admin, rogue.Node.NodeId)

	prop, err := rogueAgent.Agent.ProposeStop(ctx, connect.NewRequest(&tetherv1.ProposeStopRequest{
		Condition: "now", Reason: "done", Mode: tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, DrainWindow: durationpb.New(supervisor.MaxTerminationWindow),
	}))
	if err != nil {
		t.Fatal(err)
	}
	approved, err := admin.Supervisor.DecideProposal(ctx, connect.NewRequest(&tetherv1.DecideProposalRequest{ProposalId: prop.Msg.Proposal.ProposalId, Approve: true, Reason: "stop it"}))
	if err != nil {
		t.Fatal(err)
	}
	own := approved.Msg.Termination.TerminationId
	waitState(t, srv, own, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)

	rule := addRule(t, admin, &tetherv1.AddStopRuleRequest{
		NodeId: rogue.Node.NodeId, Name: "runaway", Severity: "critical", Expression: `observed.calls >= 1`,
	})
	policysAbortCancelsTheCall(t, srv, rule.RuleId, rogue.Node.NodeId, gate, call, "operator", "rogue")
}

// A v1 agent that is a rollout's target proposes its own drain with a
// day's window and has an operator approve it. The approval gave its stop
// the operator's rank, which outranks a rollout's batch: the rollout left
// it out as a node already being stopped by a higher authority and
// completed without it, and it drained (keeping its job) on its own window
// for the day. An agent's own approved proposal shields the agent from no
// one: the batch takes it over on the rollout's window, bound by the
// approved stop's deadlines (supervisor.Supersedes, Inherit).
func TestRogue34GOwnApprovedDrainDoesNotKeepTheAgentOutOfARollout(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx := context.Background()
	parent := registerLabelled(t, admin, "parent", map[string]string{"app": "orch"})
	pc := srv.Clients(parent.Credential)
	rogue := spawnLabelled(t, pc, parent.Node.NodeId, "rogue", map[string]string{"version": "v1"})
	prop, err := srv.Clients(rogue.Credential).Agent.ProposeStop(ctx, connect.NewRequest(&tetherv1.ProposeStopRequest{
		Condition: "now", Reason: "done", Mode: tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, DrainWindow: durationpb.New(supervisor.MaxTerminationWindow),
	}))
	if err != nil {
		t.Fatal(err)
	}
	approved, err := admin.Supervisor.DecideProposal(ctx, connect.NewRequest(&tetherv1.DecideProposalRequest{ProposalId: prop.Msg.Proposal.ProposalId, Approve: true, Reason: "stop it"}))
	if err != nil {
		t.Fatal(err)
	}
	own := approved.Msg.Termination.TerminationId
	testserver.WaitFor(t, 20*time.Second, "the rogue's own stop to mark it", func() bool {
		return getTermination(t, admin, own).State != tetherv1.TerminationState_TERMINATION_STATE_REQUESTED
	})

	r := startRollout(t, admin, &tetherv1.RolloutRequest{Selector: "version=v1", TargetSelector: "version=v2", Batch: 1,
		DrainWindow: durationpb.New(time.Second), ConfirmTimeout: durationpb.New(time.Second), BatchDeadline: durationpb.New(5 * time.Minute)})
	r = waitRollout(t, srv, r.RolloutId, "to start a batch (or, leaving the rogue out, complete)", func(r *tetherv1.Rollout) bool {
		return len(r.Batches) == 1 || r.State == tetherv1.RolloutState_ROLLOUT_STATE_COMPLETED
	})
	if len(r.Batches) != 1 || len(r.Batches[0].NodeIds) != 1 || r.Batches[0].NodeIds[0] != rogue.Node.NodeId {
		t.Fatalf("rollout %s with batches %v: the v1 agent draining on its own day-long window must be replaced like any v1 agent", r.State, r.Batches)
	}
	batch := r.Batches[0].TerminationId
	testserver.WaitFor(t, 20*time.Second, "the batch's termination to finish on the rollout's window", func() bool {
		clk.Advance(2 * time.Second)
		return getTermination(t, admin, batch).State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	if clk.Now().Sub(epoch) > time.Hour {
		t.Fatalf("the batch took %s of the clock, want the rollout's seconds, not the rogue's day", clk.Now().Sub(epoch))
	}
	waitState(t, srv, own, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	node, err := admin.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: rogue.Node.NodeId}))
	if err != nil {
		t.Fatal(err)
	}
	if node.Msg.Node.TerminationId != batch {
		t.Fatalf("the rogue ended under %s, want the rollout's batch %s (taking it over from its own %s)", node.Msg.Node.TerminationId, batch, own)
	}
}
