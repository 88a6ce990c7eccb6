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
)

// TestRogue39MBaselineAgentsStoppedByTheirParentDoNotStallTheRollout: a
// v2 pool an operator registered spawned two v2 workers, ready before the
// rollout started (its baseline). Once the rollout runs, the pool — rogue
// — stops them. Batch 0 drains the v1 worker and its replacement comes up
// ready, but the rollout counted "ready now minus the baseline": 1 − 2, no
// replacement. It paused at the batch's deadline, and after every resume,
// for ever. Now the batch is replaced and the rollout completes.
func TestRogue39MBaselineAgentsStoppedByTheirParentDoNotStallTheRollout(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx := context.Background()
	pool := registerLabelled(t, admin, "pool-v2", map[string]string{"version": "v2"})
	poolClients := srv.Clients(pool.Credential)
	var workers []string
	for _, name := range []string{"w2a", "w2b"} {
		c, err := poolClients.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: pool.Node.NodeId, Name: name, Labels: map[string]string{"version": "v2"}}))
		if err != nil {
			t.Fatal(err)
		}
		reportReady(t, srv.Clients(c.Msg.Credential), c.Msg.Node.NodeId)
		workers = append(workers, c.Msg.Node.NodeId)
	}
	registerLabelled(t, admin, "worker-v1", map[string]string{"version": "v1"})
	clk.Advance(time.Second)
	r := startRollout(t, admin, &tetherv1.RolloutRequest{Selector: "version=v1", TargetSelector: "version=v2", Batch: 1,
		DrainWindow: durationpb.New(time.Second), ConfirmTimeout: durationpb.New(time.Second), BatchDeadline: durationpb.New(time.Minute)})
	r = waitRollout(t, srv, r.RolloutId, "to start a batch", func(r *tetherv1.Rollout) bool { return len(r.Batches) == 1 })
	// The rogue pool stops the workers it had ready before the rollout.
	for _, w := range workers {
		terminate(t, poolClients, w, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Second, time.Second)
	}
	launcherConfirmsExit(t, admin, r.Batches[0].NodeIds[0])
	waitRollout(t, srv, r.RolloutId, "to terminate batch 0", func(r *tetherv1.Rollout) bool { return r.Batches[0].TerminatedAt != nil })
	clk.Advance(time.Second)
	v2 := registerLabelled(t, admin, "worker-v2", map[string]string{"version": "v2"})
	reportReady(t, admin, v2.Node.NodeId)
	clk.Advance(time.Minute) // past batch 0's deadline
	r = waitRollout(t, srv, r.RolloutId, "to replace batch 0 or pause", func(r *tetherv1.Rollout) bool {
		return r.Batches[0].ReplacedAt != nil || r.State == tetherv1.RolloutState_ROLLOUT_STATE_PAUSED
	})
	if r.Batches[0].ReplacedAt == nil {
		t.Fatalf("batch 0 not replaced though its replacement %s is ready: rollout %s (%s)", v2.Node.NodeId, r.State, r.Reason)
	}
	r = waitRollout(t, srv, r.RolloutId, "to complete", func(r *tetherv1.Rollout) bool { return r.State == tetherv1.RolloutState_ROLLOUT_STATE_COMPLETED })
	if got := r.Counts.GetReplacementsReady(); got != 1 {
		t.Fatalf("the rollout counts %d replacements ready, want 1 (%s)", got, v2.Node.NodeId)
	}
}
