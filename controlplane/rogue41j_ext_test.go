package controlplane_test

import (
	"context"
	"testing"

	"connectrpc.com/connect"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue41JAMovedLeaseDoesNotEraseTheBatchsHandoverCount: a rogue
// planner offered its v1 worker two jobs, "job-a" and "job-z" (it chooses
// the ids, so which comes last in the rollout's pass). The worker's batch
// drains it, the planner's v2 replacement is ready, and the rollout hands
// the worker's jobs over in one pass, in job order. Between the rollout's
// reassignment of job-a and of job-z the planner moves job-z itself (its
// own Reassign to another child of its, as the job's coordinator may; the reconciler's test hook
// pins the interleaving). The pass failed on job-z and recorded nothing:
// job-a had gone to the replacement (generation 2), but the batch — and the
// completed rollout — said 0 leases handed over, and the next pass, finding
// no open lease, marked the batch handed over with that 0. The leases a
// pass hands over are counted even when a later one fails now.
func TestRogue41JAMovedLeaseDoesNotEraseTheBatchsHandoverCount(t *testing.T) {
	f := newHandoverFixture(t, "job-a", "job-z")
	srv, clk, hook, admin, planner, pc := f.srv, f.clk, f.hook, f.admin, f.planner, f.pc
	ctx := context.Background()
	helper := spawnLabelled(t, pc, planner.Node.NodeId, "helper", map[string]string{"role": "helper"})
	var moveErr error
	hook.arm(2, func() { // before job-z, after job-a went over
		_, moveErr = pc.Lease.Reassign(ctx, connect.NewRequest(&tetherv1.ReassignRequest{JobId: "job-z", HolderIdentity: helper.Node.NodeId, Reason: "mine now"}))
	})

	r := rolloutFirstBatchDrained(t, srv, clk)
	next := spawnLabelled(t, pc, planner.Node.NodeId, "worker-v2", map[string]string{"version": "v2"})
	reportReady(t, admin, next.Node.NodeId)
	r = f.finished(t, r) // the reconciler's retry after a failed pass is on the clock
	n := hook.reached()
	if n < 2 || moveErr != nil {
		t.Fatalf("the planner's move of job-z before the rollout's reassignment of it: %d reassignments seen, %v", n, moveErr)
	}
	if got := operatorLease(t, admin, "job-a"); got.LeaseGeneration != 2 || got.HolderIdentity != next.Node.NodeId {
		t.Fatalf("job-a: generation %d held by %s, want 2 held by the replacement %s", got.LeaseGeneration, got.HolderIdentity, next.Node.NodeId)
	}
	if got := operatorLease(t, admin, "job-z"); got.HolderIdentity != helper.Node.NodeId {
		t.Fatalf("job-z held by %s, want the helper the planner moved it to", got.HolderIdentity)
	}
	if r.State != tetherv1.RolloutState_ROLLOUT_STATE_COMPLETED || r.Batches[0].LeasesHandedOver != 1 || r.Counts.LeasesHandedOver != 1 {
		t.Fatalf("rollout %s (%q): batch 0 says %d leases handed over, the rollout %d; want 1 (job-a went to the replacement)",
			r.State, r.Reason, r.Batches[0].LeasesHandedOver, r.Counts.LeasesHandedOver)
	}
}
