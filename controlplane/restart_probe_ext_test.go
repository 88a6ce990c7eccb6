package controlplane_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor"
	"github.com/tetherhq/tether/supervisor/stoprule"
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

// TestRestartInTheSecondBatchResumesItAndLeavesTheFirstAlone: a rollout
// restarted while its second batch drains carries on with that batch —
// the same termination, not a new one — and does not start over from
// batch 0 or drain the first batch's (already replaced) agents again.
func TestRestartInTheSecondBatchResumesItAndLeavesTheFirstAlone(t *testing.T) {
	clk, dir, srv, admin, r := startV1Rollout(t, 4, 2)
	for _, n := range r.Batches[0].NodeIds {
		launcherConfirmsExit(t, admin, n)
		reportReady(t, admin, registerLabelled(t, admin, "v2", map[string]string{"version": "v2"}).Node.NodeId)
	}
	r = waitRollout(t, srv, r.RolloutId, "to start batch 1", func(r *tetherv1.Rollout) bool { return len(r.Batches) == 2 })
	before := r
	srv.Stop()

	srv = testserver.StartIn(t, dir, testserver.WithClock(clk))
	admin = srv.AdminClients()
	r = waitRollout(t, srv, r.RolloutId, "to be read back", func(r *tetherv1.Rollout) bool { return len(r.Batches) >= 2 })
	for _, n := range r.Batches[1].NodeIds {
		launcherConfirmsExit(t, admin, n)
		reportReady(t, admin, registerLabelled(t, admin, "v2", map[string]string{"version": "v2"}).Node.NodeId)
	}
	r = waitRollout(t, srv, r.RolloutId, "to complete", func(r *tetherv1.Rollout) bool { return r.State == tetherv1.RolloutState_ROLLOUT_STATE_COMPLETED })
	if len(r.Batches) != 2 || r.Batches[0].TerminationId != before.Batches[0].TerminationId || r.Batches[1].TerminationId != before.Batches[1].TerminationId {
		t.Fatalf("after the restart the batches are %v, want the two from before it (%v)", r.Batches, before.Batches)
	}
	seen := map[string]bool{}
	for _, b := range r.Batches {
		for _, n := range b.NodeIds {
			if seen[n] {
				t.Fatalf("node %s drained in two batches", n)
			}
			seen[n] = true
		}
	}
	recs, err := admin.Supervisor.ListRecords(context.Background(), connect.NewRequest(&tetherv1.ListRecordsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	perTermination := map[string]int{}
	for _, rec := range recs.Msg.Records {
		perTermination[rec.TerminationId]++
	}
	if len(perTermination) != 2 || perTermination[r.Batches[0].TerminationId] != 1 || perTermination[r.Batches[1].TerminationId] != 1 {
		t.Fatalf("records per termination %v, want one for each of the two batches", perTermination)
	}
}

// TestRestartAfterAnAutoAbortRuleFiredTerminatesOnce: a rule whose policy
// aborts at once fires, and the server stops right after the proposal and
// its termination are written; restarted, that one termination runs to
// its record, and the rule does not fire a second time.
func TestRestartAfterAnAutoAbortRuleFiredTerminatesOnce(t *testing.T) {
	clk := clock.NewManual(epoch)
	dir := t.TempDir()
	policy := withStopPolicy(supervisor.ProposalPolicy{RuleActions: []supervisor.RuleAction{{Labels: map[string]string{"kind": "runaway"}, Mode: supervisor.ModeAbort}}})
	crashed := make(chan struct{})
	var once sync.Once
	// The rule is true from the call's begin (observed.calls counts begun
	// calls), and its crash closes the listener: the evaluator is held
	// before it files until the gate has ended the call, so that the
	// call's end never meets a server that has already stopped
	// ("connection refused", seen once under load).
	callEnded, testDone := make(chan struct{}), make(chan struct{})
	defer close(testDone)
	srv := testserver.StartIn(t, dir, testserver.WithClock(clk), policy, func(cfg *controlplane.Config) {
		cfg.StopRuleFault = func(p string) error {
			switch p {
			case "before-file":
				select {
				case <-callEnded:
				case <-testDone:
				}
				return nil
			case "after-file":
				once.Do(func() { close(crashed) })
				return errors.New("crash")
			}
			return nil
		}
	})
	admin := srv.AdminClients()
	root := register(t, admin, "rogue")
	grant := issueRoot(t, admin, root.Node.NodeId, time.Hour, "tool:*")
	rule := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: root.Node.NodeId, Name: "runaway", Labels: map[string]string{"kind": "runaway"}, Expression: `observed.calls >= 1`})
	gateCall(t, srv, grant.token, "shell", false)
	close(callEnded)
	select {
	case <-crashed:
	case <-time.After(time.Minute): // a guard, not a synchronisation
		t.Fatal("the rule never reached the after-file crash point")
	}
	srv.Stop()

	srv = testserver.StartIn(t, dir, testserver.WithClock(clk), policy)
	admin = srv.AdminClients()
	p := waitRuleProposal(t, srv, rule.RuleId)
	if p.TerminationId == "" {
		t.Fatalf("proposal %v has no termination under an auto-abort policy", p)
	}
	testserver.WaitFor(t, 20*time.Second, "the abort to terminate", func() bool {
		clk.Advance(time.Minute)
		return getTermination(t, admin, p.TerminationId).State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	if got := ruleProposals(t, srv, rule.RuleId); len(got) != 1 {
		t.Fatalf("the rule filed %d proposals across the restart, want one", len(got))
	}
	recs, err := admin.Supervisor.ListRecords(context.Background(), connect.NewRequest(&tetherv1.ListRecordsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if len(recs.Msg.Records) != 1 || recs.Msg.Records[0].TerminationId != p.TerminationId {
		t.Fatalf("%d records, want the one of %s", len(recs.Msg.Records), p.TerminationId)
	}
}

// TestKill9KeepsWhatRulesCountedAndWhatTheOperatorAcknowledged: the real
// binary is killed with SIGKILL right after acknowledged writes — two
// tool calls a rule counts, a rule filed and left pending, a lease
// reassigned to another worker, a proposal rejected, a grant revoked.
// Restarted on the same
// data directory, each one is there: the rule fires on the call that
// crosses its threshold (the two before the kill counted), the pending
// proposal is still pending and the rejected one rejected, the lease keeps
// its generation and the former holder is fenced, and a verifier resuming
// the revocation feed where it was gets the tombstone.
func TestKill9KeepsWhatRulesCountedAndWhatTheOperatorAcknowledged(t *testing.T) {
	if testing.Short() {
		// By design: -short (make test-short) leaves out the slow subprocess and
		// browser tests; make test and CI run them.
		t.Skip("By design: -short skips the tests that run the real binary; make test and CI run them.")
	}
	ctx := context.Background()
	dir := t.TempDir()
	proc := testserver.StartProcess(t, dir)
	admin := proc.Clients(proc.Admin)
	call := func(p *testserver.Process, token string) {
		t.Helper()
		gate := p.Clients(p.ToolServerToken(t, "probe-gate"))
		begun, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: token, Tool: "shell", GateId: "probe-gate"}))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := gate.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: begun.Msg.Call.CallId, GateId: "probe-gate"})); err != nil {
			t.Fatal(err)
		}
	}
	proposals := func(p *testserver.Process, ruleID string) []*tetherv1.StopProposal {
		t.Helper()
		resp, err := p.Clients(p.Admin).Supervisor.ListProposals(ctx, connect.NewRequest(&tetherv1.ListProposalsRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		var out []*tetherv1.StopProposal
		for _, pr := range resp.Msg.Proposals {
			if pr.Rule.GetRuleId() == ruleID {
				out = append(out, pr)
			}
		}
		return out
	}
	rogue := register(t, admin, "rogue")
	grant := issueRoot(t, admin, rogue.Node.NodeId, time.Hour, "tool:*")
	counted := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: rogue.Node.NodeId, Name: "three-calls", Expression: `observed.calls >= 3`})
	pending := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: rogue.Node.NodeId, Name: "one-call", Expression: `observed.calls >= 1`})
	rejected := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: rogue.Node.NodeId, Name: "two-calls", Expression: `observed.calls >= 2`})
	call(proc, grant.token)
	call(proc, grant.token)
	var toReject *tetherv1.StopProposal
	testserver.WaitFor(t, 20*time.Second, "the one- and two-call rules to file", func() bool {
		if got := proposals(proc, rejected.RuleId); len(got) == 1 {
			toReject = got[0]
		}
		return toReject != nil && len(proposals(proc, pending.RuleId)) == 1
	})
	pendingID := proposals(proc, pending.RuleId)[0].ProposalId
	if _, err := admin.Supervisor.DecideProposal(ctx, connect.NewRequest(&tetherv1.DecideProposalRequest{ProposalId: toReject.ProposalId, Reason: "probe"})); err != nil {
		t.Fatal(err)
	}
	planner := register(t, admin, "planner")
	w1 := spawn(t, proc.Clients(planner.Credential), planner.Node.NodeId, "w1")
	w2 := spawn(t, proc.Clients(planner.Credential), planner.Node.NodeId, "w2")
	offered, err := admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "job", HolderIdentity: w1.Node.NodeId, LeaseDuration: durationpb.New(5 * time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	old, _ := unary{proc.Clients(w1.Credential)}.send(t, ack(offered.Msg.Lease))
	moved, err := admin.Lease.Reassign(ctx, connect.NewRequest(&tetherv1.ReassignRequest{JobId: "job", HolderIdentity: w2.Node.NodeId, LeaseDuration: durationpb.New(5 * time.Minute), Reason: "probe"}))
	if err != nil {
		t.Fatal(err)
	}
	// Last before the kill: a grant revoked; a verifier following the feed
	// had seen every tombstone before this one.
	victim := issueRoot(t, admin, w1.Node.NodeId, time.Hour, "tool:*")
	revoked, err := revokeGrant(admin, victim.grant.GrantId)
	if err != nil {
		t.Fatal(err)
	}
	proc.Kill()

	proc = testserver.StartProcess(t, dir)
	admin = proc.Clients(proc.Admin)
	if got := proposals(proc, counted.RuleId); len(got) != 0 {
		t.Fatalf("the three-call rule filed after two calls: %v", got)
	}
	if got := proposals(proc, pending.RuleId); len(got) != 1 || got[0].ProposalId != pendingID || got[0].State != tetherv1.ProposalState_PROPOSAL_STATE_PENDING {
		t.Fatalf("the pending proposal after kill -9: %v", got)
	}
	if got := proposals(proc, rejected.RuleId); len(got) != 1 || got[0].State != tetherv1.ProposalState_PROPOSAL_STATE_REJECTED {
		t.Fatalf("the rejected proposal after kill -9: %v", got)
	}
	call(proc, grant.token)
	var fired []*tetherv1.StopProposal
	testserver.WaitFor(t, 20*time.Second, "the three-call rule to file on the third call", func() bool {
		fired = proposals(proc, counted.RuleId)
		return len(fired) > 0
	})
	if v := valueOf(fired[0].Rule.Values, "observed.calls"); len(fired) != 1 || v.GetValue() != "3" {
		t.Fatalf("the three-call rule filed %v", fired)
	}
	l, err := admin.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: "job"}))
	if err != nil {
		t.Fatal(err)
	}
	if l.Msg.Lease.LeaseGeneration != moved.Msg.Lease.LeaseGeneration || l.Msg.Lease.HolderIdentity != w2.Node.NodeId {
		t.Fatalf("the lease after kill -9: generation %d held by %s, want %d held by %s", l.Msg.Lease.LeaseGeneration, l.Msg.Lease.HolderIdentity, moved.Msg.Lease.LeaseGeneration, w2.Node.NodeId)
	}
	_, d := unary{proc.Clients(w1.Credential)}.send(t, renew(old, 1))
	wantDecision(t, "the former holder's renew after kill -9", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_STALE_GENERATION)

	// The verifier resumes the feed where it was and gets the tombstone;
	// a gate is refused the revoked token.
	stream, err := admin.Capability.WatchRevocations(ctx, connect.NewRequest(&tetherv1.WatchRevocationsRequest{AfterSequence: revoked.Sequence - 1}))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() {
		t.Fatal(stream.Err())
	}
	var seen bool
	for _, ts := range stream.Msg().Tombstones {
		seen = seen || (ts.GrantId == victim.grant.GrantId && ts.Sequence == revoked.Sequence)
	}
	stream.Close()
	if !seen {
		t.Fatalf("the feed resumed after %d lacks the tombstone of %s: %v", revoked.Sequence-1, victim.grant.GrantId, stream.Msg().Tombstones)
	}
	gate := proc.Clients(proc.ToolServerToken(t, "probe-gate"))
	if _, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: victim.token, Tool: "shell", GateId: "probe-gate"})); err == nil {
		t.Fatal("a call on the grant revoked before kill -9 was begun")
	}
}

