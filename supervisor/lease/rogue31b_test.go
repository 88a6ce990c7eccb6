package lease_test

import (
	"testing"
	"time"

	"github.com/tetherhq/tether/supervisor/lease"
)

// TestRogue31BAnAckRefusedWhileUnresolvedStaysRefusedOnceFailed: a
// coordinator that cannot tell whether a holder stopped — it was asked to
// cancel, did not acknowledge, and still had authority — resolves the job
// UNRESOLVED, and the holder's acknowledgement is refused while it is.
// When the bound elapses (or the coordinator reconciles FAILED) the job
// is FAILED, and the holder's acknowledgement was accepted then, before
// its expiry: the rogue holder waited the UNRESOLVED out and had the
// record read cancel_ack=true beside a FAILED whose reconciliation said it
// never acknowledged. A FAILED that closed an UNRESOLVED is the
// coordinator's, not the holder's own result overtaking its ACK: an
// acknowledgement after it is refused, and changes nothing.
func TestRogue31BAnAckRefusedWhileUnresolvedStaysRefusedOnceFailed(t *testing.T) {
	p, at, step := leaseSteps(t)
	c := lease.Claim{JobID: "j1", LeaseID: "L1", Generation: 1, HolderIdentity: "w1"}
	l := step(lease.Lease{}, lease.Offer{JobID: "j1", LeaseID: "L1", HolderIdentity: "w1", LeaseDuration: 10 * time.Minute}, at(0), lease.OutcomeAccepted)
	l = step(l, lease.Ack{Claim: c}, at(time.Second), lease.OutcomeAccepted)
	l = step(l, lease.RequestCancel{JobID: "j1", Reason: "stop"}, at(2*time.Second), lease.OutcomeAccepted)
	unresolved := step(l, lease.Resolve{JobID: "j1", Result: lease.ResultUnresolved, Reason: "the holder did not acknowledge", UnresolvedBound: time.Minute}, at(3*time.Second), lease.OutcomeAccepted)
	step(unresolved, lease.CancelAck{Claim: c}, at(4*time.Second), lease.OutcomeRejected)

	for _, end := range []struct {
		what string
		l    lease.Lease
		now  time.Time
	}{
		{"the bound elapsed", unresolved, at(2 * time.Minute)},
		{"the coordinator reconciled FAILED", step(unresolved, lease.Resolve{JobID: "j1", Result: lease.ResultFailed, Reason: "gave up"}, at(5*time.Second), lease.OutcomeAccepted), at(6 * time.Second)},
	} {
		if !end.now.Before(l.ExpiresAt) {
			t.Fatalf("%s: the holder's expiry %s is not ahead at %s", end.what, l.ExpiresAt, end.now)
		}
		after, d, _ := lease.Step(end.l, lease.CancelAck{Claim: c}, end.now, p)
		if d.Outcome != lease.OutcomeRejected || after.CancelAck || after.TerminalResult != lease.ResultFailed {
			t.Errorf("%s: the holder's acknowledgement after it is %s (cancel_ack=%v, %s), want refused, FAILED without an acknowledgement", end.what, d, after.CancelAck, after.TerminalResult)
		}
	}
}

// leaseSteps is a lease transcript's means under the default policy p:
// at is a time d after its start (2026-01-01), and step judges m at now,
// failing the test unless its outcome is want, and returns the lease after.
func leaseSteps(t *testing.T) (p lease.Policy, at func(d time.Duration) time.Time, step func(l lease.Lease, m lease.Message, now time.Time, want lease.Outcome) lease.Lease) {
	p = lease.DefaultPolicy()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at = func(d time.Duration) time.Time { return t0.Add(d) }
	step = func(l lease.Lease, m lease.Message, now time.Time, want lease.Outcome) lease.Lease {
		t.Helper()
		next, d, _ := lease.Step(l, m, now, p)
		if d.Outcome != want {
			t.Fatalf("%s at %s: %s, want %s", m.Kind(), now.Sub(t0), d, want)
		}
		return next
	}
	return p, at, step
}
