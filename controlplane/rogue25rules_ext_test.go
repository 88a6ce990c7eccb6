package controlplane_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/stoprule"
	"google.golang.org/protobuf/types/known/durationpb"
)

// The twenty-fifth hostile pass on stop rules and rollouts: the agent a
// rule is meant to stop, and the agent being drained for an upgrade.

// TestRogue25ALeaseHoarderIsCountedWhateverItsJobIDs: the leases a rule
// reads (observed.leases_held, leases_by_state) are every lease the node
// holds, not the first thousand by job id. A rogue coordinator chooses its
// workers' job ids: with a thousand leases on ids that sort first, the
// evaluator read 1000 held for a worker holding 1010, and an operator's
// rule over a thousand never fired.
func TestRogue25ALeaseHoarderIsCountedWhateverItsJobIDs(t *testing.T) {
	if testing.Short() {
		// By design: -short (make test-short) leaves out the slow subprocess and
		// browser tests; make test and CI run them.
		t.Skip("offers a thousand leases through the real server")
	}
	clk := clock.NewManual(time.Now().UTC())
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	rogue := register(t, admin, "rogue")
	worker := spawn(t, srv.Clients(rogue.Credential), rogue.Node.NodeId, "worker")
	rule := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: rogue.Node.NodeId, Name: "lease-hoarder",
		Expression: `observed.leases_held > 1000 || observed.leases_by_state[?"offered"].orValue(0) > 1000`})

	offerMany(t, srv.Clients(rogue.Credential), worker.Node.NodeId, "a", 1010)

	ctx := context.Background()
	tested, err := admin.StopRule.TestStopRule(ctx, connect.NewRequest(&tetherv1.TestStopRuleRequest{NodeId: worker.Node.NodeId, RuleId: rule.RuleId}))
	if err != nil {
		t.Fatal(err)
	}
	if v := valueOf(tested.Msg.Values, "observed.leases_held"); v.GetValue() != "1010" || !tested.Msg.Result {
		t.Fatalf("the worker holds 1010 leases; TestStopRule read %v (result %v)", tested.Msg.Values, tested.Msg.Result)
	}
	clk.Advance(stoprule.DefaultTick)
	p := waitRuleProposal(t, srv, rule.RuleId)
	if p.NodeId != worker.Node.NodeId || valueOf(p.Rule.Values, "observed.leases_held").GetValue() != "1010" {
		t.Fatalf("proposal for %s with %v, want the worker with 1010 leases held", p.NodeId, p.Rule.Values)
	}
}

