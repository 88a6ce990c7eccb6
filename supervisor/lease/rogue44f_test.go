package lease_test

import (
	"testing"
	"time"

	"github.com/tetherhq/tether/supervisor/lease"
)

// TestRogue44FRetransmittedRenewIsADuplicateAfterTheEnd: seed §11 names a
// duplicate renew among the messages that get an explicit outcome, and a
// repeat of the accepted sequence is ignored without mutation; §15 says
// arrival order is not authority. A holder renewed with seq 3 (accepted)
// and then reported SUCCESS, or let its lease run out; the renew seq 3
// was delivered again after that end — a retransmission, a stream that
// reordered the copy past the result. Before, the repeat was judged
// REJECTED (LEASE_EXPIRED after the expiry, INVALID_TRANSITION "terminal"
// after the result): the evidence matrix read that the holder asked to
// extend authority after its job ended, where the same copy delivered
// before the end reads DUPLICATE DUPLICATE_RENEW. Now the repeat is
// DUPLICATE in every state, nothing changed; a renew the record has not
// accepted is still refused after the end.
func TestRogue44FRetransmittedRenewIsADuplicateAfterTheEnd(t *testing.T) {
	p, at, step := leaseSteps(t)
	c := lease.Claim{JobID: "j1", LeaseID: "L1", Generation: 1, HolderIdentity: "w1"}
	rn := lease.Renew{Claim: c, RenewSequence: 3}
	l := step(lease.Lease{}, lease.Offer{JobID: "j1", LeaseID: "L1", HolderIdentity: "w1", LeaseDuration: time.Minute}, at(0), lease.OutcomeAccepted)
	l = step(l, lease.Ack{Claim: c}, at(time.Second), lease.OutcomeAccepted)
	l = step(l, rn, at(2*time.Second), lease.OutcomeAccepted)

	// In order: the repeat before the end is a duplicate.
	step(l, rn, at(3*time.Second), lease.OutcomeDuplicate)

	done := step(l, lease.Complete{Claim: c, Result: lease.ResultSuccess, Detail: "wrote 100 rows"}, at(3*time.Second), lease.OutcomeAccepted)
	ends := []struct {
		what string
		l    lease.Lease
		now  time.Time
	}{
		{"after the holder's SUCCESS", done, at(4 * time.Second)},
		{"after the expiry", l, at(2 * time.Minute)},
	}
	dup := 0
	for _, e := range ends {
		want, _, _ := lease.Step(e.l, lease.Tick{JobID: "j1"}, e.now, p)
		if want.State == lease.StateActive {
			want = e.l
		}
		after, d, _ := lease.Step(e.l, rn, e.now, p)
		switch {
		case d.Outcome != lease.OutcomeDuplicate || d.Event != lease.EventDuplicateRenew:
			t.Errorf("%s: the repeat of accepted renew seq 3 is %s, want DUPLICATE DUPLICATE_RENEW", e.what, d)
		case after != want:
			t.Errorf("%s: the repeat changed the lease: %+v, want %+v", e.what, after, want)
		default:
			dup++
		}
	}
	t.Logf("repeats of the accepted renew judged DUPLICATE after the end: %d of %d", dup, len(ends))

	// A renew the record has not accepted is still refused after the end,
	// and so is one behind the accepted sequence.
	for _, seq := range []uint64{4, 2} {
		for _, e := range ends {
			after, d, _ := lease.Step(e.l, lease.Renew{Claim: c, RenewSequence: seq}, e.now, p)
			if d.Outcome != lease.OutcomeRejected || after.RenewSequence != 3 || after.State == lease.StateActive {
				t.Errorf("%s: renew seq %d is %s (renew seq %d, %s), want refused", e.what, seq, d, after.RenewSequence, after.State)
			}
		}
	}
}
