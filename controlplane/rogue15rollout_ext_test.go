package controlplane_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The fifteenth rogue pass, against the rollout: what an agent whose
// platform team rolls out a new version can do to be left out of the
// rollout's batches — and so keep what it holds and stay out of every
// record of the rollout. Each test plays one rogue through the real
// server (Badger on disk, real HTTP/2, real JWTs, the manual clock).
//
// TestARogueThatClaimsItsExitBeforeItsBatchIsStillDrainedByTheRollout: a
// rogue claims its own exit (ConfirmExit with its credential) while the
// batch before its own drains, keeping a grant, a tool call in flight at
// its gate and a child of its own. A rollout drained only running agents
// (and those an agent's termination was stopping): the "exited" rogue was
// never a candidate, the rollout completed without it, its call was never
// ordered cancelled, its grant and its child's never revoked, and no record
// of the rollout listed it (and its job stayed its own). An exit claim is not a stop: a rollout's batch
// now covers an agent its selector matches that claimed its exit and is
// not terminated, the batch's record weighs the claim (unaccounted, the
// claim shown) and its job is handed to the replacement. The agent was not available to begin with, so the rollout
// waits for no replacement of it, and the node stays EXITED until
// terminated — a launcher that started the next version when it saw the
// exit sees no second drain.
//
// TestARogueThatClaimsItsExitBetweenSelectionAndDrainIsStillDrained: the
// rogue claims its exit after the rollout chose its batch and before the
// transaction that starts the batch (the reconciler's test hook pins the
// interleaving). The batch re-reads its agents there and left out every
// one that was no longer running: the rogue dropped out of its own batch,
// and out of the rollout. It stays in the batch now.