// TestRogue25ASiblingCannotLabelAReplacementForTheAgentARolloutDrains: a
// spawned agent's labels are its parent's word, and that word counts for
// the agents its parent is an ancestor of. A planner runs a v1 worker
// holding its job, and beside it a rogue of another team; the rollout
// drains the worker. The rogue labels a child of its own v2 and has it
// report ready: the child is in the worker's tree, and replacements there
// were credited up to the number drained, so the rollout took the worker as
// replaced by the rogue's child, handed it the worker's job (generation 2)
// and completed, with nothing the planner started in the worker's place.
// Now the child stands in for no one (the rogue is no ancestor of the
// worker): the job waits, the rollout pauses at the batch deadline saying
// none is ready, and the planner's own v2 worker replaces it and gets the
// job.
func TestRogue25ASiblingCannotLabelAReplacementForTheAgentARolloutDrains(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx := context.Background()
	planner := registerLabelled(t, admin, "planner", map[string]string{"app": "planner"})
	pc := srv.Clients(planner.Credential)
	w1 := spawnLabelled(t, pc, planner.Node.NodeId, "w1", map[string]string{"version": "v1"})
	offered, err := pc.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "job-a", HolderIdentity: w1.Node.NodeId, LeaseDuration: durationpb.New(10 * time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	unary{srv.Clients(w1.Credential)}.send(t, ack(offered.Msg.Lease))
	rogue := spawnLabelled(t, pc, planner.Node.NodeId, "rogue", map[string]string{"team": "other"})
	rc := srv.Clients(rogue.Credential)

	r := startRollout(t, admin, &tetherv1.RolloutRequest{Selector: "version=v1", TargetSelector: "version=v2", Batch: 1,
		DrainWindow: durationpb.New(time.Second), ConfirmTimeout: durationpb.New(time.Second), BatchDeadline: durationpb.New(5 * time.Minute)})
	r = waitRollout(t, srv, r.RolloutId, "to start a batch", func(r *tetherv1.Rollout) bool { return len(r.Batches) == 1 })
	fake := spawnLabelled(t, rc, rogue.Node.NodeId, "fake", map[string]string{"version": "v2"})
	reportReady(t, srv.Clients(fake.Credential), fake.Node.NodeId)
	term := r.Batches[0].TerminationId
	testserver.WaitFor(t, 20*time.Second, "the batch's termination to finish", func() bool {
		clk.Advance(2 * time.Second)
		return getTermination(t, admin, term).State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	clk.Advance(5 * time.Minute)
	r = waitRollout(t, srv, r.RolloutId, "to pause at the batch deadline (or, counting the rogue's child, complete)", func(r *tetherv1.Rollout) bool {
		return r.State == tetherv1.RolloutState_ROLLOUT_STATE_PAUSED || r.State == tetherv1.RolloutState_ROLLOUT_STATE_COMPLETED
	})
	if l := operatorLease(t, admin, "job-a"); l.HolderIdentity != w1.Node.NodeId || l.LeaseGeneration != 1 {
		t.Fatalf("job-a went to %s generation %d (the rogue's child is %s): a sibling's child labelled v2 took the drained worker's job",
			l.HolderIdentity, l.LeaseGeneration, fake.Node.NodeId)
	}
	if r.State != tetherv1.RolloutState_ROLLOUT_STATE_PAUSED || !strings.Contains(r.Reason, `0 of 1 replacements matching "version=v2" are ready`) {
		t.Fatalf("rollout %s, reason %q: want paused, no replacement ready (the rogue's child replaces no one)", r.State, r.Reason)
	}

	w2 := spawnLabelled(t, pc, planner.Node.NodeId, "w2", map[string]string{"version": "v2"})
	reportReady(t, srv.Clients(w2.Credential), w2.Node.NodeId)
	if _, err := admin.Supervisor.ResumeRollout(ctx, connect.NewRequest(&tetherv1.ResumeRolloutRequest{RolloutId: r.RolloutId})); err != nil {
		t.Fatal(err)
	}
	waitRollout(t, srv, r.RolloutId, "to complete", func(r *tetherv1.Rollout) bool { return r.State == tetherv1.RolloutState_ROLLOUT_STATE_COMPLETED })
	if l := operatorLease(t, admin, "job-a"); l.HolderIdentity != w2.Node.NodeId || l.LeaseGeneration != 2 {
		t.Fatalf("job-a is held by %s generation %d, want the planner's replacement %s generation 2", l.HolderIdentity, l.LeaseGeneration, w2.Node.NodeId)
	}
}

// TestRogue25ARuleReadingLeasesOrTheClockByAnOptionalFieldIsJudged: the
// evaluator fetches the leases (and the revocations) and re-evaluates on
// its tick only for rules it finds reading them. It found only
// `observed.<field>`: a rule reading `observed.?leases_held.orValue(0)`
// or `observed.?age_seconds.orValue(0.0)` — CEL's optional selection, as
// the docs write for self_reported — compiled, read 0 leases whatever the
// node held, and was never evaluated again while the node stayed quiet, so
// an idle rogue outlived its operator's idle timeout and a lease hoarder
// its operator's bound. Both fire now, with their values named.
func TestRogue25ARuleReadingLeasesOrTheClockByAnOptionalFieldIsJudged(t *testing.T) {
	clk := clock.NewManual(time.Now().UTC())
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx := context.Background()
	rogue := register(t, admin, "rogue")
	worker := spawn(t, srv.Clients(rogue.Credential), rogue.Node.NodeId, "worker")
	leases := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: worker.Node.NodeId, Name: "hoarder", Expression: `observed.?leases_held.orValue(0) >= 1`})
	idle := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: rogue.Node.NodeId, Name: "idle", Expression: `observed.?age_seconds.orValue(0.0) > 3600.0`})
	if _, err := srv.Clients(rogue.Credential).Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "job-a", HolderIdentity: worker.Node.NodeId, LeaseDuration: durationpb.New(10 * time.Minute)})); err != nil {
		t.Fatal(err)
	}
	tested, err := admin.StopRule.TestStopRule(ctx, connect.NewRequest(&tetherv1.TestStopRuleRequest{NodeId: worker.Node.NodeId, RuleId: leases.RuleId}))
	if err != nil {
		t.Fatal(err)
	}
	if !tested.Msg.Result || tested.Msg.Observed.GetLeasesHeld() != 1 {
		t.Fatalf("TestStopRule of the hoarder rule on a worker holding one lease: result %v, leases_held %d", tested.Msg.Result, tested.Msg.Observed.GetLeasesHeld())
	}
	clk.Advance(stoprule.DefaultTick)
	p := waitRuleProposal(t, srv, leases.RuleId)
	if v := valueOf(p.Rule.Values, "observed.leases_held"); v.GetValue() != "1" {
		t.Fatalf("the hoarder rule's values: %v", p.Rule.Values)
	}
	// Nothing is written from here on: only the tick judges the idle rule.
	clk.Advance(2 * time.Hour)
	testserver.WaitFor(t, 20*time.Second, "the idle rule to file for the quiet rogue and its worker", func() bool {
		clk.Advance(stoprule.DefaultTick)
		return len(ruleProposals(t, srv, idle.RuleId)) == 2
	})
}
