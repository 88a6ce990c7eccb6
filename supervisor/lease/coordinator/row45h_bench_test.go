package coordinator

import (
	"bytes"
	"testing"
	"time"

	"github.com/tetherhq/tether/supervisor/lease"
)

// BenchmarkEncodeRenewRow is the evidence row of an accepted renewal, as
// the shard encodes it for every renew it judges: the lease's delta and
// the reason compacted against the lease before.
func BenchmarkEncodeRenewRow(b *testing.B) {
	p := lease.DefaultPolicy()
	at := time.Date(2026, 12, 7, 14, 26, 44, 123456789, time.UTC)
	claim := lease.Claim{JobID: "job-000017", LeaseID: "lease-7f3a9c01d2e4b6a8", Generation: 1, HolderIdentity: "n-0192af3c7d5e4b21"}
	l, _, _ := lease.Step(lease.Lease{}, lease.Offer{JobID: claim.JobID, LeaseID: claim.LeaseID, HolderIdentity: claim.HolderIdentity, LeaseDuration: 30 * time.Second}, at, p)
	at = at.Add(3 * time.Millisecond)
	l, _, _ = lease.Step(l, lease.Ack{Claim: claim}, at, p)
	at = at.Add(1234567 * time.Nanosecond)
	next, d, _ := lease.Step(l, lease.Renew{Claim: claim, RenewSequence: 1}, at, p)
	if d.Outcome != lease.OutcomeAccepted {
		b.Fatalf("renew: %+v", d)
	}
	r := storedRow{Number: 3, Lease: next, Decision: d, Kind: lease.KindRenew, DecidedAt: at}
	enc := encodeRow(nil, l, r)
	if got, err := decodeRow(l, enc); err != nil || got.Decision.Reason != d.Reason {
		b.Fatalf("decoded %q, %v; want %q", got.Decision.Reason, err, d.Reason)
	}
	b.ReportAllocs()
	var buf []byte
	for b.Loop() {
		// As the shard does: into its buffer, then out at its size.
		buf = encodeRow(buf[:0], l, r)
		enc = bytes.Clone(buf)
	}
	b.ReportMetric(float64(len(enc)), "bytes/row")
}
