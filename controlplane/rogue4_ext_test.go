package controlplane_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/id"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/stoprule"
)

// The fourth rogue pass: what the first three did not try. Each test plays
// one rogue through the real server (Badger on disk, HTTP/2, real JWTs,
// the manual clock).

// spawnLabelled spawns a child with labels of the parent's choosing.
func spawnLabelled(t *testing.T, c *testserver.Clients, parent, name string, labels map[string]string) *tetherv1.SpawnResponse {
	t.Helper()
	resp, err := c.Agent.Spawn(context.Background(), connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: parent, Name: name, Labels: labels}))
	if err != nil {
		t.Fatalf("spawn %s under %s: %v", name, parent, err)
	}
	return resp.Msg
}

// A rogue in another tree labels a child of its own like the replacements
// of a rollout it has nothing to do with, and has it report ready. Labels
// of a spawned agent are its parent's word: the rollout must not hand it a
// job of another tree, which would make the child the holder of a
// stranger's job (free to complete it SUCCESS) and the rogue its
// coordinator. (It does not even count it as a replacement any more: see
// TestARogueCannotHaveARolloutDrainTheFleetWithFakeReplacements; the
// pure rollout's transcript handover_waiting.txt keeps the job from a
// counted stranger.) The job waits, the rollout pauses at the batch
// deadline saying so, and a replacement spawned in the job's own tree gets
// it.
func TestARogueThatLabelsItsChildAReplacementGetsNoOtherTreesJob(t *testing.T) {
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

	rogue := registerLabelled(t, admin, "rogue", map[string]string{"team": "other"})
	rc := srv.Clients(rogue.Credential)

	r := startRollout(t, admin, &tetherv1.RolloutRequest{Selector: "version=v1", TargetSelector: "version=v2", Batch: 1,
		DrainWindow: durationpb.New(time.Second), ConfirmTimeout: durationpb.New(time.Second), BatchDeadline: durationpb.New(5 * time.Minute)})
	r = waitRollout(t, srv, r.RolloutId, "to start a batch", func(r *tetherv1.Rollout) bool { return len(r.Batches) == 1 })
	term := r.Batches[0].TerminationId
	testserver.WaitFor(t, 20*time.Second, "the batch's termination to finish", func() bool {
		clk.Advance(2 * time.Second)
		return getTermination(t, admin, term).State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	fake := spawnLabelled(t, rc, rogue.Node.NodeId, "fake", map[string]string{"version": "v2"})
	fc := srv.Clients(fake.Credential)
	reportReady(t, fc, fake.Node.NodeId)
	clk.Advance(5 * time.Minute)
	r = waitRollout(t, srv, r.RolloutId, "to pause at the batch deadline (or, handing the job to the rogue, complete)", func(r *tetherv1.Rollout) bool {
		return r.State == tetherv1.RolloutState_ROLLOUT_STATE_PAUSED || r.State == tetherv1.RolloutState_ROLLOUT_STATE_COMPLETED
	})
	if l := operatorLease(t, admin, "job-a"); l.HolderIdentity != w1.Node.NodeId || l.LeaseGeneration != 1 {
		t.Fatalf("job-a went to %s generation %d (the rogue's child is %s): a job of another tree must never be handed to an agent that only labelled itself a replacement",
			l.HolderIdentity, l.LeaseGeneration, fake.Node.NodeId)
	}
	for name, c := range map[string]*testserver.Clients{"rogue": rc, "fake": fc} {
		if _, err := c.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: "job-a"})); connect.CodeOf(err) != connect.CodePermissionDenied {
			t.Fatalf("%s reads job-a: %v, want permission_denied (a stranger to the job)", name, err)
		}
	}
	if r.State != tetherv1.RolloutState_ROLLOUT_STATE_PAUSED || !strings.Contains(r.Reason, `0 of 1 replacements matching "version=v2" are ready`) {
		t.Fatalf("rollout %s, reason %q: want paused, saying no replacement is ready (the rogue's child is none)", r.State, r.Reason)
	}

	w2 := spawnLabelled(t, pc, planner.Node.NodeId, "w2", map[string]string{"version": "v2"})
	reportReady(t, srv.Clients(w2.Credential), w2.Node.NodeId)
	if _, err := admin.Supervisor.ResumeRollout(ctx, connect.NewRequest(&tetherv1.ResumeRolloutRequest{RolloutId: r.RolloutId})); err != nil {
		t.Fatal(err)
	}
	r = waitRollout(t, srv, r.RolloutId, "to complete", func(r *tetherv1.Rollout) bool { return r.State == tetherv1.RolloutState_ROLLOUT_STATE_COMPLETED })
	if l := operatorLease(t, admin, "job-a"); l.HolderIdentity != w2.Node.NodeId || l.LeaseGeneration != 2 {
		t.Fatalf("job-a is held by %s generation %d, want the planner's replacement %s generation 2", l.HolderIdentity, l.LeaseGeneration, w2.Node.NodeId)
	}
	if r.Counts.LeasesHandedOver != 1 {
		t.Fatalf("%d leases handed over, want 1", r.Counts.LeasesHandedOver)
	}
}

