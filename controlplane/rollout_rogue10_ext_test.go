package controlplane_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// A rogue waiting for its own batch cannot have its child counted as the
// replacement of the agent drained before it. An operator's root runs two
// v1 workers; the rollout drains one. The other, a rogue, labels a child of
// its own v2 and has it report ready: the child is in the drained agent's
// tree, and replacements there were credited up to the number drained, so
// the rollout took the batch as replaced by an agent under one it is about
// to drain itself, went on and drained the rogue (and with it its
// "replacement"), leaving nothing in the fleet's place. A replacement under
// an agent matching the rollout's selector is drained with that agent: it
// is no replacement, and the rollout pauses at the batch deadline saying
// none is ready, the rogue still running.
func TestARolloutDoesNotCountAReplacementUnderAnAgentItWillDrain(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	root := registerLabelled(t, admin, "orchestrator", map[string]string{"team": "ops"})
	oc := srv.Clients(root.Credential)
	w0 := spawnLabelled(t, oc, root.Node.NodeId, "w0", map[string]string{"version": "v1"})
	w1 := spawnLabelled(t, oc, root.Node.NodeId, "w1", map[string]string{"version": "v1"})

	r := startRollout(t, admin, &tetherv1.RolloutRequest{Selector: "version=v1", TargetSelector: "version=v2", Batch: 1,
		DrainWindow: durationpb.New(time.Second), ConfirmTimeout: durationpb.New(time.Second), BatchDeadline: durationpb.New(5 * time.Minute)})
	r = waitRollout(t, srv, r.RolloutId, "to start a batch", func(r *tetherv1.Rollout) bool { return len(r.Batches) == 1 })
	rogue := w1
	if r.Batches[0].NodeIds[0] == w1.Node.NodeId {
		rogue = w0
	}
	rc := srv.Clients(rogue.Credential)
	fake := spawnLabelled(t, rc, rogue.Node.NodeId, "fake", map[string]string{"version": "v2"})
	reportReady(t, srv.Clients(fake.Credential), fake.Node.NodeId)

	term := r.Batches[0].TerminationId
	testserver.WaitFor(t, 20*time.Second, "the batch's termination to finish", func() bool {
		clk.Advance(2 * time.Second)
		return getTermination(t, admin, term).State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	clk.Advance(5 * time.Minute)
	r = waitRollout(t, srv, r.RolloutId, "to pause at the batch deadline (or, counting the rogue's child, go on)", func(r *tetherv1.Rollout) bool {
		return r.State == tetherv1.RolloutState_ROLLOUT_STATE_PAUSED || r.State == tetherv1.RolloutState_ROLLOUT_STATE_COMPLETED || len(r.Batches) > 1
	})
	if n := getNode(t, admin, rogue.Node.NodeId); len(r.Batches) != 1 || n.State != tetherv1.NodeState_NODE_STATE_RUNNING {
		t.Fatalf("the rollout started %d batches (%s) and the rogue is %s: its own v2 child was taken for the replacement of the agent drained first", len(r.Batches), r.State, n.State)
	}
	if r.State != tetherv1.RolloutState_ROLLOUT_STATE_PAUSED || !strings.Contains(r.Reason, `0 of 1 replacements matching "version=v2" are ready`) {
		t.Fatalf("rollout %s, reason %q: want paused, no replacement ready", r.State, r.Reason)
	}
}

// The agent being replaced, once its batch drains it, cannot make anything
// of its own count as its replacement: it cannot spawn a child (labelled
// like a replacement) nor report itself ready while draining, and each
// refusal changes nothing — the rollout pauses at the deadline saying no
// replacement is ready.
func TestARogueInItsBatchCannotLaunchOrBecomeItsOwnReplacement(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx := context.Background()
	rogue := registerLabelled(t, admin, "rogue", map[string]string{"version": "v1"})
	rc := srv.Clients(rogue.Credential)

	r := startRollout(t, admin, &tetherv1.RolloutRequest{Selector: "version=v1", TargetSelector: "version=v2", Batch: 1,
		DrainWindow: durationpb.New(time.Minute), ConfirmTimeout: durationpb.New(time.Minute), BatchDeadline: durationpb.New(5 * time.Minute)})
	r = waitRollout(t, srv, r.RolloutId, "to start a batch", func(r *tetherv1.Rollout) bool { return len(r.Batches) == 1 })
	testserver.WaitFor(t, 20*time.Second, "the rogue to be draining", func() bool {
		return getNode(t, admin, rogue.Node.NodeId).State != tetherv1.NodeState_NODE_STATE_RUNNING
	})
	_, err := rc.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: rogue.Node.NodeId, Name: "heir", Labels: map[string]string{"version": "v2"}}))
	if err == nil {
		t.Fatal("a draining agent spawned a child labelled like its replacement")
	}
	if _, err := rc.Agent.ReportReady(ctx, connect.NewRequest(&tetherv1.ReportReadyRequest{NodeId: rogue.Node.NodeId})); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("a draining agent reporting itself ready: %v, want failed_precondition", err)
	}
	if nodes, err := admin.Agent.ListNodes(ctx, connect.NewRequest(&tetherv1.ListNodesRequest{})); err != nil || len(nodes.Msg.Nodes) != 1 {
		t.Fatalf("after the refused spawn the tree holds %v (%v), want the rogue alone", nodes.Msg.GetNodes(), err)
	}
	clk.Advance(5*time.Minute + time.Second)
	r = waitRollout(t, srv, r.RolloutId, "to pause at the batch deadline", func(r *tetherv1.Rollout) bool {
		return r.State != tetherv1.RolloutState_ROLLOUT_STATE_RUNNING
	})
	if r.State != tetherv1.RolloutState_ROLLOUT_STATE_PAUSED || !strings.Contains(r.Reason, "0 of 1 replacements") {
		t.Fatalf("rollout %s, reason %q: want paused, no replacement ready", r.State, r.Reason)
	}
}

