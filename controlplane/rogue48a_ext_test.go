package controlplane_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue48AAReplacementThatLeavesAfterItsBatchDoesNotStallTheRolloutSilently:
// a rogue parent (the planner) of two v1 workers a rollout replaces one a
// batch. Its replacement for the first is late: the batch misses its
// deadline and the rollout pauses, saying so. The replacement then reports
// ready, the paused rollout finishes the batch on it, and the replacement
// claims its exit. The operator resumes. The second worker's batch cannot
// start (one agent drained and none standing in for it: max_unavailable
// 1), and no batch was running, so no deadline was left to pause the
// rollout at: it stayed RUNNING with no reason, its last batch done and a
// worker left to drain, for as long as anyone waited (two batch deadlines
// here). It now waits for the replacements its next batch needs for one
// batch deadline, as a batch does, and then pauses naming what is
// missing; a replacement that reports ready and a resume let it finish.
func TestRogue48AAReplacementThatLeavesAfterItsBatchDoesNotStallTheRolloutSilently(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	planner := registerLabelled(t, admin, "planner", map[string]string{"role": "planner"})
	pc := srv.Clients(planner.Credential)
	workers := map[string]bool{}
	for _, name := range []string{"w1", "w2"} {
		workers[spawnLabelled(t, pc, planner.Node.NodeId, name, map[string]string{"version": "v1"}).Node.NodeId] = true
	}
	r := rolloutPausedAtItsFirstDeadline(t, srv, admin, clk)

	// The late replacement: the planner's child, standing in for the
	// planner's drained worker. The paused rollout finishes batch 0 on it.
	repl := spawnLabelled(t, pc, planner.Node.NodeId, "w1-v2", map[string]string{"version": "v2"})
	rc := srv.Clients(repl.Credential)
	reportReady(t, rc, repl.Node.NodeId)
	waitRollout(t, srv, r.RolloutId, "to finish batch 0 on the replacement", func(r *tetherv1.Rollout) bool {
		return r.Batches[0].State == tetherv1.RolloutBatchState_ROLLOUT_BATCH_STATE_DONE
	})
	// Then it leaves.
	if _, err := rc.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: repl.Node.NodeId, Reason: "done, honestly"})); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Supervisor.ResumeRollout(ctx, connect.NewRequest(&tetherv1.ResumeRolloutRequest{RolloutId: r.RolloutId})); err != nil {
		t.Fatal(err)
	}
	waitRollout(t, srv, r.RolloutId, "to see the replacement gone", func(r *tetherv1.Rollout) bool {
		return r.State == tetherv1.RolloutState_ROLLOUT_STATE_RUNNING && r.Counts.Unavailable == 1
	})

	// Two batch deadlines pass, a second at a time.
	var paused *tetherv1.Rollout
	for range 120 {
		clk.Advance(time.Second)
		if r := getRollout(t, admin, r.RolloutId); r.State != tetherv1.RolloutState_ROLLOUT_STATE_RUNNING {
			paused = r
			break
		}
	}
	if paused == nil {
		paused = waitRollout(t, srv, r.RolloutId, "to pause, two batch deadlines after it could start no batch", func(r *tetherv1.Rollout) bool {
			clk.Advance(time.Second)
			return r.State != tetherv1.RolloutState_ROLLOUT_STATE_RUNNING
		})
	}
	if paused.State != tetherv1.RolloutState_ROLLOUT_STATE_PAUSED || len(paused.Batches) != 1 {
		t.Fatalf("rollout %s with %d batches (%q), want paused before batch 1", paused.State, len(paused.Batches), paused.Reason)
	}
	for _, want := range []string{"batch 1 cannot start", `0 of 1 replacements matching "version=v2" are ready`} {
		if !strings.Contains(paused.Reason, want) {
			t.Fatalf("pause reason %q, want it to say %q", paused.Reason, want)
		}
	}

	t.Logf("paused: %s", paused.Reason)
	// A replacement that stays, and a resume, finish the rollout.
	again := spawnLabelled(t, pc, planner.Node.NodeId, "w1-v2b", map[string]string{"version": "v2"})
	reportReady(t, srv.Clients(again.Credential), again.Node.NodeId)
	if _, err := admin.Supervisor.ResumeRollout(ctx, connect.NewRequest(&tetherv1.ResumeRolloutRequest{RolloutId: r.RolloutId})); err != nil {
		t.Fatal(err)
	}
	r = waitRollout(t, srv, r.RolloutId, "to start batch 1", func(r *tetherv1.Rollout) bool { return len(r.Batches) == 2 })
	if n := r.Batches[1].NodeIds[0]; !workers[n] || n == r.Batches[0].NodeIds[0] {
		t.Fatalf("batch 1 drains %v", r.Batches[1].NodeIds)
	}
	launcherConfirmsExit(t, admin, r.Batches[1].NodeIds[0])
	last := spawnLabelled(t, pc, planner.Node.NodeId, "w2-v2", map[string]string{"version": "v2"})
	reportReady(t, srv.Clients(last.Credential), last.Node.NodeId)
	testserver.WaitFor(t, 20*time.Second, "the rollout to complete", func() bool {
		clk.Advance(time.Second)
		return getRollout(t, admin, r.RolloutId).State == tetherv1.RolloutState_ROLLOUT_STATE_COMPLETED
	})
}

