package controlplane_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue43RAbortAfterACutShortPassKeepsItsCount: as
// TestRogue43CAKillBetweenAReassignmentAndItsCountLosesNoCount, a drained
// worker holds two jobs and the rollout's handover pass reassigns the
// first to the replacement; while the pass is held before the second, an
// operator aborts the rollout, and the server is killed (its data
// directory copied as it stands) before the pass saved its count.
// Restarted on that directory, the rollout released the batch without
// reading back the reassignment the pass had written down: job-a was the
// replacement's at generation 2, and the aborted rollout's batch said no
// lease was handed over. The release now settles the written-down
// reassignments from their leases first.
func TestRogue43RAbortAfterACutShortPassKeepsItsCount(t *testing.T) {
	f := newHandoverFixture(t, "job-a", "job-b")
	srv, clk, admin, planner, pc := f.srv, f.clk, f.admin, f.planner, f.pc

	r := rolloutFirstBatchDrained(t, srv, clk)
	repl := spawnLabelled(t, pc, planner.Node.NodeId, "worker-v2", map[string]string{"version": "v2"})
	c2, a2 := f.crashAtSecondReassignment(t, repl.Node.NodeId, "abort", func() error {
		_, err := admin.Supervisor.AbortRollout(context.Background(), connect.NewRequest(&tetherv1.AbortRolloutRequest{RolloutId: r.RolloutId, Reason: "v2 is worse"}))
		return err
	})
	testserver.WaitFor(t, 20*time.Second, "the aborted rollout to release its batch after the restart", func() bool {
		c2.Advance(2 * time.Second)
		r = getRollout(t, a2, r.RolloutId)
		return r.Batches[0].State == tetherv1.RolloutBatchState_ROLLOUT_BATCH_STATE_RELEASED
	})
	if got := operatorLease(t, a2, "job-a"); got.HolderIdentity != repl.Node.NodeId || got.LeaseGeneration != 2 {
		t.Fatalf("job-a: generation %d held by %s, want generation 2 held by the replacement %s", got.LeaseGeneration, got.HolderIdentity, repl.Node.NodeId)
	}
	if got := operatorLease(t, a2, "job-b"); got.LeaseGeneration != 1 || got.HolderIdentity == repl.Node.NodeId {
		t.Fatalf("job-b: generation %d held by %s, want generation 1, not reassigned (the rollout was aborted before it)", got.LeaseGeneration, got.HolderIdentity)
	}
	if r.State != tetherv1.RolloutState_ROLLOUT_STATE_ABORTED || r.Batches[0].LeasesHandedOver != 1 || r.Counts.LeasesHandedOver != 1 {
		t.Fatalf("rollout %s (%q): batch 0 says %d leases handed over (counts %d), want aborted with 1 (job-a went to the replacement)", r.State, r.Reason, r.Batches[0].LeasesHandedOver, r.Counts.LeasesHandedOver)
	}
}
