package lease_test

import (
	"testing"
	"time"

	"github.com/tetherhq/tether/supervisor/lease"
)

// TestRogue42MRetransmittedProgressIsNoLateProgressAfterTheEnd: seed §11
// and §15 — a repeat of the accepted progress sequence is a duplicate,
// ignored without mutation, and each message is judged from its own
// generation and sequence, not its arrival order. A holder asked to cancel
// sent progress seq 5, then its CANCELLED; a reordering (or retransmitting)
// stream delivered the progress again after the result (or after the
// expiry). Before, that repeat was judged "late progress" and set the
// lease's Late Progress flag: the evidence matrix read that the worker
// reported work after its cancellation ended the job, which it never did,
// where the same messages in order (the repeat before the result) read
// DUPLICATE and left the flag unset. A repeat of the accepted sequence and
// value is now DUPLICATE in every state; new progress after the end is
// still late evidence.
func TestRogue42MRetransmittedProgressIsNoLateProgressAfterTheEnd(t *testing.T) {
	p, at, step := leaseSteps(t)
	c := lease.Claim{JobID: "j1", LeaseID: "L1", Generation: 1, HolderIdentity: "w1"}
	prog := lease.Progress{Claim: c, ProgressSequence: 5, ProgressValue: "50%"}
	l := step(lease.Lease{}, lease.Offer{JobID: "j1", LeaseID: "L1", HolderIdentity: "w1", LeaseDuration: time.Minute}, at(0), lease.OutcomeAccepted)
	l = step(l, lease.Ack{Claim: c}, at(time.Second), lease.OutcomeAccepted)
	l = step(l, prog, at(2*time.Second), lease.OutcomeAccepted)
	l = step(l, lease.RequestCancel{JobID: "j1", Reason: "stop"}, at(3*time.Second), lease.OutcomeAccepted)

	// In order: the repeat before the result is a duplicate.
	inOrder := step(l, prog, at(4*time.Second), lease.OutcomeDuplicate)
	inOrder = step(inOrder, lease.Complete{Claim: c, Result: lease.ResultCancelled, Detail: "stopped"}, at(5*time.Second), lease.OutcomeAccepted)

	ends := []struct {
		what string
		l    lease.Lease
		now  time.Time
	}{
		{"after the holder's CANCELLED", step(l, lease.Complete{Claim: c, Result: lease.ResultCancelled, Detail: "stopped"}, at(4*time.Second), lease.OutcomeAccepted), at(5 * time.Second)},
		{"after the expiry", l, at(2 * time.Minute)},
	}
	dup := 0
	for _, e := range ends {
		after, d, _ := lease.Step(e.l, prog, e.now, p)
		if d.Outcome == lease.OutcomeDuplicate && !after.LateProgress {
			dup++
		} else {
			t.Errorf("%s: the repeat of accepted progress seq 5 is %s (late_progress=%v), want DUPLICATE, no late progress", e.what, d, after.LateProgress)
		}
	}
	if inOrder.LateProgress {
		t.Errorf("in order, late_progress=true")
	}
	t.Logf("repeats judged DUPLICATE after the end: %d of %d", dup, len(ends))

	// New progress after the end is still late evidence.
	ended := ends[0].l
	after, d, _ := lease.Step(ended, lease.Progress{Claim: c, ProgressSequence: 6, ProgressValue: "60%"}, at(6*time.Second), p)
	if d.Outcome != lease.OutcomeRejected || !after.LateProgress {
		t.Errorf("new progress after the end is %s (late_progress=%v), want late evidence", d, after.LateProgress)
	}
	// And seq 5 with another value is a conflicting duplicate, not applied.
	after, d, _ = lease.Step(ended, lease.Progress{Claim: c, ProgressSequence: 5, ProgressValue: "99%"}, at(6*time.Second), p)
	if d.Outcome != lease.OutcomeRejected || after.ProgressValue != "50%" {
		t.Errorf("seq 5 with another value after the end is %s (value %q), want refused", d, after.ProgressValue)
	}
}
