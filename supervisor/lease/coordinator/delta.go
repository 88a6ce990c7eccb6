package coordinator

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tetherhq/tether/supervisor/lease"
)

// Evidence rows are written as deltas (schema 2). Every decision writes a
// row, so the row's size is what a renewal costs on disk, and Badger's
// synced commits cost by the byte (its write-ahead log is a memory-mapped
// file synced with msync: on the machine of docs/leases.md a 400-byte row
// took about twice the commit time of a 150-byte one). A schema-1 row
// carried the whole lease and a reason of about 190 bytes; a schema-2 row
// carries:
//
//   - the lease fields that differ from the previous row's lease (a bit
//     mask, then those fields), with times relative to the decision time;
//   - the reason with the strings it quotes from the two leases (ids,
//     timestamps) replaced by one-byte references.
//
// So a row decodes only against the lease before it: the previous row's,
// or the job record's for the first row after a checkpoint, or the empty
// lease for row 1 and for rows of the unknown-job log. Readers go in row
// order anyway (Evidence from row 1, a load from the checkpoint), and a
// gap in the numbering is reported as corruption rather than decoded
// against the wrong lease. Schema-1 rows still decode (they need nothing
// before them).

// leaseField is one field of lease.Lease in the stored encoding. base is
// the Unix-nanosecond origin of times (0 for absolute times).
type leaseField struct {
	enc func(e *encoder, l *lease.Lease, base int64)
	dec func(d *decoder, l *lease.Lease, base int64)
}

