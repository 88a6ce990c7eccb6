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

// The review of the twenty-fifth pass on rollouts.

// TestRogue25ReviewAnOperatorSpawnedReplacementStandsInAnywhere: a spawned
// agent's labels are its parent's word, but an agent an operator spawned
// carries the operator's: Spawn asks an operator for the role RegisterRoot
// does. The operator starts the drained worker's v2 replacement under
// another agent of the tree (the team's pool, not the worker's planner);
// it stands in for the worker and takes its job, as a root the operator
// registered would.
func TestRogue25ReviewAnOperatorSpawnedReplacementStandsInAnywhere(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx := context.Background()
	root := registerLabelled(t, admin, "team", map[string]string{"app": "team"})
	rc := srv.Clients(root.Credential)
	planner := spawnLabelled(t, rc, root.Node.NodeId, "planner", map[string]string{"role": "planner"})
	pool := spawnLabelled(t, rc, root.Node.NodeId, "pool", map[string]string{"role": "pool"})
	pc := srv.Clients(planner.Credential)
	w1 := spawnLabelled(t, pc, planner.Node.NodeId, "w1", map[string]string{"version": "v1"})
	offered, err := pc.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "job-a", HolderIdentity: w1.Node.NodeId, LeaseDuration: durationpb.New(10 * time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	unary{srv.Clients(w1.Credential)}.send(t, ack(offered.Msg.Lease))

	r := startRollout(t, admin, &tetherv1.RolloutRequest{Selector: "version=v1", TargetSelector: "version=v2", Batch: 1,
		DrainWindow: durationpb.New(time.Second), ConfirmTimeout: durationpb.New(time.Second), BatchDeadline: durationpb.New(5 * time.Minute)})
	r = waitRollout(t, srv, r.RolloutId, "to start a batch", func(r *tetherv1.Rollout) bool { return len(r.Batches) == 1 })
	w2 := spawnLabelled(t, admin, pool.Node.NodeId, "w2", map[string]string{"version": "v2"})
	reportReady(t, srv.Clients(w2.Credential), w2.Node.NodeId)
	term := r.Batches[0].TerminationId
	testserver.WaitFor(t, 20*time.Second, "the batch's termination to finish", func() bool {
		clk.Advance(2 * time.Second)
		return getTermination(t, admin, term).State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	clk.Advance(5 * time.Minute)
	r = waitRollout(t, srv, r.RolloutId, "to complete (or pause at the batch deadline)", func(r *tetherv1.Rollout) bool {
		return r.State == tetherv1.RolloutState_ROLLOUT_STATE_PAUSED || r.State == tetherv1.RolloutState_ROLLOUT_STATE_COMPLETED
	})
	if r.State != tetherv1.RolloutState_ROLLOUT_STATE_COMPLETED {
		t.Fatalf("rollout %s, reason %q: the replacement an operator spawned under the pool was not counted", r.State, r.Reason)
	}
	if l := operatorLease(t, admin, "job-a"); l.HolderIdentity != w2.Node.NodeId || l.LeaseGeneration != 2 {
		t.Fatalf("job-a is held by %s generation %d, want the operator's replacement %s generation 2", l.HolderIdentity, l.LeaseGeneration, w2.Node.NodeId)
	}
}