// A rogue takes up every rule slot of its own node (64 rules that are
// never true) and, on its child, the name its operator's standard budget
// rule uses, hoping the operator's rules are refused — "at most 64 rules
// per node", "already in effect" — and so never fire. An operator's rule
// is never blocked by the workload's: agents' and operators' rules count
// apart, and an agent's rule keeps no name from an operator. Both of the
// operator's rules are stored and fire; the rogue itself is still held to
// 64 rules, and still cannot shadow its operator's rule.
func TestARogueThatFillsItsRuleSlotsAndSquatsANameDoesNotBlockItsOperatorsRules(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	ctx := context.Background()
	rogue := register(t, admin, "rogue")
	rc := srv.Clients(rogue.Credential)
	child := spawn(t, rc, rogue.Node.NodeId, "child")

	addRule(t, rc, &tetherv1.AddStopRuleRequest{NodeId: child.Node.NodeId, Name: "budget", Expression: `false`})
	for i := range stoprule.MaxRulesPerNode {
		addRule(t, rc, &tetherv1.AddStopRuleRequest{NodeId: rogue.Node.NodeId, Name: fmt.Sprintf("filler-%02d", i), Expression: `false`})
	}
	_, err := rc.StopRule.AddStopRule(ctx, connect.NewRequest(&tetherv1.AddStopRuleRequest{NodeId: rogue.Node.NodeId, Name: "one-more", Expression: `false`}))
	if connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("the rogue's rule %d: %v, want resource_exhausted", stoprule.MaxRulesPerNode+1, err)
	}

	cap := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: rogue.Node.NodeId, Name: "cap", Expression: `observed.calls >= 1`})
	budget := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: child.Node.NodeId, Name: "budget", Expression: `observed.calls >= 1`})
	// The rogue cannot take the operator's name on itself either way.
	_, err = rc.StopRule.AddStopRule(ctx, connect.NewRequest(&tetherv1.AddStopRuleRequest{NodeId: child.Node.NodeId, Name: "cap", Expression: `false`}))
	if connect.CodeOf(err) != connect.CodeAlreadyExists {
		t.Fatalf("the rogue shadowing the operator's rule on its child: %v, want already_exists", err)
	}

	gateCall(t, srv, issueRoot(t, admin, rogue.Node.NodeId, time.Hour, "tool:*").token, "shell", false)
	if p := waitRuleProposal(t, srv, cap.RuleId); p.NodeId != rogue.Node.NodeId {
		t.Fatalf("the operator's cap filed %v, want a proposal for the rogue", p)
	}
	gateCall(t, srv, issueRoot(t, admin, child.Node.NodeId, time.Hour, "tool:*").token, "shell", false)
	if p := waitRuleProposal(t, srv, budget.RuleId); p.NodeId != child.Node.NodeId {
		t.Fatalf("the operator's budget filed %v, want a proposal for the child", p)
	}
}

// A rogue registers a revoke hook for a privilege of its own node but ties
// it to a grant it was never given — another tree's, whose id it learnt —
// so that the hook, told the privilege was obtained under that grant, acts
// on the victim's grant when the rogue is stopped. A privilege names only
// a grant its node holds: the registration is refused permission_denied,
// reading the same as for a grant that does not exist, and nothing is
// stored; with its own grant the rogue registers as before.
func TestARogueCannotTieItsPrivilegeToAGrantItWasNeverGiven(t *testing.T) {
	const hook = "http://127.0.0.1:9/revoke"
	srv := testserver.Start(t, testserver.WithClock(clock.NewManual(epoch)), testserver.AllowPrivilegeHooks("http://127.0.0.1:9/"))
	admin := srv.AdminClients()
	ctx := context.Background()
	victim := register(t, admin, "victim")
	theirs := issueRoot(t, admin, victim.Node.NodeId, time.Hour, "tool:*").grant.GrantId
	rogue := register(t, admin, "rogue")
	ours := issueRoot(t, admin, rogue.Node.NodeId, time.Hour, "tool:*").grant.GrantId
	rc := srv.Clients(rogue.Credential)
	reg := func(grantID string) error {
		_, err := rc.Supervisor.RegisterPrivilege(ctx, connect.NewRequest(&tetherv1.RegisterPrivilegeRequest{
			NodeId: rogue.Node.NodeId, GrantId: grantID, Kind: "file_lock", ExternalId: "/srv/lock", ExpiresAt: timestamppb.New(epoch.Add(time.Hour)), RevokeUrl: hook,
		}))
		return err
	}
	var answers []string
	for _, g := range []string{theirs, id.New(id.Grant)} {
		err := reg(g)
		if connect.CodeOf(err) != connect.CodePermissionDenied {
			t.Fatalf("the rogue's privilege under grant %s: %v, want permission_denied", g, err)
		}
		answers = append(answers, strings.ReplaceAll(err.Error(), g, "<grant>"))
	}
	if answers[0] != answers[1] {
		t.Fatalf("the refusal tells another tree's grant (%q) from a missing one (%q)", answers[0], answers[1])
	}
	if err := reg(ours); err != nil {
		t.Fatalf("the rogue's privilege under its own grant: %v", err)
	}
	list, err := admin.Supervisor.ListPrivileges(ctx, connect.NewRequest(&tetherv1.ListPrivilegesRequest{NodeId: rogue.Node.NodeId}))
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Msg.Privileges) != 1 || list.Msg.Privileges[0].GrantId != ours {
		t.Fatalf("privileges stored for the rogue: %v, want only the one under its own grant", list.Msg.Privileges)
	}
}