// leaseFields lists the fields in encoding order. Append only: a field's
// position is its bit in a delta row's mask, and schema 1 (records, old
// rows) is the whole list in order with absolute times.
var leaseFields = []leaseField{
	{func(e *encoder, l *lease.Lease, _ int64) { e.str(l.JobID) }, func(d *decoder, l *lease.Lease, _ int64) { l.JobID = d.str() }},
	{func(e *encoder, l *lease.Lease, _ int64) { e.str(l.LeaseID) }, func(d *decoder, l *lease.Lease, _ int64) { l.LeaseID = d.str() }},
	{func(e *encoder, l *lease.Lease, _ int64) { e.uint(l.Generation) }, func(d *decoder, l *lease.Lease, _ int64) { l.Generation = d.uint() }},
	{func(e *encoder, l *lease.Lease, _ int64) { e.str(l.HolderIdentity) }, func(d *decoder, l *lease.Lease, _ int64) { l.HolderIdentity = d.str() }},
	timeField(func(l *lease.Lease) *time.Time { return &l.IssuedAt }),
	{func(e *encoder, l *lease.Lease, _ int64) { e.dur(l.LeaseDuration) }, func(d *decoder, l *lease.Lease, _ int64) { l.LeaseDuration = d.dur() }},
	timeField(func(l *lease.Lease) *time.Time { return &l.ExpiresAt }),
	timeField(func(l *lease.Lease) *time.Time { return &l.AckDeadline }),
	{func(e *encoder, l *lease.Lease, _ int64) { e.uint(uint64(l.AckState)) }, func(d *decoder, l *lease.Lease, _ int64) { l.AckState = lease.AckState(d.uint()) }},
	{func(e *encoder, l *lease.Lease, _ int64) { e.uint(uint64(l.State)) }, func(d *decoder, l *lease.Lease, _ int64) { l.State = lease.State(d.uint()) }},
	{func(e *encoder, l *lease.Lease, _ int64) { e.uint(l.RenewSequence) }, func(d *decoder, l *lease.Lease, _ int64) { l.RenewSequence = d.uint() }},
	timeField(func(l *lease.Lease) *time.Time { return &l.RenewTime }),
	{func(e *encoder, l *lease.Lease, _ int64) { e.uint(l.ProgressSequence) }, func(d *decoder, l *lease.Lease, _ int64) { l.ProgressSequence = d.uint() }},
	{func(e *encoder, l *lease.Lease, _ int64) { e.str(l.ProgressValue) }, func(d *decoder, l *lease.Lease, _ int64) { l.ProgressValue = d.str() }},
	{func(e *encoder, l *lease.Lease, _ int64) { e.flag(l.CancelRequested) }, func(d *decoder, l *lease.Lease, _ int64) { l.CancelRequested = d.flag() }},
	timeField(func(l *lease.Lease) *time.Time { return &l.CancelRequestedAt }),
	{func(e *encoder, l *lease.Lease, _ int64) { e.flag(l.CancelAck) }, func(d *decoder, l *lease.Lease, _ int64) { l.CancelAck = d.flag() }},
	timeField(func(l *lease.Lease) *time.Time { return &l.CancelAckedAt }),
	{func(e *encoder, l *lease.Lease, _ int64) { e.uint(uint64(l.TerminalResult)) }, func(d *decoder, l *lease.Lease, _ int64) {
		l.TerminalResult = lease.TerminalResult(d.uint())
	}},
	timeField(func(l *lease.Lease) *time.Time { return &l.TerminalAt }),
	{func(e *encoder, l *lease.Lease, _ int64) { e.str(l.TerminalDetail) }, func(d *decoder, l *lease.Lease, _ int64) { l.TerminalDetail = d.str() }},
	timeField(func(l *lease.Lease) *time.Time { return &l.UnresolvedUntil }),
	{func(e *encoder, l *lease.Lease, _ int64) { e.flag(l.StaleGeneration) }, func(d *decoder, l *lease.Lease, _ int64) { l.StaleGeneration = d.flag() }},
	{func(e *encoder, l *lease.Lease, _ int64) { e.flag(l.LateProgress) }, func(d *decoder, l *lease.Lease, _ int64) { l.LateProgress = d.flag() }},
	{func(e *encoder, l *lease.Lease, _ int64) { e.flag(l.LeaseExpired) }, func(d *decoder, l *lease.Lease, _ int64) { l.LeaseExpired = d.flag() }},
	{func(e *encoder, l *lease.Lease, _ int64) { e.flag(l.OwnershipConflict) }, func(d *decoder, l *lease.Lease, _ int64) { l.OwnershipConflict = d.flag() }},
	{func(e *encoder, l *lease.Lease, _ int64) { e.str(l.ConflictHolder) }, func(d *decoder, l *lease.Lease, _ int64) { l.ConflictHolder = d.str() }},
	timeField(func(l *lease.Lease) *time.Time { return &l.AcquireTime }),
	timeField(func(l *lease.Lease) *time.Time { return &l.LastRenewTime }),
	{func(e *encoder, l *lease.Lease, _ int64) { e.uint(l.Transitions) }, func(d *decoder, l *lease.Lease, _ int64) { l.Transitions = d.uint() }},
}

func timeField(field func(*lease.Lease) *time.Time) leaseField {
	return leaseField{
		enc: func(e *encoder, l *lease.Lease, base int64) { e.timeFrom(*field(l), base) },
		dec: func(d *decoder, l *lease.Lease, base int64) { *field(l) = d.timeFrom(base) },
	}
}

// timeBase is the origin of a delta row's times: its decision time.
func timeBase(decided time.Time) int64 {
	if decided.IsZero() {
		return 0
	}
	return decided.UnixNano()
}

// encodeLeaseDelta writes the fields of next that differ from prev.
func encodeLeaseDelta(e *encoder, prev, next lease.Lease, base int64) {
	var mask uint64
	var was, fields encoder
	for i, f := range leaseFields {
		was.b = was.b[:0]
		f.enc(&was, &prev, base)
		n := len(fields.b)
		f.enc(&fields, &next, base)
		if bytes.Equal(was.b, fields.b[n:]) {
			fields.b = fields.b[:n]
			continue
		}
		mask |= 1 << i
	}
	e.uint(mask)
	e.b = append(e.b, fields.b...)
}

