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

// crashAtSecondReassignment holds the handover pass at its second
// reassignment (job-a reassigned, job-b not yet): there it runs step, if
// any, and copies the data directory as a kill -9 leaves it (crashCopy).
// It has the replacement repl report ready, waits (advancing the clock)
// for the pass to reach that point and stops the server; a step's error
// fails the test, reading "what: err". It restarts a server on the copy, on
// a manual clock from where the first stopped, and returns that clock and
// its admin clients.
func (f *handoverFixture) crashAtSecondReassignment(t *testing.T, repl, what string, step func() error) (*clock.Manual, *testserver.Clients) {
	t.Helper()
	var crashed string
	var stepErr error
	f.hook.arm(2, func() {
		if step != nil {
			stepErr = step()
		}
		crashed = crashCopy(t, f.srv.DataDir)
	})
	reportReady(t, f.admin, repl)
	testserver.WaitFor(t, 20*time.Second, "the pass to reach its second reassignment", func() bool {
		f.clk.Advance(2 * time.Second)
		return f.hook.reached() >= 2
	})
	f.srv.Stop()
	if stepErr != nil {
		t.Fatalf("%s: %v", what, stepErr)
	}

	c2 := clock.NewManual(f.clk.Now())
	s2 := testserver.StartIn(t, crashed, testserver.WithClock(c2))
	return c2, s2.AdminClients()
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
	srv, clk, planner, pc := f.srv, f.clk, f.planner, f.pc

	r := rolloutFirstBatchDrained(t, srv, clk)
	repl := spawnLabelled(t, pc, planner.Node.NodeId, "worker-v2", map[string]string{"version": "v2"})
	c2, a2 := f.crashAtSecondReassignment(t, repl.Node.NodeId, "", nil)
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
	srv, clk, admin, planner, pc := f.srv, f.clk, f.admin, f.planner, f.pc

	r := rolloutFirstBatchDrained(t, srv, clk)
	repl := spawnLabelled(t, pc, planner.Node.NodeId, "worker-v2", map[string]string{"version": "v2"})
	other := spawnLabelled(t, pc, planner.Node.NodeId, "worker-v2b", map[string]string{"version": "v2"})
	reportReady(t, admin, other.Node.NodeId)
	c2, a2 := f.crashAtSecondReassignment(t, repl.Node.NodeId, "the planner's reassignment of job-a", func() error {
		_, err := pc.Lease.Reassign(context.Background(), connect.NewRequest(&tetherv1.ReassignRequest{JobId: "job-a", HolderIdentity: other.Node.NodeId, Reason: "the planner's own"}))
		return err
	})
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
