package controlplane_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// Restart probes: what the control plane acknowledged before a restart on
// the same data directory is still in force after it. A rogue that gets
// the server restarted (a crash it provokes, an upgrade it waits for) must
// gain nothing: its rules still count what it did before, proposals
// against it still wait for the operator, a lease taken from it stays
// taken.

// TestRestartKeepsARulesCountersSoARogueCannotEscapeTheThreshold: a rule
// over observed.calls, attached to a node and by label selector, counts
// the calls made before a restart; the call that crosses the threshold
// after the restart files the proposal, exactly once per rule.
func TestRestartKeepsARulesCountersSoARogueCannotEscapeTheThreshold(t *testing.T) {
	clk := clock.NewManual(epoch)
	dir := t.TempDir()
	srv := testserver.StartIn(t, dir, testserver.WithClock(clk))
	admin := srv.AdminClients()
	root := registerLabelled(t, admin, "rogue", map[string]string{"team": "red"})
	grant := issueRoot(t, admin, root.Node.NodeId, time.Hour, "tool:*")
	attached := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: root.Node.NodeId, Name: "three-calls", Expression: `observed.calls >= 3`})
	selected := addRule(t, admin, &tetherv1.AddStopRuleRequest{LabelSelector: "team=red", Name: "red-three-calls", Expression: `observed.calls >= 3`})
	gateCall(t, srv, grant.token, "shell", false)
	gateCall(t, srv, grant.token, "shell", false)
	if n := len(ruleProposals(t, srv, attached.RuleId)) + len(ruleProposals(t, srv, selected.RuleId)); n != 0 {
		t.Fatalf("%d proposals after two calls, want none", n)
	}
	srv.Stop()

	srv = testserver.StartIn(t, dir, testserver.WithClock(clk))
	rules, err := srv.AdminClients().StopRule.ListStopRules(context.Background(), connect.NewRequest(&tetherv1.ListStopRulesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if len(rules.Msg.Rules) != 2 {
		t.Fatalf("after the restart %d rules are listed, want the attached and the selector rule", len(rules.Msg.Rules))
	}
	gateCall(t, srv, grant.token, "shell", false)
	for _, r := range []*tetherv1.StopRule{attached, selected} {
		p := waitRuleProposal(t, srv, r.RuleId)
		if v := valueOf(p.Rule.Values, "observed.calls"); v.GetValue() != "3" {
			t.Errorf("rule %s fired on values %v, want observed.calls 3 (the two calls before the restart counted)", r.Name, p.Rule.Values)
		}
	}
	// A marker rule firing later shows the evaluator has looked again; the
	// two rules have still filed one proposal each.
	marker := addRule(t, srv.AdminClients(), &tetherv1.AddStopRuleRequest{NodeId: root.Node.NodeId, Name: "marker", Expression: `observed.calls >= 4`})
	gateCall(t, srv, grant.token, "shell", false)
	waitRuleProposal(t, srv, marker.RuleId)
	for _, r := range []*tetherv1.StopRule{attached, selected} {
		if got := ruleProposals(t, srv, r.RuleId); len(got) != 1 {
			t.Errorf("rule %s filed %d proposals, want exactly one", r.Name, len(got))
		}
	}
}

// TestRestartKeepsAPendingProposalDecidable: a proposal waiting for the
// operator's decision is still pending after a restart, is not filed a
// second time, and the operator's approval then starts its termination.
func TestRestartKeepsAPendingProposalDecidable(t *testing.T) {
	clk := clock.NewManual(epoch)
	dir := t.TempDir()
	srv := testserver.StartIn(t, dir, testserver.WithClock(clk))
	admin := srv.AdminClients()
	root := register(t, admin, "rogue")
	grant := issueRoot(t, admin, root.Node.NodeId, time.Hour, "tool:*")
	rule := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: root.Node.NodeId, Name: "one-call", Expression: `observed.calls >= 1`})
	gateCall(t, srv, grant.token, "shell", false)
	p := waitRuleProposal(t, srv, rule.RuleId)
	if p.State != tetherv1.ProposalState_PROPOSAL_STATE_PENDING {
		t.Fatalf("proposal %s is %s, want pending (the default policy asks the operator)", p.ProposalId, p.State)
	}
	srv.Stop()

	srv = testserver.StartIn(t, dir, testserver.WithClock(clk))
	admin = srv.AdminClients()
	// Another call and a marker rule: the evaluator has run over the node
	// again, and must not file the rule's proposal a second time.
	marker := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: root.Node.NodeId, Name: "marker", Expression: `observed.calls >= 2`})
	gateCall(t, srv, grant.token, "shell", false)
	waitRuleProposal(t, srv, marker.RuleId)
	got := ruleProposals(t, srv, rule.RuleId)
	if len(got) != 1 || got[0].ProposalId != p.ProposalId || got[0].State != tetherv1.ProposalState_PROPOSAL_STATE_PENDING {
		t.Fatalf("after the restart the rule's proposals are %v, want %s alone and pending", got, p.ProposalId)
	}
	resp, err := admin.Supervisor.DecideProposal(context.Background(), connect.NewRequest(&tetherv1.DecideProposalRequest{ProposalId: p.ProposalId, Approve: true, Reason: "probe"}))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Msg.Termination.GetTerminationId() == "" || resp.Msg.Proposal.State != tetherv1.ProposalState_PROPOSAL_STATE_APPROVED {
		t.Fatalf("approval after the restart: %v", resp.Msg)
	}
}

