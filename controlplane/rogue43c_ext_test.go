package controlplane_test

import (
	"context"

	"connectrpc.com/connect"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// crashCopy copies the data directory of a server that is still running —
// the bytes its store has written, as a kill -9 leaves them — to a new
// directory, for a server to restart on. Badger's files are preallocated
// and sparse: they are copied as such.
func crashCopy(t *testing.T, dataDir string) string {
	t.Helper()
	to := filepath.Join(t.TempDir(), "crashed")
	if out, err := exec.Command("cp", "-a", "--sparse=always", dataDir, to).CombinedOutput(); err != nil {
		t.Fatalf("copy %s: %v: %s", dataDir, err, out)
	}
	return to
}

// TestRogue43CAKillBetweenAReassignmentAndItsCountLosesNoCount: a drained
// worker holds two jobs; the rollout's handover pass reassigns the first
// to the replacement, and the server is killed (kill -9: its data
// directory as it stands, copied while the pass is held before the second
// reassignment) before the pass saved its count. Restarted on that
// directory, the next pass handed over the second job and counted it; the
// first, no longer the drained worker's, was in no pass's count: the
// completed rollout said one lease was handed over where two were. The
// count of a reassignment in doubt is now read from the lease itself.
func TestRogue43CAKillBetweenAReassignmentAndItsCountLosesNoCount(t *testing.T) {
	f := newHandoverFixture(t, "job-a", "job-b")
	srv, clk, hook, admin, planner, pc := f.srv, f.clk, f.hook, f.admin, f.planner, f.pc

	r := rolloutFirstBatchDrained(t, srv, clk)
	repl := spawnLabelled(t, pc, planner.Node.NodeId, "worker-v2", map[string]string{"version": "v2"})
	var crashed string
	hook.arm(2, func() { crashed = crashCopy(t, srv.DataDir) }) // job-a reassigned, job-b not yet
	reportReady(t, admin, repl.Node.NodeId)
	testserver.WaitFor(t, 20*time.Second, "the pass to reach its second reassignment", func() bool {
		clk.Advance(2 * time.Second)
		return hook.reached() >= 2
	})
	srv.Stop()

	c2 := clock.NewManual(clk.Now())
	s2 := testserver.StartIn(t, crashed, testserver.WithClock(c2))
	a2 := s2.AdminClients()
	testserver.WaitFor(t, 20*time.Second, "the rollout to finish after the restart", func() bool {
		c2.Advance(2 * time.Second)
		r = getRollout(t, a2, r.RolloutId)
		return r.State != tetherv1.RolloutState_ROLLOUT_STATE_RUNNING
	})
	for _, job := range []string{"job-a", "job-b"} {
		if got := operatorLease(t, a2, job); got.HolderIdentity != repl.Node.NodeId || got.LeaseGeneration != 2 {
			t.Fatalf("%s: generation %d held by %s, want generation 2 held by the replacement %s", job, got.LeaseGeneration, got.HolderIdentity, repl.Node.NodeId)
		}
	}
	if r.State != tetherv1.RolloutState_ROLLOUT_STATE_COMPLETED || r.Batches[0].LeasesHandedOver != 2 {
		t.Fatalf("rollout %s (%q): batch 0 says %d leases handed over, want completed with 2 (both jobs went to the replacement)", r.State, r.Reason, r.Batches[0].LeasesHandedOver)
	}
}

// TestRogue43CBKilledPassCountsAJobItsCoordinatorMovedOnSince: as
// TestRogue43CA, but the jobs' coordinator (the planner, an ancestor of the
// drained worker) moves the first job on, generation 2 to 3, after the
// rollout reassigned it and before the kill. The rollout did hand the job
// over; the next pass reads so from the job's evidence (generation 2's
// lease id), not from its current lease.
func TestRogue43CBKilledPassCountsAJobItsCoordinatorMovedOnSince(t *testing.T) {
	f := newHandoverFixture(t, "job-a", "job-b")
	srv, clk, hook, admin, planner, pc := f.srv, f.clk, f.hook, f.admin, f.planner, f.pc

	r := rolloutFirstBatchDrained(t, srv, clk)
	repl := spawnLabelled(t, pc, planner.Node.NodeId, "worker-v2", map[string]string{"version": "v2"})
	other := spawnLabelled(t, pc, planner.Node.NodeId, "worker-v2b", map[string]string{"version": "v2"})
	reportReady(t, admin, other.Node.NodeId)
	var crashed string
	var moveErr error
	hook.arm(2, func() { // job-a reassigned, job-b not yet
		_, moveErr = pc.Lease.Reassign(context.Background(), connect.NewRequest(&tetherv1.ReassignRequest{JobId: "job-a", HolderIdentity: other.Node.NodeId, Reason: "the planner's own"}))
		crashed = crashCopy(t, srv.DataDir)
	})
	reportReady(t, admin, repl.Node.NodeId)
	testserver.WaitFor(t, 20*time.Second, "the pass to reach its second reassignment", func() bool {
		clk.Advance(2 * time.Second)
		return hook.reached() >= 2
	})
	srv.Stop()
	if moveErr != nil {
		t.Fatalf("the planner's reassignment of job-a: %v", moveErr)
	}

	c2 := clock.NewManual(clk.Now())
	s2 := testserver.StartIn(t, crashed, testserver.WithClock(c2))
	a2 := s2.AdminClients()
	testserver.WaitFor(t, 20*time.Second, "the rollout to finish after the restart", func() bool {
		c2.Advance(2 * time.Second)
		r = getRollout(t, a2, r.RolloutId)
		return r.State != tetherv1.RolloutState_ROLLOUT_STATE_RUNNING
	})
	if got := operatorLease(t, a2, "job-a"); got.HolderIdentity != other.Node.NodeId || got.LeaseGeneration != 3 {
		t.Fatalf("job-a: generation %d held by %s, want generation 3 held by %s (the planner's move)", got.LeaseGeneration, got.HolderIdentity, other.Node.NodeId)
	}
	if got := operatorLease(t, a2, "job-b"); got.LeaseGeneration != 2 || (got.HolderIdentity != repl.Node.NodeId && got.HolderIdentity != other.Node.NodeId) {
		t.Fatalf("job-b: generation %d held by %s, want generation 2 held by a replacement", got.LeaseGeneration, got.HolderIdentity)
	}
	if r.State != tetherv1.RolloutState_ROLLOUT_STATE_COMPLETED || r.Batches[0].LeasesHandedOver != 2 {
		t.Fatalf("rollout %s (%q): batch 0 says %d leases handed over, want completed with 2 (the rollout reassigned both)", r.State, r.Reason, r.Batches[0].LeasesHandedOver)
	}
}
