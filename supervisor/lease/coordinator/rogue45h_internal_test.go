package coordinator

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/tetherhq/tether/supervisor/lease"
)

// oldParseReasonTime is parseReasonTime as it was before the forty-fifth
// pass: every candidate rendered back and compared.
func oldParseReasonTime(s string) (int64, int, bool) {
	const layout = "0000-00-00T00:00:00"
	if len(s) < len(layout)+1 {
		return 0, 0, false
	}
	for i := range len(layout) {
		if layout[i] == '0' {
			if s[i] < '0' || s[i] > '9' {
				return 0, 0, false
			}
		} else if s[i] != layout[i] {
			return 0, 0, false
		}
	}
	num := func(from, to int) int {
		v := 0
		for _, c := range s[from:to] {
			v = v*10 + int(c-'0')
		}
		return v
	}
	n := len(layout)
	ns := 0
	if s[n] == '.' {
		digits := 0
		for n+1+digits < len(s) && digits < 9 && s[n+1+digits] >= '0' && s[n+1+digits] <= '9' {
			digits++
		}
		if digits == 0 {
			return 0, 0, false
		}
		ns = num(n+1, n+1+digits)
		for range 9 - digits {
			ns *= 10
		}
		n += 1 + digits
	}
	if n >= len(s) || s[n] != 'Z' {
		return 0, 0, false
	}
	n++
	nanos := time.Date(num(0, 4), time.Month(num(5, 7)), num(8, 10), num(11, 13), num(14, 16), num(17, 19), ns, time.UTC).UnixNano()
	var buf [40]byte
	if string(appendReasonTime(buf[:0], nanos)) != s[:n] {
		return 0, 0, false
	}
	return nanos, n, true
}

// TestRogue45HReasonTimesParseAsBefore holds parseReasonTime, which now
// checks the fields' ranges instead of rendering every timestamp back, to
// what rendering back accepted: the same instants and lengths, and the
// same refusals (month 13, February 29 of a common year, second 60, a
// fraction with a trailing zero, years outside Unix nanoseconds).
func TestRogue45HReasonTimesParseAsBefore(t *testing.T) {
	cases := []string{
		"2026-12-07T14:26:44Z", "2026-12-07T14:26:44.123456789Z", "2026-12-07T14:26:44.12345678Z",
		"2026-12-07T14:26:44.1Z", "2026-12-07T14:26:44.10Z", "2026-12-07T14:26:44.0Z", "2026-12-07T14:26:44.000000000Z",
		"2026-13-07T14:26:44Z", "2026-00-07T14:26:44Z", "2026-02-29T00:00:00Z", "2024-02-29T00:00:00Z", "2100-02-29T00:00:00Z",
		"2000-02-29T00:00:00Z", "2026-04-31T00:00:00Z", "2026-04-30T24:00:00Z", "2026-04-30T23:60:00Z", "2026-04-30T23:59:60Z",
		"2026-01-00T00:00:00Z", "1699-12-31T23:59:59.999999999Z", "1700-01-01T00:00:00Z", "2200-12-31T23:59:59.999999999Z",
		"2201-01-01T00:00:00Z", "2262-04-11T23:47:16.854775807Z", "2262-04-11T23:47:16.854775808Z", "0000-01-01T00:00:00Z",
		"9999-12-31T23:59:59Z", "1677-09-21T00:12:43.145224192Z", "2026-12-07T14:26:44.1234567890Z", "2026-12-07T14:26:44.Z",
		"2026-12-07T14:26:44", "2026-12-07 14:26:44Z", "2026-12-07T14:26:44Zrest", "1970-01-01T00:00:00Z",
	}
	rng := rand.New(rand.NewPCG(45, 72))
	for range 200000 {
		// Random fields, in and out of range, and random fractions.
		s := fmt.Sprintf("%04d-%02d-%02dT%02d:%02d:%02d", 1600+rng.IntN(800), rng.IntN(14), rng.IntN(33), rng.IntN(26), rng.IntN(62), rng.IntN(62))
		if rng.IntN(3) > 0 {
			d := 1 + rng.IntN(10)
			s += "." + fmt.Sprintf("%0*d", d, rng.IntN(1_000_000_000))[:d]
		}
		cases = append(cases, s+"Z")
	}
	accepted := 0
	for _, c := range cases {
		wn, wl, wok := oldParseReasonTime(c)
		gn, gl, gok := parseReasonTime(c)
		if wok != gok || wok && (wn != gn || wl != gl) {
			t.Fatalf("%q: got %d, %d, %v; before %d, %d, %v", c, gn, gl, gok, wn, wl, wok)
		}
		if gok {
			accepted++
		}
	}
	if accepted < len(cases)/20 {
		t.Fatalf("only %d of %d accepted: the cases do not reach the fast path", accepted, len(cases))
	}
}

