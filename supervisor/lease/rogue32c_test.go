package lease_test

import (
	"testing"
	"time"

	"github.com/tetherhq/tether/supervisor/lease"
)

// TestRogue32CAnAckAfterTheCoordinatorsFailedIsRefused: a holder asked to
// cancel ignores the request; its coordinator gives up on it and resolves
// the job FAILED directly (no UNRESOLVED first). The holder's
// acknowledgement after that was accepted while its expiry was ahead, as if
// the holder's own FAILED had overtaken an acknowledgement it sent first:
// the rogue had the record read cancel_ack=true beside a FAILED the
// coordinator decided because it never acknowledged. Only the holder's own
// FAILED leaves its acknowledgement to record (a reordering stream); after
// the coordinator's, the acknowledgement is refused and changes nothing.
func TestRogue32CAnAckAfterTheCoordinatorsFailedIsRefused(t *testing.T) {
	p, at, step := leaseSteps(t)
	c := lease.Claim{JobID: "j1", LeaseID: "L1", Generation: 1, HolderIdentity: "w1"}
	l := step(lease.Lease{}, lease.Offer{JobID: "j1", LeaseID: "L1", HolderIdentity: "w1", LeaseDuration: 10 * time.Minute}, at(0), lease.OutcomeAccepted)
	l = step(l, lease.Ack{Claim: c}, at(time.Second), lease.OutcomeAccepted)
	l = step(l, lease.RequestCancel{JobID: "j1", Reason: "stop"}, at(2*time.Second), lease.OutcomeAccepted)

	// The coordinator's FAILED, naming the generation or not.
	for _, r := range []lease.Resolve{
		{JobID: "j1", Result: lease.ResultFailed, Reason: "the holder ignored the cancel"},
		{JobID: "j1", Result: lease.ResultFailed, Reason: "the holder ignored the cancel", Generation: 1},
	} {
		failed := step(l, r, at(3*time.Second), lease.OutcomeAccepted)
		if !at(4 * time.Second).Before(failed.ExpiresAt) {
			t.Fatalf("the holder's expiry %s is not ahead", failed.ExpiresAt)
		}
		after, d, _ := lease.Step(failed, lease.CancelAck{Claim: c}, at(4*time.Second), p)
		if d.Outcome != lease.OutcomeRejected || d.Err() == nil || after != failed {
			t.Errorf("resolve gen %d: the holder's acknowledgement after the coordinator's FAILED is %s (cancel_ack=%v), want refused, the lease unchanged",
				r.Generation, d, after.CancelAck)
		}
		// Its repeat, and one at the last instant of its lease, too.
		if _, d, _ := lease.Step(after, lease.CancelAck{Claim: c}, failed.ExpiresAt.Add(-time.Nanosecond), p); d.Outcome != lease.OutcomeRejected {
			t.Errorf("resolve gen %d: the acknowledgement at the end of the lease is %s, want refused", r.Generation, d)
		}
	}

	// The holder's own FAILED still leaves the acknowledgement it sent
	// first to record (TestRogue29DAFailedResultLeavesTheCancelAckToRecordInAnyOrder).
	own := step(l, lease.Complete{Claim: c, Result: lease.ResultFailed, Detail: "disk full"}, at(3*time.Second), lease.OutcomeAccepted)
	if after := step(own, lease.CancelAck{Claim: c}, at(4*time.Second), lease.OutcomeAccepted); !after.CancelAck {
		t.Errorf("after the holder's own FAILED, its acknowledgement is accepted but not recorded")
	}
}
