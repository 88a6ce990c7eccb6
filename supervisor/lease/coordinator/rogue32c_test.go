package coordinator_test

import (
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/etcdtest"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/lease"
)

// TestRogue32CAnAckAfterTheCoordinatorsFailedStaysRefusedAfterARestart:
// the lease machine refuses a holder's cancel acknowledgement after the
// coordinator resolved its job FAILED (lease.Lease.ResolvedByCoordinator),
// so the fact must survive the store: a rogue holder that waited for a
// restart (a deploy, a new leader) had its acknowledgement judged against
// a record that no longer said who closed the job, and accepted.
func TestRogue32CAnAckAfterTheCoordinatorsFailedStaysRefusedAfterARestart(t *testing.T) {
	dir := t.TempDir()
	st := openStore(t, dir)
	ackAfterCoordinatorsFailed(t, st, func() store.Store {
		st.Close()
		st = openStore(t, dir)
		t.Cleanup(func() { st.Close() })
		return st
	})
}

// The same on etcd, where the run after the restart takes over the store.
func TestRogue32CEtcdAnAckAfterTheCoordinatorsFailedStaysRefusedAfterARestart(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the etcd variant; make test and CI run them.")
	}
	st := etcdtest.OpenStore(t, etcdtest.Start(t))
	ackAfterCoordinatorsFailed(t, st, func() store.Store { return st })
}

func ackAfterCoordinatorsFailed(t *testing.T, st store.Store, reopen func() store.Store) {
	clk := clock.NewManual(t0)
	h := start(t, st, clk, lease.DefaultPolicy())
	// A job resolved FAILED after the cancel (the rogue's), and one the
	// holder itself failed (an honest holder whose FAILED overtook its
	// acknowledgement), each with many rows so that the restart loads
	// the job from a checkpoint and from the rows after it.
	for _, job := range []string{"rogue", "honest"} {
		h.active(job, "w1", 10*time.Minute)
		for seq := uint64(1); seq <= 70; seq++ {
			h.want(lease.Renew{Claim: claim(job, "L-"+job, 1, "w1"), RenewSequence: seq}, lease.OutcomeAccepted, lease.EventRenewed)
		}
		h.want(lease.RequestCancel{JobID: job, Reason: "stop"}, lease.OutcomeAccepted, lease.EventCancelRequested)
	}
	h.want(lease.Resolve{JobID: "rogue", Result: lease.ResultFailed, Reason: "the holder ignored the cancel"}, lease.OutcomeAccepted, lease.EventResolved)
	h.want(lease.Complete{Claim: claim("honest", "L-honest", 1, "w1"), Result: lease.ResultFailed, Detail: "disk full"}, lease.OutcomeAccepted, lease.EventTerminalAccepted)
	before := h.get("rogue")
	if !before.ResolvedByCoordinator {
		t.Fatalf("the coordinator's FAILED does not say it is the coordinator's: %+v", before)
	}
	h.stop()

	h = start(t, reopen(), clk, lease.DefaultPolicy())
	if after := h.get("rogue"); after != before {
		t.Fatalf("after the restart:\n got %+v\nwant %+v", after, before)
	}
	clk.Advance(time.Second)
	r := h.want(lease.CancelAck{Claim: claim("rogue", "L-rogue", 1, "w1")}, lease.OutcomeRejected, lease.EventInvalidTransition)
	if r.Lease.CancelAck || r.Lease.TerminalResult != lease.ResultFailed {
		t.Errorf("the refused acknowledgement left the lease %s cancel_ack=%v", r.Lease.TerminalResult, r.Lease.CancelAck)
	}
	if got := h.get("rogue"); got.CancelAck {
		t.Errorf("the record reads cancel_ack=true after the coordinator's FAILED")
	}
	// The honest holder's acknowledgement its own FAILED overtook is
	// still recorded.
	h.want(lease.CancelAck{Claim: claim("honest", "L-honest", 1, "w1")}, lease.OutcomeAccepted, lease.EventCancelAcked)
}
