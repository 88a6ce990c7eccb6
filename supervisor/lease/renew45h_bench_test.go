package lease_test

import (
	"testing"
	"time"

	"github.com/tetherhq/tether/supervisor/lease"
)

// activeForRenew is an ACTIVE lease as a renewing holder finds it, and the
// time of its next renewal.
func activeForRenew(tb testing.TB) (lease.Lease, lease.Policy, time.Time) {
	tb.Helper()
	p := lease.DefaultPolicy()
	at := time.Date(2026, 12, 7, 14, 26, 44, 123456789, time.UTC)
	claim := lease.Claim{JobID: "job-000017", LeaseID: "lease-7f3a9c01d2e4b6a8", Generation: 1, HolderIdentity: "n-0192af3c7d5e4b21"}
	l, d, _ := lease.Step(lease.Lease{}, lease.Offer{JobID: claim.JobID, LeaseID: claim.LeaseID, HolderIdentity: claim.HolderIdentity, LeaseDuration: 30 * time.Second}, at, p)
	if d.Outcome != lease.OutcomeAccepted {
		tb.Fatalf("offer: %+v", d)
	}
	at = at.Add(3 * time.Millisecond)
	if l, d, _ = lease.Step(l, lease.Ack{Claim: claim}, at, p); d.Outcome != lease.OutcomeAccepted {
		tb.Fatalf("ack: %+v", d)
	}
	return l, p, at.Add(1234567 * time.Nanosecond)
}

// BenchmarkStepRenewAccepted is the lease machine's share of a renewal:
// Step judging an accepted renew of an ACTIVE lease, its reason included.
func BenchmarkStepRenewAccepted(b *testing.B) {
	l, p, at := activeForRenew(b)
	claim := lease.Claim{JobID: l.JobID, LeaseID: l.LeaseID, Generation: l.Generation, HolderIdentity: l.HolderIdentity}
	b.ReportAllocs()
	seq := uint64(0)
	for b.Loop() {
		seq++
		at = at.Add(987654 * time.Nanosecond)
		next, d, _ := lease.Step(l, lease.Renew{Claim: claim, RenewSequence: seq}, at, p)
		if d.Outcome != lease.OutcomeAccepted {
			b.Fatalf("renew: %+v", d)
		}
		l = next
	}
}