// TestRestartKeepsAReassignedLeasesGenerationAndFencesTheFormerHolder: a
// lease reassigned (generation+1) right before a restart keeps its new
// generation and holder; the former holder's renew on the old generation
// is still refused as stale, and the new holder's acknowledgement taken.
func TestRestartKeepsAReassignedLeasesGenerationAndFencesTheFormerHolder(t *testing.T) {
	clk := clock.NewManual(epoch)
	dir := t.TempDir()
	srv := testserver.StartIn(t, dir, testserver.WithClock(clk))
	w := &leaseWorld{srv: srv, clock: clk, admin: srv.AdminClients()}
	root := register(t, w.admin, "planner")
	a := spawn(t, srv.Clients(root.Credential), root.Node.NodeId, "w1")
	b := spawn(t, srv.Clients(root.Credential), root.Node.NodeId, "w2")
	job := w.job()
	old := w.offer(t, job, a.Node.NodeId, 5*time.Minute)
	old, _ = unary{srv.Clients(a.Credential)}.send(t, ack(old))
	moved := w.reassign(t, job, b.Node.NodeId, 5*time.Minute)
	if moved.LeaseGeneration != old.LeaseGeneration+1 {
		t.Fatalf("reassign took generation %d to %d", old.LeaseGeneration, moved.LeaseGeneration)
	}
	srv.Stop()

	srv = testserver.StartIn(t, dir, testserver.WithClock(clk))
	w.srv, w.admin = srv, srv.AdminClients()
	got := w.get(t, job)
	if got.LeaseGeneration != moved.LeaseGeneration || got.HolderIdentity != b.Node.NodeId {
		t.Fatalf("after the restart the lease is generation %d held by %s, want generation %d held by %s", got.LeaseGeneration, got.HolderIdentity, moved.LeaseGeneration, b.Node.NodeId)
	}
	_, d := unary{srv.Clients(a.Credential)}.send(t, renew(old, 1))
	wantDecision(t, "the former holder's renew after the restart", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_STALE_GENERATION)
	_, d = unary{srv.Clients(b.Credential)}.send(t, ack(moved))
	wantDecision(t, "the new holder's acknowledgement", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_ACKED)
	if got := w.get(t, job); got.LeaseGeneration != moved.LeaseGeneration {
		t.Fatalf("generation moved to %d", got.LeaseGeneration)
	}
}