// oldEncodeRow is encodeRow as it was before the forty-fifth pass: the
// delta's fields and the reason each in a buffer of their own.
func oldEncodeRow(prev lease.Lease, r storedRow) []byte {
	e := encoder{b: []byte{evidenceSchemaDelta}}
	e.uint(r.Number)
	e.time(r.DecidedAt)
	base := timeBase(r.DecidedAt)
	var mask uint64
	was, fields := encoder{}, encoder{}
	for i := range leaseFields {
		was.b = was.b[:0]
		encodeField(&was, i, &prev, base)
		n := len(fields.b)
		encodeField(&fields, i, &r.Lease, base)
		if bytes.Equal(was.b, fields.b[n:]) {
			fields.b = fields.b[:n]
			continue
		}
		mask |= 1 << i
	}
	e.uint(mask)
	e.b = append(e.b, fields.b...)
	e.uint(uint64(r.Decision.Outcome))
	e.uint(uint64(r.Decision.Event))
	e.uint(uint64(r.Kind))
	reason, quoted := oldCompactQuoted(r.Decision.Reason, reasonDict(prev, r.Lease), reasonValues(prev, r.Lease), base)
	if quoted {
		e.b[0] = evidenceSchemaDeltaQuoted
	}
	e.uint(uint64(len(reason)))
	return append(e.b, reason...)
}

// oldCompactQuoted is compactQuoted as it was: every double quote read by
// quotedAt, whether or not an id matched there.
func oldCompactQuoted(reason string, dict []string, vals *[2]string, base int64) ([]byte, bool) {
	var dst []byte
	quoted := false
	for i := 0; i < len(reason); {
		c := reason[i]
		if c >= '0' && c <= '9' {
			if t, n, ok := oldParseReasonTime(reason[i:]); ok {
				dst = append(dst, reasonRef, reasonTimeRef)
				dst = binary.AppendVarint(dst, t-base)
				i += n
				continue
			}
		}
		k, n := matchID(reason[i:], dict)
		if c == '"' && vals != nil {
			if raw, q := quotedAt(reason[i:]); q > n {
				switch {
				case raw == vals[0] && q > 3:
					dst = append(dst, reasonRef, reasonQuotedRef, 0)
				case raw == vals[1] && q > 3:
					dst = append(dst, reasonRef, reasonQuotedRef, 1)
				case q > len(raw)+2+binary.MaxVarintLen64:
					dst = append(dst, reasonRef, reasonQuotedRef)
					dst = binary.AppendUvarint(dst, uint64(len(raw))+2)
					dst = append(dst, raw...)
				default:
					q = 0
				}
				if q > 0 {
					quoted = true
					i += q
					continue
				}
			}
		}
		if n > 0 {
			dst = append(dst, reasonRef, byte(k))
			i += n
			continue
		}
		if c == reasonRef {
			dst = append(dst, reasonRef, reasonLiteral)
		} else {
			dst = append(dst, c)
		}
		i++
	}
	return dst, quoted
}