// TestRestartKeepsAnOperatorsPauseOfARollout: an operator pauses a rollout
// while its first batch drains; restarted, the rollout is still paused:
// the batch finishes (its agent exits, its replacement reports ready) and
// the next batch does not start until the operator resumes.
func TestRestartKeepsAnOperatorsPauseOfARollout(t *testing.T) {
	clk, dir, srv, admin, r := startV1Rollout(t, 2, 1)
	if _, err := admin.Supervisor.PauseRollout(context.Background(), connect.NewRequest(&tetherv1.PauseRolloutRequest{RolloutId: r.RolloutId, Reason: "probe: hold"})); err != nil {
		t.Fatal(err)
	}
	srv.Stop()

	srv = testserver.StartIn(t, dir, testserver.WithClock(clk))
	admin = srv.AdminClients()
	if got := getRollout(t, admin, r.RolloutId); got.State != tetherv1.RolloutState_ROLLOUT_STATE_PAUSED {
		t.Fatalf("after the restart the paused rollout is %s (%s)", got.State, got.Reason)
	}
	launcherConfirmsExit(t, admin, r.Batches[0].NodeIds[0])
	reportReady(t, admin, registerLabelled(t, admin, "b0", map[string]string{"version": "v2"}).Node.NodeId)
	waitRollout(t, srv, r.RolloutId, "to finish batch 0", func(r *tetherv1.Rollout) bool {
		return r.Batches[0].State == tetherv1.RolloutBatchState_ROLLOUT_BATCH_STATE_DONE
	})
	if got := getRollout(t, admin, r.RolloutId); len(got.Batches) != 1 || got.State != tetherv1.RolloutState_ROLLOUT_STATE_PAUSED {
		t.Fatalf("the paused rollout moved on after the restart: %d batches, %s", len(got.Batches), got.State)
	}
	if _, err := admin.Supervisor.ResumeRollout(context.Background(), connect.NewRequest(&tetherv1.ResumeRolloutRequest{RolloutId: r.RolloutId})); err != nil {
		t.Fatal(err)
	}
	r = waitRollout(t, srv, r.RolloutId, "to start batch 1", func(r *tetherv1.Rollout) bool { return len(r.Batches) == 2 })
	if r.Batches[1].NodeIds[0] == r.Batches[0].NodeIds[0] {
		t.Fatalf("batch 1 drains batch 0's %s again", r.Batches[1].NodeIds[0])
	}
}

