package coordinator

import (
	"bytes"
	"encoding/binary"
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
//   - the reason with the ids it quotes from the two leases and its
//     timestamps replaced by short references.
//
// So a row decodes only against the lease before it: the previous row's,
// or the job record's for the first row after a checkpoint, or the empty
// lease for row 1 and for rows of the unknown-job log. Readers go in row
// order anyway (Evidence from row 1, a load from the checkpoint), and a
// gap in the numbering is reported as corruption rather than decoded
// against the wrong lease. Schema-1 rows still decode (they need nothing
// before them).

// leaseFields is how many fields of lease.Lease are stored, in the order
// of encodeField. Append only: a field's position is its bit in a delta
// row's mask, and a full lease (records, schema-1 rows) is every field in
// order with absolute times (base 0). Records of schema 1 and schema-1 rows
// were written with the first leaseFieldsV1 fields; the fields after them
// (Owner, FormerHolders, AutoReassigns) are zero there. Records of schema 2
// and anchors of schema 3 were written with the first leaseFieldsV2 fields
// (no AutoReassigns: it reads as 0). A delta row from before AutoReassigns
// never sets its bit, so it decodes unchanged. Records of schemas 3 and 4
// and anchors of schemas 5 and 7 carry the first leaseFieldsV3 fields (no
// ResolvedByCoordinator: it reads as false), and are still what is written
// for a lease whose ResolvedByCoordinator is false, so that a binary from
// before the field reads every record that does not carry it; a lease
// resolved by the coordinator is written in the schemas that carry every
// field (records 5, anchors 8 and 9), and a delta row that sets the
// field's bit, which such a binary refuses rather than misreads.
const (
	leaseFields   = 34
	leaseFieldsV3 = 33
	leaseFieldsV2 = 32
	leaseFieldsV1 = 30
)

// encodeField writes field i of l; times relative to base (Unix
// nanoseconds).
func encodeField(e *encoder, i int, l *lease.Lease, base int64) {
	fieldCodec{e: e, base: base}.field(i, l)
}

// decodeField reads what encodeField(i) wrote into l.
func decodeField(d *decoder, i int, l *lease.Lease, base int64) {
	fieldCodec{d: d, base: base}.field(i, l)
}

// fieldCodec moves one lease field between a lease and a row: it decodes
// into the field when d is set, else encodes the field with e. One switch
// serves both directions, so they cannot drift apart; a switch rather than
// a table of closures, and pointers only to the methods below (none keeps
// them), so l does not escape and encoding a row allocates no lease.
type fieldCodec struct {
	e    *encoder
	d    *decoder
	base int64
}

func (c fieldCodec) field(i int, l *lease.Lease) {
	switch i {
	case 0:
		c.str(&l.JobID)
	case 1:
		c.str(&l.LeaseID)
	case 2:
		c.uint(&l.Generation)
	case 3:
		c.str(&l.HolderIdentity)
	case 4:
		c.time(&l.IssuedAt)
	case 5:
		c.dur(&l.LeaseDuration)
	case 6:
		c.time(&l.ExpiresAt)
	case 7:
		c.time(&l.AckDeadline)
	case 8:
		codeEnum(c, &l.AckState)
	case 9:
		codeEnum(c, &l.State)
	case 10:
		c.uint(&l.RenewSequence)
	case 11:
		c.time(&l.RenewTime)
	case 12:
		c.uint(&l.ProgressSequence)
	case 13:
		c.str(&l.ProgressValue)
	case 14:
		c.flag(&l.CancelRequested)
	case 15:
		c.time(&l.CancelRequestedAt)
	case 16:
		c.flag(&l.CancelAck)
	case 17:
		c.time(&l.CancelAckedAt)
	case 18:
		codeEnum(c, &l.TerminalResult)
	case 19:
		c.time(&l.TerminalAt)
	case 20:
		c.str(&l.TerminalDetail)
	case 21:
		c.time(&l.UnresolvedUntil)
	case 22:
		c.flag(&l.StaleGeneration)
	case 23:
		c.flag(&l.LateProgress)
	case 24:
		c.flag(&l.LeaseExpired)
	case 25:
		c.flag(&l.OwnershipConflict)
	case 26:
		c.str(&l.ConflictHolder)
	case 27:
		c.time(&l.AcquireTime)
	case 28:
		c.time(&l.LastRenewTime)
	case 29:
		c.uint(&l.Transitions)
	case 30:
		c.str(&l.Owner)
	case 31:
		c.formerHolders(&l.FormerHolders)
	case 32:
		c.uint(&l.AutoReassigns)
	case 33:
		c.flag(&l.ResolvedByCoordinator)
	}
}

func (c fieldCodec) str(p *string) {
	if c.d != nil {
		*p = c.d.str()
	} else {
		c.e.str(*p)
	}
}

func (c fieldCodec) uint(p *uint64) {
	if c.d != nil {
		*p = c.d.uint()
	} else {
		c.e.uint(*p)
	}
}

func (c fieldCodec) flag(p *bool) {
	if c.d != nil {
		*p = c.d.flag()
	} else {
		c.e.flag(*p)
	}
}

func (c fieldCodec) dur(p *time.Duration) {
	if c.d != nil {
		*p = c.d.dur()
	} else {
		c.e.dur(*p)
	}
}

func (c fieldCodec) time(p *time.Time) {
	if c.d != nil {
		*p = c.d.timeFrom(c.base)
	} else {
		c.e.timeFrom(*p, c.base)
	}
}

// codeEnum stores an enum as its number.
func codeEnum[T ~int32](c fieldCodec, p *T) {
	if c.d != nil {
		*p = T(c.d.uint())
	} else {
		c.e.uint(uint64(*p))
	}
}

// formerHolders stores the holders up to the first empty slot: a count,
// then each.
func (c fieldCodec) formerHolders(p *[lease.MaxFormerHolders]string) {
	if c.d == nil {
		n := 0
		for n < len(p) && p[n] != "" {
			n++
		}
		c.e.uint(uint64(n))
		for _, h := range p[:n] {
			c.e.str(h)
		}
		return
	}
	*p = [lease.MaxFormerHolders]string{}
	n := c.d.uint()
	if n > lease.MaxFormerHolders {
		c.d.fail("former holders")
		return
	}
	for i := range n {
		p[i] = c.d.str()
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
func encodeLeaseDelta(e *encoder, prev, next *lease.Lease, base int64) {
	// Each field of prev and of next is encoded after what e holds (the
	// fields kept so far), compared there and next's kept if they
	// differ; the mask goes in front of the kept fields at the end. No
	// buffer of its own: two of them escaped to the heap on every row.
	var mask uint64
	start := len(e.b)
	for i := range leaseFields {
		if sameField(i, prev, next) {
			continue // most of a renewal's 34 fields: no need to encode them
		}
		was := len(e.b)
		encodeField(e, i, prev, base)
		now := len(e.b)
		encodeField(e, i, next, base)
		if bytes.Equal(e.b[was:now], e.b[now:]) {
			e.b = e.b[:was]
			continue
		}
		e.b = e.b[:was+copy(e.b[was:], e.b[now:])]
		mask |= 1 << i
	}
	var m [binary.MaxVarintLen64]byte
	k := binary.PutUvarint(m[:], mask)
	e.b = append(e.b, m[:k]...)
	copy(e.b[start+k:], e.b[start:len(e.b)-k])
	copy(e.b[start:], m[:k])
}

// sameField reports that field i (encodeField's numbering) of a and b is
// certainly written the same: equal values (a time equal as a value, its
// location and monotonic reading included, is the same instant). false
// means only "not known": encodeLeaseDelta then compares the encodings,
// as it did for every field, so a field missing here costs time, never a
// row; one compared under the wrong number would lose a change, which
// TestRogue45HSameFieldIsItsOwnField holds against, field by field.
func sameField(i int, a, b *lease.Lease) bool {
	switch i {
	case 0:
		return a.JobID == b.JobID
	case 1:
		return a.LeaseID == b.LeaseID
	case 2:
		return a.Generation == b.Generation
	case 3:
		return a.HolderIdentity == b.HolderIdentity
	case 4:
		return a.IssuedAt == b.IssuedAt
	case 5:
		return a.LeaseDuration == b.LeaseDuration
	case 6:
		return a.ExpiresAt == b.ExpiresAt
	case 7:
		return a.AckDeadline == b.AckDeadline
	case 8:
		return a.AckState == b.AckState
	case 9:
		return a.State == b.State
	case 10:
		return a.RenewSequence == b.RenewSequence
	case 11:
		return a.RenewTime == b.RenewTime
	case 12:
		return a.ProgressSequence == b.ProgressSequence
	case 13:
		return a.ProgressValue == b.ProgressValue
	case 14:
		return a.CancelRequested == b.CancelRequested
	case 15:
		return a.CancelRequestedAt == b.CancelRequestedAt
	case 16:
		return a.CancelAck == b.CancelAck
	case 17:
		return a.CancelAckedAt == b.CancelAckedAt
	case 18:
		return a.TerminalResult == b.TerminalResult
	case 19:
		return a.TerminalAt == b.TerminalAt
	case 20:
		return a.TerminalDetail == b.TerminalDetail
	case 21:
		return a.UnresolvedUntil == b.UnresolvedUntil
	case 22:
		return a.StaleGeneration == b.StaleGeneration
	case 23:
		return a.LateProgress == b.LateProgress
	case 24:
		return a.LeaseExpired == b.LeaseExpired
	case 25:
		return a.OwnershipConflict == b.OwnershipConflict
	case 26:
		return a.ConflictHolder == b.ConflictHolder
	case 27:
		return a.AcquireTime == b.AcquireTime
	case 28:
		return a.LastRenewTime == b.LastRenewTime
	case 29:
		return a.Transitions == b.Transitions
	case 30:
		return a.Owner == b.Owner
	case 31:
		return a.FormerHolders == b.FormerHolders
	case 32:
		return a.AutoReassigns == b.AutoReassigns
	case 33:
		return a.ResolvedByCoordinator == b.ResolvedByCoordinator
	}
	return false
}

// decodeLeaseDelta applies a delta written by encodeLeaseDelta to prev.
func decodeLeaseDelta(d *decoder, prev lease.Lease, base int64) lease.Lease {
	mask := d.uint()
	if d.err == nil && mask>>leaseFields != 0 {
		d.fail("field mask")
	}
	l := prev
	for i := range leaseFields {
		if mask&(1<<i) != 0 {
			decodeField(d, i, &l, base)
		}
	}
	return l
}

// Reason compaction. A reason quotes ids from the leases and timestamps;
// the row stores those as short references the reader expands again:
//
//	reasonRef, i        the i-th id of the row's dictionary (reasonDict),
//	                    quoted when i is odd
//	reasonRef, timeRef  a timestamp as package lease renders it in reasons
//	                    (UTC, RFC 3339 with nanoseconds), stored as a
//	                    varint relative to the decision time
//	reasonRef, literal  the byte reasonRef itself
//
// and, in rows of schema evidenceSchemaDeltaQuoted and anchors of
// evidenceSchemaAnchorQuoted only:
//
//	reasonRef, quotedRef, n  a text as strconv.Quote renders it: n (a
//	                    uvarint) 0 the progress value of the lease after
//	                    the decision, 1 that of the lease before, n ≥ 2
//	                    the n-2 bytes that follow, unquoted
//
// A reason quotes every text its sender chose (%q), and a quoted control
// character takes four bytes: a holder's 4 KiB progress value of control
// characters made a row of some 20 KB (the value, and the reason quoting
// it), one that reused an accepted sequence with another such value some
// 33 KB (the reason quotes both), against some 170 bytes for a renewal.
// Stored unquoted, or as a reference to the value the row's lease holds,
// a row carries each text the sender chose at most once, at its own size.
//
// The compactor replaces only what expands back to exactly the same bytes
// (a timestamp is re-rendered and compared, a quoted text re-quoted), so
// any reason survives.
const (
	reasonRef       byte = 0x01
	reasonQuotedRef byte = 0xfd
	reasonTimeRef   byte = 0xfe
	reasonLiteral   byte = 0xff
)

// reasonValues are the texts a row's reason may quote that its leases
// hold (quotedRef 0 and 1): the progress values after and before.
func reasonValues(prev, next lease.Lease) *[2]string {
	return &[2]string{next.ProgressValue, prev.ProgressValue}
}

// quotedAt returns the quoted text s starts with, as strconv.Quote would
// render its unquoted form raw, and its length; n is 0 when s does not
// start with one. It reads s up to its first unescaped double quote after
// the first, so a compactor that tries every double quote reads a reason
// about twice.
func quotedAt(s string) (raw string, n int) {
	if s == "" || s[0] != '"' {
		return "", 0
	}
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			raw, err := strconv.Unquote(s[:i+1])
			if err != nil || strconv.Quote(raw) != s[:i+1] {
				return "", 0
			}
			return raw, i + 1
		}
	}
	return "", 0
}

// reasonDict is the row's dictionary: the ids of the lease before and
// after the decision, each usable bare (even index) or quoted (odd index).
// The encoder and the decoder build it from the same leases, so it is
// never stored. Only ids that quote without escapes are entered, so the
// quoted form is the id between two double quotes.
func reasonDict(prev, next lease.Lease) []string {
	return appendReasonDict(make([]string, 0, reasonDictSize), &prev, &next)
}

// reasonDictSize is the most ids a row's dictionary holds.
const reasonDictSize = 7

// appendReasonDict appends reasonDict(*prev, *next) to dict (which the
// row's encoder keeps on its stack).
func appendReasonDict(dict []string, prev, next *lease.Lease) []string {
	for _, id := range [reasonDictSize]string{next.LeaseID, next.HolderIdentity, next.JobID, next.ConflictHolder,
		prev.LeaseID, prev.HolderIdentity, prev.ConflictHolder} {
		if len(id) >= 4 && plainID(id) && !slices.Contains(dict, id) {
			dict = append(dict, id)
		}
	}
	return dict
}

// plainID: strconv.Quote(id) is id between double quotes.
func plainID(id string) bool {
	for i := 0; i < len(id); i++ {
		if c := id[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

// compactReason appends reason to dst with ids and timestamps replaced by
// references. base is the row's time base (timeBase).
func compactReason(dst []byte, reason string, dict []string, base int64) []byte {
	dst, _ = compactQuoted(dst, reason, dict, nil, base)
	return dst
}

// compactQuoted is compactReason that also replaces quoted texts by
// references when vals is not nil (values: reasonValues), where that is
// shorter, and reports whether it did (the row is then of schema
// evidenceSchemaDeltaQuoted). When it did not, what it appends is what
// compactReason appends.
func compactQuoted(dst []byte, reason string, dict []string, vals *[2]string, base int64) ([]byte, bool) {
	quoted := false
	var starts [256]bool // first bytes of a reference
	starts['"'] = true
	for _, id := range dict {
		starts[id[0]] = true
	}
	for i := 0; i < len(reason); {
		c := reason[i]
		if !starts[c] && (c < '0' || c > '9') {
			if c == reasonRef {
				dst = append(dst, reasonRef, reasonLiteral)
			} else {
				dst = append(dst, c)
			}
			i++
			continue
		}
		if c >= '0' && c <= '9' {
			if t, n, ok := parseReasonTime(reason[i:]); ok {
				dst = append(dst, reasonRef, reasonTimeRef)
				dst = binary.AppendVarint(dst, t-base)
				i += n
				continue
			}
		}
		if starts[c] {
			k, n := matchID(reason[i:], dict)
			// A quoted id the dictionary matched (n > 0 at a double
			// quote) is the whole quoted text there: an id holds no
			// double quote or backslash (plainID), so the quote closes
			// right after it and quotedAt would find no longer one.
			if c == '"' && vals != nil && n == 0 {
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

// matchID finds the longest dictionary id (bare, or quoted) that s starts
// with, and returns its reference and length (0 when none).
func matchID(s string, dict []string) (ref, n int) {
	quoted := s != "" && s[0] == '"'
	for k, id := range dict {
		if quoted && len(s) >= len(id)+2 && s[len(id)+1] == '"' && s[1:len(id)+1] == id && len(id)+2 > n {
			ref, n = 2*k+1, len(id)+2
		} else if strings.HasPrefix(s, id) && len(id) > n {
			ref, n = 2*k, len(id)
		}
	}
	return ref, n
}

// expandReason undoes compactReason.
func expandReason(b []byte, dict []string, base int64) (string, error) {
	return expandQuoted(b, dict, nil, base)
}

// expandQuoted undoes compactQuoted; vals nil refuses quoted references.
func expandQuoted(b []byte, dict []string, vals *[2]string, base int64) (string, error) {
	out := make([]byte, 0, len(b)*2)
	for i := 0; i < len(b); i++ {
		if b[i] != reasonRef {
			out = append(out, b[i])
			continue
		}
		if i+1 == len(b) {
			return "", fmt.Errorf("%w: reason ends inside a reference", ErrCorrupt)
		}
		i++
		switch ref := b[i]; {
		case ref == reasonLiteral:
			out = append(out, reasonRef)
		case ref == reasonTimeRef:
			delta, n := binary.Varint(b[i+1:])
			if n <= 0 {
				return "", fmt.Errorf("%w: malformed time in a reason", ErrCorrupt)
			}
			out = appendReasonTime(out, base+delta)
			i += n
		case ref == reasonQuotedRef && vals != nil:
			v, n := binary.Uvarint(b[i+1:])
			if n <= 0 {
				return "", fmt.Errorf("%w: malformed quoted text in a reason", ErrCorrupt)
			}
			i += n
			switch {
			case v < 2:
				out = strconv.AppendQuote(out, vals[v])
			case v-2 > uint64(len(b)-i-1):
				return "", fmt.Errorf("%w: quoted text of %d bytes past the reason's end", ErrCorrupt, v-2)
			default:
				out = strconv.AppendQuote(out, string(b[i+1:i+1+int(v-2)]))
				i += int(v - 2)
			}
		case int(ref) < 2*len(dict):
			if id := dict[ref/2]; ref%2 == 1 {
				out = append(append(append(out, '"'), id...), '"')
			} else {
				out = append(out, id...)
			}
		default:
			return "", fmt.Errorf("%w: reason refers to entry %d of %d", ErrCorrupt, ref, 2*len(dict))
		}
	}
	return string(out), nil
}

// appendReasonTime renders Unix nanoseconds as t.UTC().Format(
// time.RFC3339Nano) does, for years 0–9999, without its cost.
func appendReasonTime(dst []byte, nanos int64) []byte {
	t := time.Unix(0, nanos).UTC()
	year, month, day := t.Date()
	hour, minute, sec := t.Clock()
	if year < 0 || year > 9999 {
		return t.AppendFormat(dst, time.RFC3339Nano)
	}
	dst = appendDigits(dst, year, 4)
	dst = append(dst, '-')
	dst = appendDigits(dst, int(month), 2)
	dst = append(dst, '-')
	dst = appendDigits(dst, day, 2)
	dst = append(dst, 'T')
	dst = appendDigits(dst, hour, 2)
	dst = append(dst, ':')
	dst = appendDigits(dst, minute, 2)
	dst = append(dst, ':')
	dst = appendDigits(dst, sec, 2)
	if ns := t.Nanosecond(); ns != 0 {
		dst = append(dst, '.')
		digits := 9
		for ns%10 == 0 {
			ns /= 10
			digits--
		}
		dst = appendDigits(dst, ns, digits)
	}
	return append(dst, 'Z')
}

func appendDigits(dst []byte, v, width int) []byte {
	var buf [9]byte
	for i := width - 1; i >= 0; i-- {
		buf[i] = byte('0' + v%10)
		v /= 10
	}
	return append(dst, buf[:width]...)
}

// parseReasonTime reads a timestamp as appendReasonTime writes it at the
// start of s: its Unix nanoseconds and length. It accepts only what
// renders back to the same bytes.
func parseReasonTime(s string) (nanos int64, n int, ok bool) {
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
	n = len(layout)
	ns := 0
	trailingZero := false
	if s[n] == '.' {
		digits := 0
		for n+1+digits < len(s) && digits < 9 && s[n+1+digits] >= '0' && s[n+1+digits] <= '9' {
			digits++
		}
		if digits == 0 {
			return 0, 0, false
		}
		trailingZero = s[n+digits] == '0'
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
	year, month, day := num(0, 4), num(5, 7), num(8, 10)
	hour, minute, sec := num(11, 13), num(14, 16), num(17, 19)
	t := time.Date(year, time.Month(month), day, hour, minute, sec, ns, time.UTC)
	nanos = t.UnixNano()
	if year >= 1700 && year <= 2200 {
		// Where Unix nanoseconds hold the instant, the fields render
		// back to the same bytes exactly when none is out of its range
		// (time.Date normalises month 13 to another instant) and the
		// fraction has no trailing zero (appendReasonTime writes the
		// shortest): checked here without rendering, as every renewal's
		// reason holds three of these.
		if month < 1 || month > 12 || day < 1 || day > daysIn(month, year) ||
			hour > 23 || minute > 59 || sec > 59 || trailingZero {
			return 0, 0, false
		}
		return nanos, n, true
	}
	// Out-of-range fields (month 13) normalise to another instant, and a
	// fraction with trailing zeros renders shorter: both fail here.
	var buf [40]byte
	if string(appendReasonTime(buf[:0], nanos)) != s[:n] {
		return 0, 0, false
	}
	return nanos, n, true
}

// daysIn is the number of days of month (1–12) in year.
func daysIn(month, year int) int {
	switch month {
	case 2:
		if year%4 == 0 && (year%100 != 0 || year%400 == 0) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}