// TestRogue45HRowsEncodeAsBefore holds encodeRow, which now builds the
// delta and the reason in the row's own buffer (and the shard's buffer
// reused), to the bytes it wrote before, byte for byte, for rows of every
// message the lease machine judges, ids quoted with escapes among them,
// and each decodes back to its row.
func TestRogue45HRowsEncodeAsBefore(t *testing.T) {
	p := lease.DefaultPolicy()
	at := time.Date(2026, 12, 7, 14, 26, 44, 123456789, time.UTC)
	ids := []string{"lease-7f3a9c01d2e4b6a8", `q"uote`, "ctl\x01\x7f", "日本", "ab", "n-0192af3c7d5e4b21", strings.Repeat("z", 256)}
	rng := rand.New(rand.NewPCG(45, 9))
	var buf []byte
	rows := 0
	for k := range 400 {
		lid, holder := ids[rng.IntN(len(ids))], ids[rng.IntN(len(ids))]
		other := ids[rng.IntN(len(ids))]
		claim := lease.Claim{JobID: "job-" + ids[k%len(ids)], LeaseID: lid, Generation: 1, HolderIdentity: holder}
		msgs := []lease.Message{
			lease.Offer{JobID: claim.JobID, LeaseID: lid, HolderIdentity: holder, LeaseDuration: 30 * time.Second},
			lease.Ack{Claim: claim},
			lease.Renew{Claim: claim, RenewSequence: 1},
			lease.Renew{Claim: claim, RenewSequence: 1},
			lease.Progress{Claim: claim, ProgressSequence: 1, ProgressValue: ids[rng.IntN(len(ids))] + "\x00%"},
			lease.Progress{Claim: claim, ProgressSequence: 1, ProgressValue: "other \"value\""},
			lease.Renew{Claim: lease.Claim{JobID: claim.JobID, LeaseID: lid, Generation: 1, HolderIdentity: other}, RenewSequence: 2},
			lease.Renew{Claim: claim, RenewSequence: 3},
			lease.RequestCancel{Reason: "stop \"" + other + "\""},
			lease.Reassign{LeaseID: other + "-2", HolderIdentity: holder, LeaseDuration: time.Minute, Reason: "again"},
			lease.Complete{Claim: claim, Result: lease.ResultSuccess, Detail: "done"},
			lease.Tick{JobID: claim.JobID},
		}
		var l lease.Lease
		now := at.Add(time.Duration(k) * time.Second)
		for n, m := range msgs {
			now = now.Add(time.Duration(rng.IntN(3_000_000_000)))
			next, d, _ := lease.Step(l, m, now, p)
			r := storedRow{Number: uint64(n + 1), Lease: next, Decision: d, Kind: m.Kind(), DecidedAt: now}
			want := oldEncodeRow(l, r)
			buf = encodeRow(buf[:0], l, r)
			if !bytes.Equal(buf, want) {
				t.Fatalf("row %d (%s) of lease %q:\n got %x\nwant %x", n+1, m.Kind(), lid, buf, want)
			}
			if got, err := decodeRow(l, bytes.Clone(buf)); err != nil || got.Decision.Reason != d.Reason || got.Lease != next {
				t.Fatalf("row %d (%s) decodes to %q, %v; want %q", n+1, m.Kind(), got.Decision.Reason, err, d.Reason)
			}
			l = next
			rows++
		}
	}
	if rows < 4000 {
		t.Fatalf("only %d rows", rows)
	}
}