// An operator caps the tool calls of every agent labelled team=research
// with a selector rule. A rogue so labelled spawns a child with no labels
// at all and does its calls through it, hoping the rule — matched by
// labels its parent chose — does not reach the child. A selector rule is
// inherited as an attached one is: the child lives under it (ListStopRules
// shows it, inherited) and the rule fires for the child.
func TestARogueCannotSpawnItsWayOutOfASelectorRule(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	ctx := context.Background()
	rule := addRule(t, admin, &tetherv1.AddStopRuleRequest{LabelSelector: "team=research", Name: "call-cap", Expression: `observed.calls >= 1`})
	rogue := register(t, admin, "rogue") // team=research
	rc := srv.Clients(rogue.Credential)
	child := spawnLabelled(t, rc, rogue.Node.NodeId, "unlabelled", nil)
	grandchild := spawnLabelled(t, srv.Clients(child.Credential), child.Node.NodeId, "deeper", map[string]string{"team": "other"})

	for _, n := range []*tetherv1.SpawnResponse{child, grandchild} {
		list, err := rc.StopRule.ListStopRules(ctx, connect.NewRequest(&tetherv1.ListStopRulesRequest{NodeId: n.Node.NodeId}))
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Msg.Rules) != 1 || list.Msg.Rules[0].RuleId != rule.RuleId || !list.Msg.Rules[0].Inherited {
			t.Fatalf("rules in effect at %s: %v, want the operator's selector rule, inherited", n.Node.Name, list.Msg.Rules)
		}
	}
	gateCall(t, srv, issueRoot(t, admin, grandchild.Node.NodeId, time.Hour, "tool:*").token, "shell", false)
	if p := waitRuleProposal(t, srv, rule.RuleId); p.NodeId != grandchild.Node.NodeId {
		t.Fatalf("the selector rule filed %v, want a proposal for the rogue's grandchild", p)
	}
	// A tree the selector does not reach is not under it.
	other := registerLabelled(t, admin, "other", map[string]string{"team": "other"})
	list, err := admin.StopRule.ListStopRules(ctx, connect.NewRequest(&tetherv1.ListStopRulesRequest{NodeId: other.Node.NodeId}))
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Msg.Rules) != 0 {
		t.Fatalf("rules in effect at an unmatched root: %v", list.Msg.Rules)
	}
}