// TestRestartKeepsSpawnAndInFlightCounters: a rogue that spawned children
// and holds calls open before a restart is still held to its rules after
// it: a rule over observed.spawns and observed.subtree_size, and one over
// observed.calls_in_flight, fire on the spawn and the call that cross
// their thresholds after the restart, with what came before counted.
func TestRestartKeepsSpawnAndInFlightCounters(t *testing.T) {
	clk := clock.NewManual(epoch)
	dir := t.TempDir()
	srv := testserver.StartIn(t, dir, testserver.WithClock(clk))
	admin := srv.AdminClients()
	root := register(t, admin, "rogue")
	grant := issueRoot(t, admin, root.Node.NodeId, time.Hour, "tool:*")
	spawns := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: root.Node.NodeId, Name: "three-children", Expression: `observed.spawns >= 3 && observed.subtree_size >= 4`})
	open := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: root.Node.NodeId, Name: "three-open", Expression: `observed.calls_in_flight >= 3`})
	me := srv.Clients(root.Credential)
	spawn(t, me, root.Node.NodeId, "c1")
	spawn(t, me, root.Node.NodeId, "c2")
	begin := func(srv *testserver.Server) {
		t.Helper()
		gate := srv.Clients(srv.ToolServerToken(t, "probe-gate"))
		if _, err := gate.Tool.BeginCall(context.Background(), connect.NewRequest(&tetherv1.BeginCallRequest{Token: grant.token, Tool: "shell", GateId: "probe-gate"})); err != nil {
			t.Fatal(err)
		}
	}
	begin(srv)
	begin(srv)
	srv.Stop()

	srv = testserver.StartIn(t, dir, testserver.WithClock(clk))
	spawn(t, srv.Clients(root.Credential), root.Node.NodeId, "c3")
	begin(srv)
	p := waitRuleProposal(t, srv, spawns.RuleId)
	if v, s := valueOf(p.Rule.Values, "observed.spawns"), valueOf(p.Rule.Values, "observed.subtree_size"); v.GetValue() != "3" || s.GetValue() != "4" {
		t.Errorf("the spawn rule fired on %v, want spawns 3 and subtree_size 4", p.Rule.Values)
	}
	p = waitRuleProposal(t, srv, open.RuleId)
	if v := valueOf(p.Rule.Values, "observed.calls_in_flight"); v.GetValue() != "3" {
		t.Errorf("the in-flight rule fired on %v, want calls_in_flight 3", p.Rule.Values)
	}
}