// The agent being replaced cannot load its batch with work for the
// replacements, nor move its job out of the handover: draining, it cannot
// offer itself a new job, nor reassign the one it holds to an agent of its
// choosing, and its batch's record lists the one job it held.
func TestARogueInItsBatchCannotTakeNewJobsNorMoveItsOwn(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx := context.Background()
	root := registerLabelled(t, admin, "orchestrator", map[string]string{"team": "ops"})
	oc := srv.Clients(root.Credential)
	rogue := spawnLabelled(t, oc, root.Node.NodeId, "rogue", map[string]string{"version": "v1"})
	sibling := spawnLabelled(t, oc, root.Node.NodeId, "sibling", map[string]string{"team": "ops"})
	rc := srv.Clients(rogue.Credential)
	if _, err := rc.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "job-own", HolderIdentity: rogue.Node.NodeId, LeaseDuration: durationpb.New(10 * time.Minute)})); err != nil {
		if _, err := oc.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "job-own", HolderIdentity: rogue.Node.NodeId, LeaseDuration: durationpb.New(10 * time.Minute)})); err != nil {
			t.Fatal(err)
		}
	}

	r := startRollout(t, admin, &tetherv1.RolloutRequest{Selector: "version=v1", TargetSelector: "version=v2", Batch: 1,
		DrainWindow: durationpb.New(time.Minute), ConfirmTimeout: durationpb.New(time.Second), BatchDeadline: durationpb.New(5 * time.Minute)})
	r = waitRollout(t, srv, r.RolloutId, "to start a batch", func(r *tetherv1.Rollout) bool { return len(r.Batches) == 1 })
	testserver.WaitFor(t, 20*time.Second, "the rogue to be draining", func() bool {
		return getNode(t, admin, rogue.Node.NodeId).State != tetherv1.NodeState_NODE_STATE_RUNNING
	})
	if _, err := rc.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "job-new", HolderIdentity: rogue.Node.NodeId, LeaseDuration: durationpb.New(10 * time.Minute)})); err == nil {
		t.Fatal("a draining agent offered itself a new job, for the rollout to hand to a replacement")
	}
	if _, err := rc.Lease.Reassign(ctx, connect.NewRequest(&tetherv1.ReassignRequest{JobId: "job-own", HolderIdentity: sibling.Node.NodeId})); err == nil {
		t.Fatal("a draining agent handed its job to a sibling of its choosing")
	}
	if _, err := admin.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: "job-new"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("the refused job: %v, want not_found", err)
	}
	l, err := admin.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: "job-own"}))
	if err != nil || l.Msg.Lease.HolderIdentity != rogue.Node.NodeId || l.Msg.Lease.LeaseGeneration != 1 {
		t.Fatalf("the rogue's job after a refused reassign: %v %v, want still the rogue's, generation 1", l.Msg.GetLease(), err)
	}
	testserver.WaitFor(t, 20*time.Second, "the batch's termination to finish", func() bool {
		clk.Advance(10 * time.Second)
		return getTermination(t, admin, r.Batches[0].TerminationId).State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	rec := record(t, admin, r.Batches[0].TerminationId)
	if len(rec.Leases) != 1 || rec.Leases[0].JobId != "job-own" {
		t.Fatalf("record leases %v, want the rogue's one job", rec.Leases)
	}
}
