package lease_test

import (
	"testing"
	"time"

	"github.com/tetherhq/tether/supervisor/lease"
)

// TestRogue45CRenewBehindTheAcceptedIsStaleAfterTheEnd: seed §6 and §11
// judge a renew by its generation and sequence, and a renew behind the
// accepted sequence is stale traffic with an explicit outcome; §15 says
// arrival order is not authority. A holder renewed with seq 2 and 3 (both
// accepted); the renew seq 2 was delivered again — a retransmission, or a
// stream that reordered it — after the holder's SUCCESS, or after the
// lease ran out. Delivered before the end it reads REJECTED STALE_RENEW
// ("behind the accepted renew sequence"). Before this pass, delivered
// after the end it read REJECTED LEASE_EXPIRED ("an expired generation is
// never revived") or INVALID_TRANSITION ("the job is terminal"): the
// evidence matrix said the holder asked to extend its authority after the
// end, where the message is an old one the record had already passed.
// Now it is STALE_RENEW in every state, the lease unchanged; a renew
// ahead of the accepted one is still refused as an ask after the end.
func TestRogue45CRenewBehindTheAcceptedIsStaleAfterTheEnd(t *testing.T) {
	p, at, step := leaseSteps(t)
	c := lease.Claim{JobID: "j1", LeaseID: "L1", Generation: 1, HolderIdentity: "w1"}
	behind := lease.Renew{Claim: c, RenewSequence: 2}
	l := step(lease.Lease{}, lease.Offer{JobID: "j1", LeaseID: "L1", HolderIdentity: "w1", LeaseDuration: time.Minute}, at(0), lease.OutcomeAccepted)
	l = step(l, lease.Ack{Claim: c}, at(time.Second), lease.OutcomeAccepted)
	l = step(l, behind, at(2*time.Second), lease.OutcomeAccepted)
	l = step(l, lease.Renew{Claim: c, RenewSequence: 3}, at(3*time.Second), lease.OutcomeAccepted)

	// In order: before the end the old renew is stale.
	if _, d, _ := lease.Step(l, behind, at(4*time.Second), p); d.Outcome != lease.OutcomeRejected || d.Event != lease.EventStaleRenew {
		t.Fatalf("before the end the renew behind the accepted one is %s, want REJECTED STALE_RENEW", d)
	}

	done := step(l, lease.Complete{Claim: c, Result: lease.ResultSuccess, Detail: "wrote 100 rows"}, at(4*time.Second), lease.OutcomeAccepted)
	ends := []struct {
		what string
		l    lease.Lease
		now  time.Time
	}{
		{"after the holder's SUCCESS", done, at(5 * time.Second)},
		{"after the expiry", l, at(2 * time.Minute)},
	}
	stale := 0
	for _, e := range ends {
		want, _, _ := lease.Step(e.l, lease.Tick{JobID: "j1"}, e.now, p)
		if want.State == lease.StateActive {
			want = e.l
		}
		after, d, _ := lease.Step(e.l, behind, e.now, p)
		switch {
		case d.Outcome != lease.OutcomeRejected || d.Event != lease.EventStaleRenew:
			t.Errorf("%s: renew seq 2, behind the accepted seq 3, is %s, want REJECTED STALE_RENEW", e.what, d)
		case after != want:
			t.Errorf("%s: the stale renew changed the lease: %+v, want %+v", e.what, after, want)
		default:
			stale++
		}
	}
	t.Logf("renewals behind the accepted one judged STALE_RENEW after the end: %d of %d", stale, len(ends))

	// A renew ahead of the accepted one is the holder asking after the
	// end: refused as before.
	for _, e := range ends {
		after, d, _ := lease.Step(e.l, lease.Renew{Claim: c, RenewSequence: 4}, e.now, p)
		if d.Outcome != lease.OutcomeRejected || d.Event == lease.EventStaleRenew || after.RenewSequence != 3 || after.State == lease.StateActive {
			t.Errorf("%s: renew seq 4 is %s (renew seq %d, %s), want refused as after the end", e.what, d, after.RenewSequence, after.State)
		}
	}
}
