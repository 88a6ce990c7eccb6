package lease_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/tetherhq/tether/supervisor/lease"
)

// FuzzStep decodes arbitrary bytes into a policy and a message sequence and
// steps through it. Step must never panic, must be deterministic, and must
// keep every invariant of checkStep, whatever the input — including clocks
// that jump backwards, malformed messages and nonsense identities.
func FuzzStep(f *testing.F) {
	// Input layout: one policy byte (bit 0: ack miss reassigns, bit 1:
	// strict restarts), then 4 bytes per message: kind, clock step in
	// quarter seconds (signed), identity selector, sequence/result selector.
	f.Add([]byte{0})
	// ack, renew, progress, then a tick long after expiry.
	f.Add([]byte{0, 0, 4, 0, 0, 1, 4, 0, 3, 2, 4, 0, 3, 10, 127, 0, 0})
	// ack, a renew from another holder (conflict), a reassign resolving it.
	f.Add([]byte{1, 0, 4, 0, 0, 1, 4, 4, 3, 6, 4, 0, 1})
	// the clock jumps backwards between messages.
	f.Add([]byte{0, 0, 4, 0, 0, 1, 0x80, 0, 3, 2, 127, 0, 3, 1, 0x90, 0, 4})
	f.Fuzz(fuzzStep)
}

func fuzzStep(t *testing.T, data []byte) {
	if len(data) == 0 {
		return
	}
	p := lease.DefaultPolicy()
	p.DefaultAckTimeout = 5 * time.Second
	p.MaxUnresolvedBound = time.Minute
	if data[0]&1 != 0 {
		p.AckMiss = lease.AckMissReassign
	}
	if data[0]&2 != 0 {
		p.Restart = lease.RestartStrict
	}
	data = data[1:]

	now := epoch
	l, _, _ := lease.Step(lease.Lease{}, lease.Offer{JobID: "j1", LeaseID: "L1", HolderIdentity: "w1", LeaseDuration: 10 * time.Second}, now, p)
	fresh := 1
	// Long inputs add nothing a longer run of short ones would not find,
	// and make each execution (and minimisation) slow.
	const maxMessages = 64
	for n := 0; len(data) >= 4 && n < maxMessages; n++ {
		op, a, b, c := data[0], data[1], data[2], data[3]
		data = data[4:]
		now = now.Add(time.Duration(int8(a)) * 250 * time.Millisecond)
		m := decodeMessage(op, b, c, l, &fresh)
		post, d, events := lease.Step(l, m, now, p)
		if err := checkStep(l, m, now, post, d, events); err != nil {
			t.Fatalf("%#v at +%s: %v\n\t%s", m, now.Sub(epoch), err, d)
		}
		again, d2, events2 := lease.Step(l, m, now, p)
		if again != post || d2 != d || fmt.Sprint(events2) != fmt.Sprint(events) {
			t.Fatalf("%#v: Step is not deterministic", m)
		}
		if row := lease.NewEvidenceRow(post, m, d, now).Record(); len(row) != len(lease.EvidenceHeader()) {
			t.Fatalf("evidence row has %d columns", len(row))
		}
		l = post
	}
}

// decodeMessage turns three bytes into a message about job j1 (or, rarely,
// another job), aimed near the current lease so the interesting edges are
// reachable.
func decodeMessage(op, b, c byte, l lease.Lease, fresh *int) lease.Message {
	gen := l.Generation
	switch b & 3 {
	case 1:
		gen--
	case 2:
		gen++
	case 3:
		gen = 0
	}
	holder := []string{l.HolderIdentity, "w2", "w3", ""}[(b>>2)&3]
	leaseID := []string{l.LeaseID, fmt.Sprintf("L%d", max(1, l.Generation-1)), "Lx", ""}[(b>>4)&3]
	job := "j1"
	if b>>6 == 3 {
		job = "j2"
	}
	claim := lease.Claim{JobID: job, LeaseID: leaseID, Generation: gen, HolderIdentity: holder}
	if c&0x80 != 0 {
		claim.SentAt = epoch.Add(time.Duration(c) * time.Second)
	}
	seq := func(last uint64) uint64 { return uint64(max(0, int64(last)+int64(c%5)-2)) }
	results := []lease.TerminalResult{lease.ResultUnspecified, lease.ResultSuccess, lease.ResultFailed, lease.ResultCancelled, lease.ResultUnresolved}
	result := results[int(c)%len(results)]
	newLease := func() string {
		if c&0x40 != 0 {
			return l.LeaseID
		}
		*fresh++
		return fmt.Sprintf("L%d", *fresh)
	}
	duration := time.Duration(c%16) * 2 * time.Second // 0 is invalid
	switch op % 12 {
	case 0:
		return lease.Ack{Claim: claim}
	case 1:
		return lease.Renew{Claim: claim, RenewSequence: seq(l.RenewSequence)}
	case 2:
		return lease.Progress{Claim: claim, ProgressSequence: seq(l.ProgressSequence), ProgressValue: string([]byte{'v', c & 3})}
	case 3:
		return lease.CancelAck{Claim: claim}
	case 4:
		return lease.Complete{Claim: claim, Result: result, Detail: "d"}
	case 5:
		return lease.RequestCancel{JobID: job, Reason: "r"}
	case 6:
		return lease.Reassign{JobID: job, LeaseID: newLease(), HolderIdentity: holder, LeaseDuration: duration,
			ResolveConflict: c&1 != 0, Automatic: c&2 != 0, Reason: "r"}
	case 7:
		return lease.Resolve{JobID: job, Result: result, UnresolvedBound: time.Duration(c%70) * time.Second}
	case 8:
		lastAlive := epoch.Add(time.Duration(c) * time.Second)
		return lease.Recover{JobID: job, LastAlive: lastAlive, ExtendTo: lastAlive.Add(time.Duration(b) * time.Second)}
	case 9:
		return lease.Offer{JobID: job, LeaseID: newLease(), HolderIdentity: holder, LeaseDuration: duration}
	default:
		return lease.Tick{JobID: job}
	}
}