// TestRogue45HPacksAreSizedOnce holds encodePack's size, computed before
// it writes (packSize), to what it writes, for the log's packs (rows with
// their jobs) and a job's (without), and the rows to what they decode to.
func TestRogue45HPacksAreSizedOnce(t *testing.T) {
	for _, n := range []int{0, 1, 2, 63, 64, 200} {
		var rows []logRow
		for i := range n {
			rows = append(rows, logRow{job: strings.Repeat("j", 1+i%300), number: uint64(i + 1), row: append(binary.AppendUvarint([]byte{evidenceSchemaDelta}, uint64(i+1)), bytes.Repeat([]byte{byte(i)}, (i*37)%400)...)})
		}
		for _, withJobs := range []bool{true, false} {
			if got, want := len(encodePack(nil, rows, withJobs)), packSize(rows, withJobs); got != want {
				t.Fatalf("%d rows (jobs %v): %d bytes, sized %d", n, withJobs, got, want)
			}
		}
		var got []logRow
		if err := decodePack(encodePack(nil, rows, true), "", func(r logRow) error { got = append(got, r); return nil }); err != nil || len(got) != n {
			t.Fatalf("%d rows decode to %d: %v", n, len(got), err)
		}
		for i, r := range got {
			if r.job != rows[i].job || !bytes.Equal(r.row, rows[i].row) {
				t.Fatalf("row %d of %d decodes to %q %x", i, n, r.job, r.row)
			}
		}
	}
	for _, v := range []uint64{0, 1, 127, 128, 16383, 16384, 1<<63 - 1, 1<<64 - 1} {
		if uvarintLen(v) != len(binary.AppendUvarint(nil, v)) {
			t.Fatalf("uvarintLen(%d) = %d", v, uvarintLen(v))
		}
	}
}

// TestRogue45HSameFieldIsItsOwnField holds sameField, which lets a row's
// delta skip encoding the fields a decision left alone, to encodeField's
// numbering: a lease that differs from another in field i alone (set
// through decodeField(i), so by the codec's own numbering) is "not the
// same" in field i and "the same" in every other. A field compared under
// another's number would drop its change from the row.
func TestRogue45HSameFieldIsItsOwnField(t *testing.T) {
	a := sampleLease()
	at := time.Date(2031, 1, 2, 3, 4, 5, 6, time.UTC)
	b := lease.Lease{
		JobID: "job/other", LeaseID: "l_2", Generation: 9, HolderIdentity: "n_v", IssuedAt: at, LeaseDuration: time.Minute,
		ExpiresAt: at.Add(time.Minute), AckDeadline: at.Add(time.Second), AckState: lease.AckMissed, State: lease.StateTerminal,
		RenewSequence: 4, RenewTime: at.Add(2 * time.Second), ProgressSequence: 15, ProgressValue: "71%",
		CancelRequested: false, CancelRequestedAt: at.Add(3 * time.Second), CancelAck: true, CancelAckedAt: at.Add(4 * time.Second),
		TerminalResult: lease.ResultFailed, TerminalAt: at.Add(5 * time.Second), TerminalDetail: "e", UnresolvedUntil: at.Add(6 * time.Second),
		StaleGeneration: false, LateProgress: false, LeaseExpired: true, OwnershipConflict: false, ConflictHolder: "n_y",
		AcquireTime: at.Add(7 * time.Second), LastRenewTime: at.Add(8 * time.Second), Transitions: 8, Owner: "n_other",
		FormerHolders: [lease.MaxFormerHolders]string{"n_a"}, AutoReassigns: 3, ResolvedByCoordinator: true,
	}
	for i := range leaseFields {
		field := encoder{}
		encodeField(&field, i, &b, 0)
		c := a
		d := decoder{b: field.b}
		decodeField(&d, i, &c, 0)
		if d.err != nil || len(d.b) != 0 {
			t.Fatalf("field %d: %v", i, d.err)
		}
		var was, now encoder
		encodeField(&was, i, &a, 0)
		encodeField(&now, i, &c, 0)
		if bytes.Equal(was.b, now.b) {
			t.Fatalf("field %d: the two leases write it the same; the test needs them to differ", i)
		}
		for j := range leaseFields {
			if got := sameField(j, &a, &c); got != (j != i) {
				t.Fatalf("leases differing in field %d alone: sameField(%d) = %v", i, j, got)
			}
		}
	}
	if sameField(leaseFields, &a, &a) {
		t.Fatal("a field past the last is reported the same")
	}
}