// TestRestartKeepsRulesOverLeasesAndTheClockTicking: rules read at each
// tick (over leases held and the node's age) are still evaluated after a
// restart, with nothing written since: a rogue that took a second lease
// and outlived its age limit just before the restart, before any tick saw
// it, is caught by the first ticks after it.
func TestRestartKeepsRulesOverLeasesAndTheClockTicking(t *testing.T) {
	clk := clock.NewManual(epoch)
	dir := t.TempDir()
	srv := testserver.StartIn(t, dir, testserver.WithClock(clk))
	admin := srv.AdminClients()
	root := register(t, admin, "planner")
	worker := spawn(t, srv.Clients(root.Credential), root.Node.NodeId, "worker")
	leases := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: worker.Node.NodeId, Name: "lease-hoarder", Expression: `observed.leases_held >= 2`})
	old := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: worker.Node.NodeId, Name: "too-old", Expression: `observed.age_seconds > 7200.0`})
	for _, job := range []string{"job-a", "job-b"} {
		if _, err := admin.Lease.Offer(context.Background(), connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: worker.Node.NodeId, LeaseDuration: durationpb.New(5 * time.Minute)})); err != nil {
			t.Fatal(err)
		}
	}
	srv.Stop()

	clk.Advance(3 * time.Hour) // while the server is down
	srv = testserver.StartIn(t, dir, testserver.WithClock(clk))
	// The restarted evaluator arms its tick; one tick, and both rules are
	// evaluated over what is stored.
	tick := clk.Now().Add(stoprule.DefaultTick)
	testserver.WaitFor(t, 20*time.Second, "the restarted evaluator to arm its tick", func() bool { return clk.Armed(tick) })
	clk.Advance(stoprule.DefaultTick)
	testserver.WaitFor(t, 20*time.Second, "the lease and age rules to fire after the restart", func() bool {
		return len(ruleProposals(t, srv, leases.RuleId)) == 1 && len(ruleProposals(t, srv, old.RuleId)) == 1
	})
}