// decodeLeaseDelta applies a delta written by encodeLeaseDelta to prev.
func decodeLeaseDelta(d *decoder, prev lease.Lease, base int64) lease.Lease {
	mask := d.uint()
	if d.err == nil && mask>>len(leaseFields) != 0 {
		d.fail("field mask")
	}
	l := prev
	for i, f := range leaseFields {
		if mask&(1<<i) != 0 {
			f.dec(d, &l, base)
		}
	}
	return l
}

// Reason compaction. A reason quotes the message's and the leases' ids and
// timestamps; the reader can rebuild those strings from the row, so the
// row stores a one-byte reference instead. Escape bytes: reasonRef then an
// index into the row's dictionary; reasonRef twice is a literal reasonRef.
const (
	reasonRef     byte = 0x01
	reasonLiteral byte = 0xff
	maxReasonDict      = 254
)

// reasonDict is the dictionary of a row: strings derived from the lease
// before and after the decision and the decision time, longest first (the
// compactor takes the longest match). Encoder and decoder build it from
// the same inputs, so it is never stored.
func reasonDict(prev, next lease.Lease, decided time.Time) []string {
	var dict []string
	add := func(s string) {
		if len(s) >= 4 && !slices.Contains(dict, s) && len(dict) < maxReasonDict {
			dict = append(dict, s)
		}
	}
	var times []time.Time
	addTime := func(t time.Time) {
		// Formatting is the dictionary's main cost: each instant once.
		if !t.IsZero() && !slices.ContainsFunc(times, t.Equal) {
			times = append(times, t)
			add(reasonTime(t))
		}
	}
	for _, l := range []*lease.Lease{&next, &prev} {
		for _, s := range []string{l.LeaseID, l.HolderIdentity, l.JobID, l.ConflictHolder} {
			if s != "" {
				add(strconv.Quote(s))
				add(s)
			}
		}
		for _, t := range []time.Time{l.ExpiresAt, l.AckDeadline, l.RenewTime, l.IssuedAt, l.UnresolvedUntil,
			l.CancelRequestedAt, l.CancelAckedAt, l.TerminalAt, l.AcquireTime} {
			addTime(t)
		}
		if l.LeaseDuration != 0 {
			add(l.LeaseDuration.String())
		}
	}
	addTime(decided)
	// Longest first; the sort is stable so equal lengths keep the order
	// above, which the decoder rebuilds identically.
	slices.SortStableFunc(dict, func(a, b string) int { return len(b) - len(a) })
	return dict
}

// reasonTime renders a time as package lease renders it in reasons.
func reasonTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// compactReason replaces dictionary strings in reason by references.
func compactReason(dst []byte, reason string, dict []string) []byte {
	var first [256]bool
	for _, s := range dict {
		first[s[0]] = true
	}
	for i := 0; i < len(reason); {
		c := reason[i]
		if first[c] {
			best := -1
			for k, s := range dict {
				if strings.HasPrefix(reason[i:], s) {
					best = k
					break // longest first
				}
			}
			if best >= 0 {
				dst = append(dst, reasonRef, byte(best))
				i += len(dict[best])
				continue
			}
		}
		if c == reasonRef {
			dst = append(dst, reasonRef, reasonLiteral)
		} else {
			dst = append(dst, c)
		}
		i++
	}
	return dst
}

// expandReason undoes compactReason.
func expandReason(b []byte, dict []string) (string, error) {
	var out strings.Builder
	out.Grow(len(b) * 2)
	for i := 0; i < len(b); i++ {
		if b[i] != reasonRef {
			out.WriteByte(b[i])
			continue
		}
		if i+1 == len(b) {
			return "", fmt.Errorf("%w: reason ends inside a reference", ErrCorrupt)
		}
		i++
		switch ref := b[i]; {
		case ref == reasonLiteral:
			out.WriteByte(reasonRef)
		case int(ref) < len(dict):
			out.WriteString(dict[ref])
		default:
			return "", fmt.Errorf("%w: reason refers to entry %d of %d", ErrCorrupt, ref, len(dict))
		}
	}
	return out.String(), nil
}
