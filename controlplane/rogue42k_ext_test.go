package controlplane_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue42KAReplacementThatExitsMidPassIsHandedNoJob: a planner's v1
// worker holds a job; its batch drains it, and the planner's v2
// replacement reports ready, so the rollout's handover pass gives it the
// worker's job. The replacement is a rogue: it claims its exit as the pass
// runs (after the reconciler observed it ready, before it reassigns the
// job; the reconciler's test hook pins the interleaving — a worker with
// many jobs leaves a pass's whole length for it). The pass reassigned the
// job to the exited agent all the same (generation 2, OFFERED to a holder
// that will never ACK, which the lease service refuses an operator's or a
// coordinator's Reassign to), and the batch and the completed rollout
// counted it as handed over to a replacement. Each reassignment now checks
// that its replacement still stands (running, ready, under no stop): the
// job stays with the drained worker, waits for a replacement that is
// ready, and goes to it.
func TestRogue42KAReplacementThatExitsMidPassIsHandedNoJob(t *testing.T) {
	f := newHandoverFixture(t, "job-a")
	srv, clk, hook, admin, planner, pc := f.srv, f.clk, f.hook, f.admin, f.planner, f.pc
	ctx := context.Background()

	r := rolloutFirstBatchDrained(t, srv, clk)
	rogue := spawnLabelled(t, pc, planner.Node.NodeId, "worker-v2", map[string]string{"version": "v2"})
	rc := srv.Clients(rogue.Credential)
	var exitErr error
	hook.arm(0, func() {
		_, exitErr = rc.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: rogue.Node.NodeId, Reason: "done"}))
	})
	reportReady(t, admin, rogue.Node.NodeId)
	testserver.WaitFor(t, 20*time.Second, "the rollout's first handover pass", func() bool {
		clk.Advance(2 * time.Second)
		return hook.reached() > 0
	})
	if exitErr != nil {
		t.Fatalf("the replacement's exit claim: %v", exitErr)
	}
	honest := spawnLabelled(t, pc, planner.Node.NodeId, "worker-v2b", map[string]string{"version": "v2"})
	reportReady(t, admin, honest.Node.NodeId)
	r = f.finished(t, r)
	if got := operatorLease(t, admin, "job-a"); got.HolderIdentity != honest.Node.NodeId || got.LeaseGeneration != 2 {
		t.Fatalf("job-a: generation %d held by %s (the exited replacement is %s), want generation 2 held by the ready replacement %s",
			got.LeaseGeneration, got.HolderIdentity, rogue.Node.NodeId, honest.Node.NodeId)
	}
	if r.State != tetherv1.RolloutState_ROLLOUT_STATE_COMPLETED || r.Batches[0].LeasesHandedOver != 1 {
		t.Fatalf("rollout %s (%q): batch 0 says %d leases handed over, want completed with 1", r.State, r.Reason, r.Batches[0].LeasesHandedOver)
	}
}