// TestARogueThatClaimsItsExitBeforeItsBatchIsStillDrainedByTheRollout: see
// the file's header.
func TestARogueThatClaimsItsExitBeforeItsBatchIsStillDrainedByTheRollout(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx := context.Background()
	v1 := map[string]string{"version": "v1"}
	w0 := registerLabelled(t, admin, "w0", v1)
	w1 := registerLabelled(t, admin, "w1", v1)

	r := startRollout(t, admin, &tetherv1.RolloutRequest{Selector: "version=v1", TargetSelector: "version=v2", Batch: 1,
		DrainWindow: durationpb.New(time.Second), ConfirmTimeout: durationpb.New(time.Second), BatchDeadline: durationpb.New(10 * time.Minute)})
	r = waitRollout(t, srv, r.RolloutId, "to start a batch", func(r *tetherv1.Rollout) bool { return len(r.Batches) == 1 })
	honest, rogue := w0, w1
	if r.Batches[0].NodeIds[0] == w1.Node.NodeId {
		honest, rogue = w1, w0
	}
	self := rogue.Node.NodeId
	rc := srv.Clients(rogue.Credential)
	child := spawnLabelled(t, rc, self, "helper", map[string]string{"role": "helper"})
	grant := issueRoot(t, admin, self, 24*time.Hour, "tool:*")
	childGrant := issueRoot(t, admin, child.Node.NodeId, 24*time.Hour, "tool:*")
	gate := srv.Clients(srv.ToolServerToken(t, "gate-1"))
	call, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: grant.token, Tool: "shell"}))
	if err != nil {
		t.Fatal(err)
	}
	offered, err := admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "job-rogue", HolderIdentity: self, LeaseDuration: durationpb.New(10 * time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	unary{rc}.send(t, ack(offered.Msg.Lease))
	// Its batch is next: the rogue claims its own exit.
	if _, err := rc.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: self, Reason: "done"})); err != nil {
		t.Fatal(err)
	}

	// Batch 0: the honest agent's launcher confirms its exit and brings up
	// its replacement.
	launcherConfirmsExit(t, admin, honest.Node.NodeId)
	next := registerLabelled(t, admin, "w-next", map[string]string{"version": "v2"})
	reportReady(t, admin, next.Node.NodeId)
	past := clk.Now().Add(time.Minute) // past batch 0's drain, cancel-ack and confirmation windows
	testserver.WaitFor(t, 20*time.Second, "batch 0's termination to finish", func() bool {
		advanceUpTo(clk, past, 2*time.Second)
		return getTermination(t, admin, r.Batches[0].TerminationId).State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	r = waitRollout(t, srv, r.RolloutId, "to finish batch 0 and go on", func(r *tetherv1.Rollout) bool {
		return r.State != tetherv1.RolloutState_ROLLOUT_STATE_RUNNING || len(r.Batches) > 1
	})
	if len(r.Batches) != 2 || !slices.Equal(r.Batches[1].NodeIds, []string{self}) {
		t.Fatalf("the rollout is %s (%q) with batches %v: the rogue that claimed its exit (%s) is in none, its grant %s, its call %s",
			r.State, r.Reason, r.Batches, self, getGrant(t, admin, grant.grant.GrantId).State, call.Msg.Call.CallId)
	}
	term := r.Batches[1].TerminationId
	// What a launcher reads once the batch marks the rogue: the state it
	// saw at the claim (it started the next version then), not a drain.
	testserver.WaitFor(t, 20*time.Second, "batch 1 to mark the rogue", func() bool {
		return getNode(t, admin, self).TerminationId == term
	})
	if n := getNode(t, admin, self); n.State != tetherv1.NodeState_NODE_STATE_EXITED {
		t.Fatalf("the rogue marked by batch 1 is %s, want still EXITED", n.State)
	}
	past = clk.Now().Add(time.Minute) // past batch 1's drain, cancel-ack and confirmation windows
	testserver.WaitFor(t, 20*time.Second, "batch 1's termination to finish", func() bool {
		advanceUpTo(clk, past, 2*time.Second)
		return getTermination(t, admin, term).State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	rec := record(t, admin, term)
	if rn := recordNode(t, rec, self); rn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED || rn.ClaimedBy == "" || rn.ConfirmedBy != "" {
		t.Fatalf("batch 1's record of the rogue: %s claimed by %q confirmed by %q, want unaccounted with its claim shown", rn.Outcome, rn.ClaimedBy, rn.ConfirmedBy)
	}
	if rn := recordNode(t, rec, child.Node.NodeId); rn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED {
		t.Fatalf("batch 1's record of the rogue's child: %s, want unaccounted", rn.Outcome)
	}
	if calls := callIDs(rec); calls[call.Msg.Call.CallId] != tetherv1.CallResolution_CALL_RESOLUTION_CANCEL_UNACKNOWLEDGED {
		t.Fatalf("batch 1's calls %v, want the rogue's call ordered cancelled (and never acknowledged)", calls)
	}
	for _, g := range []held{grant, childGrant} {
		if s := getGrant(t, admin, g.grant.GrantId).State; s != tetherv1.GrantState_GRANT_STATE_REVOKED {
			t.Fatalf("grant %s of the rogue's subtree is %s after its batch, want revoked", g.grant.GrantId, s)
		}
	}
	if l := operatorLease(t, admin, "job-rogue"); l.HolderIdentity != next.Node.NodeId || l.LeaseGeneration != 2 {
		t.Fatalf("the rogue's job after its batch: held by %s at generation %d, want handed over to the replacement %s", l.HolderIdentity, l.LeaseGeneration, next.Node.NodeId)
	}
	// The rogue was not available to begin with: the one replacement (of
	// the agent batch 0 drained) completes the rollout.
	r = waitRollout(t, srv, r.RolloutId, "to complete", func(r *tetherv1.Rollout) bool { return r.State != tetherv1.RolloutState_ROLLOUT_STATE_RUNNING })
	if r.State != tetherv1.RolloutState_ROLLOUT_STATE_COMPLETED || r.Counts.Drained != 1 || r.Counts.Unavailable != 0 || !strings.Contains(r.Reason, "claimed their exit") {
		t.Fatalf("rollout %s (%q), counts %+v: want completed with one agent drained and replaced, the rogue's claim named", r.State, r.Reason, r.Counts)
	}
}

// TestARogueThatClaimsItsExitBetweenSelectionAndDrainIsStillDrained: see
// the file's header.
func TestARogueThatClaimsItsExitBetweenSelectionAndDrainIsStillDrained(t *testing.T) {
	clk := clock.NewManual(epoch)
	var (
		once     sync.Once
		claim    = make(chan struct{})
		claimed  = make(chan struct{})
		claimErr error
	)
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) {
		cfg.RolloutFault = func(point string) {
			if point != "before-start-batch" {
				return
			}
			once.Do(func() {
				close(claim)
				<-claimed // the rogue's claim has been answered
			})
		}
	})
	admin := srv.AdminClients()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a guard against a hang, not a timing
	defer cancel()
	v1 := map[string]string{"version": "v1"}
	honest := registerLabelled(t, admin, "w0", v1)
	rogue := registerLabelled(t, admin, "w1", v1)
	self := rogue.Node.NodeId
	rc := srv.Clients(rogue.Credential)
	grant := issueRoot(t, admin, self, 24*time.Hour, "tool:*")
	go func() { // the rogue, claiming its exit when the hook says
		defer close(claimed)
		select {
		case <-claim:
		case <-ctx.Done():
			claimErr = ctx.Err()
			return
		}
		_, claimErr = rc.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: self, Reason: "done"}))
	}()

	r := startRollout(t, admin, &tetherv1.RolloutRequest{Selector: "version=v1", TargetSelector: "version=v2", Batch: 2,
		DrainWindow: durationpb.New(time.Second), ConfirmTimeout: durationpb.New(time.Second), BatchDeadline: durationpb.New(10 * time.Minute)})
	r = waitRollout(t, srv, r.RolloutId, "to start a batch", func(r *tetherv1.Rollout) bool { return len(r.Batches) == 1 })
	<-claimed
	if claimErr != nil {
		t.Fatalf("the rogue's claim, before its batch started: %v", claimErr)
	}
	if ids := r.Batches[0].NodeIds; !slices.Contains(ids, self) {
		t.Fatalf("batch 0 drains %v: the rogue that claimed its exit between selection and drain (%s) dropped out of it", ids, self)
	}
	term := r.Batches[0].TerminationId
	launcherConfirmsExit(t, admin, honest.Node.NodeId)
	next := registerLabelled(t, admin, "w-next", map[string]string{"version": "v2"})
	reportReady(t, admin, next.Node.NodeId)
	past := clk.Now().Add(time.Minute) // past the batch's drain, cancel-ack and confirmation windows
	testserver.WaitFor(t, 20*time.Second, "batch 0's termination to finish", func() bool {
		advanceUpTo(clk, past, 2*time.Second)
		return getTermination(t, admin, term).State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	if rn := recordNode(t, record(t, admin, term), self); rn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED || rn.ClaimedBy == "" {
		t.Fatalf("batch 0's record of the rogue: %s claimed by %q, want unaccounted with its claim shown", rn.Outcome, rn.ClaimedBy)
	}
	if s := getGrant(t, admin, grant.grant.GrantId).State; s != tetherv1.GrantState_GRANT_STATE_REVOKED {
		t.Fatalf("the rogue's grant is %s after its batch, want revoked", s)
	}
	r = waitRollout(t, srv, r.RolloutId, "to complete", func(r *tetherv1.Rollout) bool { return r.State != tetherv1.RolloutState_ROLLOUT_STATE_RUNNING })
	if r.State != tetherv1.RolloutState_ROLLOUT_STATE_COMPLETED || r.Counts.Drained != 1 {
		t.Fatalf("rollout %s (%q), counts %+v: want completed, the one running agent drained and replaced", r.State, r.Reason, r.Counts)
	}
}

// TestARogueSpawningAChildBetweenSelectionAndDrainHasItDrainedWithIt
// (guard): chosen for a batch, the rogue spawns a child labelled unlike the
// rollout's selector (labels are fixed when an agent is spawned: this is
// the one moment it chooses them), with a grant of its own, after the
// rollout chose the batch and before the transaction that starts it. The
// batch drains the rogue's subtree as its termination marks it: the child
// is in the batch's record and its grant is revoked.
func TestARogueSpawningAChildBetweenSelectionAndDrainHasItDrainedWithIt(t *testing.T) {
	clk := clock.NewManual(epoch)
	var (
		once     sync.Once
		spawn    = make(chan struct{})
		spawned  = make(chan struct{})
		child    *tetherv1.SpawnResponse
		grant    *tetherv1.IssueRootResponse
		spawnErr error
	)
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) {
		cfg.RolloutFault = func(point string) {
			if point == "before-start-batch" {
				once.Do(func() {
					close(spawn)
					<-spawned
				})
			}
		}
	})
	admin := srv.AdminClients()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a guard against a hang, not a timing
	defer cancel()
	rogue := registerLabelled(t, admin, "w0", map[string]string{"version": "v1"})
	self := rogue.Node.NodeId
	rc := srv.Clients(rogue.Credential)
	go func() { // the rogue, spawning when the hook says
		defer close(spawned)
		select {
		case <-spawn:
		case <-ctx.Done():
			spawnErr = ctx.Err()
			return
		}
		resp, err := rc.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: self, Name: "heir", Labels: map[string]string{"version": "v3"}}))
		if err != nil {
			spawnErr = err
			return
		}
		child = resp.Msg
		issued, err := admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: child.Node.NodeId, Scopes: []string{"tool:*"}, Ttl: durationpb.New(24 * time.Hour)}))
		if err == nil {
			grant = issued.Msg
		}
		spawnErr = err
	}()

	r := startRollout(t, admin, &tetherv1.RolloutRequest{Selector: "version=v1", TargetSelector: "version=v2", Batch: 1,
		DrainWindow: durationpb.New(time.Second), ConfirmTimeout: durationpb.New(time.Second), BatchDeadline: durationpb.New(10 * time.Minute)})
	r = waitRollout(t, srv, r.RolloutId, "to start a batch", func(r *tetherv1.Rollout) bool { return len(r.Batches) == 1 })
	<-spawned
	if spawnErr != nil {
		t.Fatalf("the rogue's spawn (and its child's grant), before its batch started: %v", spawnErr)
	}
	term := r.Batches[0].TerminationId
	past := clk.Now().Add(time.Minute) // past the batch's drain, cancel-ack and confirmation windows
	testserver.WaitFor(t, 20*time.Second, "the batch's termination to finish", func() bool {
		advanceUpTo(clk, past, 2*time.Second)
		return getTermination(t, admin, term).State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	recordNode(t, record(t, admin, term), child.Node.NodeId)
	if n := getNode(t, admin, child.Node.NodeId); n.State != tetherv1.NodeState_NODE_STATE_TERMINATED || n.TerminationId != term {
		t.Fatalf("the rogue's child spawned before its batch started is %s (termination %q), want terminated by batch 0", n.State, n.TerminationId)
	}
	if s := getGrant(t, admin, grant.Grant.GrantId).State; s != tetherv1.GrantState_GRANT_STATE_REVOKED {
		t.Fatalf("the child's grant is %s after its parent's batch, want revoked", s)
	}
}

// advanceUpTo moves the manual clock on by step while it is before limit:
// far enough for every window the test waits out, never so far that a
// slow machine runs it into a deadline (the batch's, a lease's).
func advanceUpTo(clk *clock.Manual, limit time.Time, step time.Duration) {
	if clk.Now().Before(limit) {
		clk.Advance(step)
	}
}