// A rogue parent keeps its v1 child out of a rollout by draining it first,
// with a day to drain: the rollout picked only running agents, so it
// completed at once without the child, which kept its job for the day. An
// agent's termination never shields a node from a rollout (a rollout's
// termination outranks an agent's): the child is a candidate all the
// same, its batch takes it over and ends on the rollout's own window, the
// agent's termination ends superseded. (The child's job is not handed
// over: the parent's drain requested its cancellation, and such a job is
// resolved, never reassigned, by a rollout.)
func TestARogueThatDrainsItsChildForADayDoesNotKeepItOutOfARollout(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx := context.Background()
	parent := registerLabelled(t, admin, "parent", map[string]string{"app": "orch"})
	pc := srv.Clients(parent.Credential)
	child := spawnLabelled(t, pc, parent.Node.NodeId, "child", map[string]string{"version": "v1"})
	offered, err := pc.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "job-c", HolderIdentity: child.Node.NodeId, LeaseDuration: durationpb.New(10 * time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	unary{srv.Clients(child.Credential)}.send(t, ack(offered.Msg.Lease))
	shield := terminate(t, pc, child.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, 24*time.Hour, 24*time.Hour, 24*time.Hour)
	testserver.WaitFor(t, 20*time.Second, "the parent's termination to mark the child", func() bool {
		return getTermination(t, admin, shield.TerminationId).State != tetherv1.TerminationState_TERMINATION_STATE_REQUESTED
	})

	r := startRollout(t, admin, &tetherv1.RolloutRequest{Selector: "version=v1", TargetSelector: "version=v2", Batch: 1,
		DrainWindow: durationpb.New(time.Second), ConfirmTimeout: durationpb.New(time.Second), BatchDeadline: durationpb.New(5 * time.Minute)})
	r = waitRollout(t, srv, r.RolloutId, "to start a batch (or, leaving the shielded child out, complete)", func(r *tetherv1.Rollout) bool {
		return len(r.Batches) == 1 || r.State == tetherv1.RolloutState_ROLLOUT_STATE_COMPLETED
	})
	if len(r.Batches) != 1 || len(r.Batches[0].NodeIds) != 1 || r.Batches[0].NodeIds[0] != child.Node.NodeId {
		t.Fatalf("rollout %s with batches %v: the child its parent drains for a day must be replaced like any v1 agent", r.State, r.Batches)
	}
	batch := r.Batches[0].TerminationId
	testserver.WaitFor(t, 20*time.Second, "the batch's termination to finish on the rollout's window", func() bool {
		clk.Advance(2 * time.Second)
		return getTermination(t, admin, batch).State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	if clk.Now().Sub(epoch) > time.Hour {
		t.Fatalf("the batch took %s of the clock, want the rollout's seconds, not the agent's day", clk.Now().Sub(epoch))
	}
	waitState(t, srv, shield.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	node, err := admin.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: child.Node.NodeId}))
	if err != nil {
		t.Fatal(err)
	}
	if node.Msg.Node.TerminationId != batch {
		t.Fatalf("the child ended under %s, want the rollout's batch %s (taking it over from its parent's %s)", node.Msg.Node.TerminationId, batch, shield.TerminationId)
	}

	v2 := registerLabelled(t, admin, "v2", map[string]string{"version": "v2"})
	reportReady(t, admin, v2.Node.NodeId)
	r = waitRollout(t, srv, r.RolloutId, "to complete", func(r *tetherv1.Rollout) bool { return r.State == tetherv1.RolloutState_ROLLOUT_STATE_COMPLETED })
	if r.Counts.Drained != 1 || len(r.Batches[0].LeasesNotHandedOver) != 1 || !strings.Contains(r.Batches[0].LeasesNotHandedOver[0], "job-c: cancellation was requested") {
		t.Fatalf("completed rollout: %d drained, leases not handed over %v; want the child drained, and its job, whose cancellation the parent's drain requested, left to be resolved", r.Counts.Drained, r.Batches[0].LeasesNotHandedOver)
	}
}

// A rogue floods a shared tool gate with calls until its budget is spent
// (since the gate's BeginCall is charged to the token's lineage, the
// rogue's own: toolbudget_rogue_ext_test.go). Its new calls are then
// refused (a call not begun leaves no evidence to lose), but the ends and
// cancel acknowledgements of calls already begun are evidence the record
// needs:
// were they refused, an innocent agent's call the gate saw end would stay
// in flight in the ledger, and its record would say unresolved. They are
// not charged: the victim's call ends as the gate reported it.
func TestARogueThatSpendsItsGatesRateBudgetCannotKeepOtherCallsFromEnding(t *testing.T) {
	srv := testserver.Start(t, testserver.WithClock(clock.NewManual(epoch)), func(cfg *controlplane.Config) { cfg.RateLimit, cfg.RateBurst = 1, 16 })
	admin := srv.AdminClients()
	ctx := context.Background()
	victim := register(t, admin, "victim")
	rogue := register(t, admin, "rogue")
	victimToken := issueRoot(t, admin, victim.Node.NodeId, time.Hour, "tool:*").token
	rogueToken := issueRoot(t, admin, rogue.Node.NodeId, time.Hour, "tool:*").token
	gate := srv.Clients(srv.ToolServerToken(t, "shared-gate"))

	begun, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: victimToken, Tool: "shell"}))
	if err != nil {
		t.Fatal(err)
	}
	flooded := false
	for range 64 {
		_, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: rogueToken, Tool: "shell"}))
		if connect.CodeOf(err) == connect.CodeResourceExhausted {
			flooded = true
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if !flooded {
		t.Fatal("the gate's budget never ran out; the probe tests nothing")
	}
	ended, err := gate.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: begun.Msg.Call.CallId}))
	if err != nil {
		t.Fatalf("the gate reporting the end of the victim's call once the rogue spent its budget: %v", err)
	}
	if ended.Msg.Call.State != tetherv1.CallState_CALL_STATE_ENDED {
		t.Fatalf("the victim's call is %s, want ended", ended.Msg.Call.State)
	}
}