// TestRogue48AAHandoverStaysWithinTheBoundPerHolder: a rogue worker a
// rollout drains fills its share before its batch: it offers 4 jobs to
// each of its two children (never acknowledged: open all the same) and
// holds 4 of its own, with the bound per holder at 4. The handover
// reassigned them through the lease module unbounded: all 12 went to the
// one replacement its parent spawned, past the bound an operator's own
// Reassign is held to, the rollout completed counting 12, and the
// replacement's coordinator was then refused any offer to it. Now the
// replacement is handed 4; the batch waits for room for the other 8 and
// pauses at its deadline saying so; two more replacements take them and
// the rollout completes, none of them past the bound.
func TestRogue48AAHandoverStaysWithinTheBoundPerHolder(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) { cfg.LeaseMaxOpenPerHolder = 4 })
	admin := srv.AdminClients()
	planner := registerLabelled(t, admin, "planner", map[string]string{"role": "planner"})
	pc := srv.Clients(planner.Credential)
	rogue := spawnLabelled(t, pc, planner.Node.NodeId, "worker", map[string]string{"version": "v1"})
	rc := srv.Clients(rogue.Credential)
	var jobs []string
	offer := func(c *testserver.Clients, holder string) {
		job := fmt.Sprintf("junk-%02d", len(jobs))
		if _, err := c.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: holder, LeaseDuration: durationpb.New(10 * time.Minute)})); err != nil {
			t.Fatalf("offer %s to %s: %v", job, holder, err)
		}
		jobs = append(jobs, job)
	}
	for range 4 {
		offer(pc, rogue.Node.NodeId)
	}
	for _, name := range []string{"c1", "c2"} {
		child := spawnLabelled(t, rc, rogue.Node.NodeId, name, map[string]string{"kind": "helper"})
		for range 4 {
			offer(rc, child.Node.NodeId)
		}
	}
	r := startRollout(t, admin, &tetherv1.RolloutRequest{Selector: "version=v1", TargetSelector: "version=v2", Batch: 1,
		DrainWindow: durationpb.New(time.Second), ConfirmTimeout: durationpb.New(time.Second), BatchDeadline: durationpb.New(time.Hour)})
	r = waitRollout(t, srv, r.RolloutId, "to start a batch", func(r *tetherv1.Rollout) bool { return len(r.Batches) == 1 })
	testserver.WaitFor(t, 20*time.Second, "the batch's termination to finish", func() bool {
		clk.Advance(2 * time.Second)
		return getTermination(t, admin, r.Batches[0].TerminationId).State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	replacement := func(c *testserver.Clients, name string) string {
		n := spawnLabelled(t, c, planner.Node.NodeId, name, map[string]string{"version": "v2"})
		reportReady(t, srv.Clients(n.Credential), n.Node.NodeId)
		return n.Node.NodeId
	}
	held := func() map[string]int {
		out := map[string]int{}
		for _, job := range jobs {
			out[operatorLease(t, admin, job).HolderIdentity]++
		}
		return out
	}
	first := replacement(pc, "worker-v2")
	r = waitRollout(t, srv, r.RolloutId, "to hand over what the replacement has room for", func(r *tetherv1.Rollout) bool {
		return r.Batches[0].LeasesHandedOver > 0 || r.State != tetherv1.RolloutState_ROLLOUT_STATE_RUNNING
	})
	if got := held()[first]; got != 4 || r.Batches[0].LeasesHandedOver != 4 || r.Batches[0].State == tetherv1.RolloutBatchState_ROLLOUT_BATCH_STATE_DONE {
		t.Fatalf("the replacement holds %d of the rogue's 12 jobs (%d handed over, batch %s, rollout %s %q), want 4 (the bound per holder) and the batch waiting",
			got, r.Batches[0].LeasesHandedOver, r.Batches[0].State, r.State, r.Reason)
	}
	clk.Advance(time.Hour)
	r = waitRollout(t, srv, r.RolloutId, "to pause at the batch's deadline", func(r *tetherv1.Rollout) bool {
		return r.State == tetherv1.RolloutState_ROLLOUT_STATE_PAUSED
	})
	if want := "8 leases wait for room"; !strings.Contains(r.Reason, want) {
		t.Fatalf("pause reason %q, want it to say %q", r.Reason, want)
	}
	// The operator spawns two more (the planner's credential has expired).
	more := []string{replacement(admin, "worker-v2b"), replacement(admin, "worker-v2c")}
	if _, err := admin.Supervisor.ResumeRollout(ctx, connect.NewRequest(&tetherv1.ResumeRolloutRequest{RolloutId: r.RolloutId})); err != nil {
		t.Fatal(err)
	}
	testserver.WaitFor(t, 20*time.Second, "the rollout to complete", func() bool {
		clk.Advance(time.Second)
		r = getRollout(t, admin, r.RolloutId)
		return r.State == tetherv1.RolloutState_ROLLOUT_STATE_COMPLETED
	})
	h := held()
	for _, n := range append([]string{first}, more...) {
		if h[n] != 4 {
			t.Errorf("replacement %s holds %d of the rogue's jobs, want 4", n, h[n])
		}
	}
	if r.Counts.LeasesHandedOver != 12 {
		t.Fatalf("the rollout counts %d leases handed over, want 12", r.Counts.LeasesHandedOver)
	}
}