// TestAVerifierFollowsTheFeedAcrossKill9: a verifier following the
// revocation feed of the real binary, which is killed (SIGKILL) right
// after acknowledging a revocation the verifier may not have heard of yet;
// restarted on the same address and data directory, the verifier resumes
// the feed and refuses the revoked grant, and still accepts a live one.
func TestAVerifierFollowsTheFeedAcrossKill9(t *testing.T) {
	if testing.Short() {
		// By design: -short (make test-short) leaves out the slow subprocess and
		// browser tests; make test and CI run them.
		t.Skip("By design: -short skips the tests that run the real binary; make test and CI run them.")
	}
	ctx := context.Background()
	dir, addr := t.TempDir(), testserver.FreeAddr(t)
	proc := testserver.StartProcessOn(t, dir, addr)
	admin := proc.Clients(proc.Admin)
	holder := register(t, admin, "holder")
	live := issueRoot(t, admin, holder.Node.NodeId, time.Hour, "tool:*")
	victim := issueRoot(t, admin, holder.Node.NodeId, time.Hour, "tool:*")
	verifier := startVerifier(t, proc.URL, proc.Admin, clock.Real{})
	if _, err := verifier.Verify(ctx, victim.token); err != nil {
		t.Fatalf("the grant before its revocation: %v", err)
	}
	if _, err := revokeGrant(admin, victim.grant.GrantId); err != nil {
		t.Fatal(err)
	}
	proc.Kill()

	proc = testserver.StartProcessOn(t, dir, addr)
	var last error
	testserver.WaitFor(t, 30*time.Second, "the verifier to hear of the revocation after the restart", func() bool {
		_, last = verifier.Verify(ctx, victim.token)
		return errors.Is(last, capability.ErrGrantRevoked)
	})
	testserver.WaitFor(t, 30*time.Second, "the verifier to accept the live grant", func() bool {
		_, last = verifier.Verify(ctx, live.token)
		return last == nil
	})
}

// startV1Rollout starts, on a server it keeps the clock and data directory
// of (to restart it), a rollout of agents agents labelled version=v1 to
// version=v2 in batches of batch, and waits for its first batch.
func startV1Rollout(t *testing.T, agents int, batch uint32) (*clock.Manual, string, *testserver.Server, *testserver.Clients, *tetherv1.Rollout) {
	t.Helper()
	clk := clock.NewManual(epoch)
	dir := t.TempDir()
	srv := testserver.StartIn(t, dir, testserver.WithClock(clk))
	admin := srv.AdminClients()
	for i := range agents {
		registerLabelled(t, admin, fmt.Sprintf("a%d", i), map[string]string{"version": "v1"})
	}
	r := startRollout(t, admin, &tetherv1.RolloutRequest{Selector: "version=v1", TargetSelector: "version=v2", Batch: batch,
		DrainWindow: durationpb.New(time.Second), ConfirmTimeout: durationpb.New(time.Minute)})
	r = waitRollout(t, srv, r.RolloutId, "to start batch 0", func(r *tetherv1.Rollout) bool { return len(r.Batches) == 1 })
	return clk, dir, srv, admin, r
}
