package coordinator

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/tetherhq/tether/internal/fault"
	"github.com/tetherhq/tether/supervisor/lease"
)

// Stored records are a compact binary encoding, not protobuf or JSON: the
// shard encodes a lease and an evidence row for every message on the hot
// path, and this costs a fraction of either. Every record starts with its
// schema version; a reader refuses versions it does not know rather than
// guess (a newer binary migrates, an older one must not misread).
const (
	// leaseSchema 1 records carry the first leaseFieldsV1 fields, 2 the
	// first leaseFieldsV2; 3 (what is written now) every field; 4 (what is
	// written now for a job whose former holders sent anything) every
	// field, then the former holders' counts (record.Stale).
	// Records of schemas 3 and 4 carry the first leaseFieldsV3 fields and
	// are written for a lease not resolved by the coordinator; 5 (written
	// for one that is) every field, then the former holders' counts (a
	// count, 0 included, then each).
	leaseSchemaV1       byte = 1
	leaseSchemaV2       byte = 2
	leaseSchema         byte = 3
	leaseSchemaStale    byte = 4
	leaseSchemaResolved byte = 5
	// evidenceSchema 1 rows carry the whole lease; 2 (what is written
	// now) carry a delta against the row before (delta.go).
	evidenceSchemaFull  byte = 1
	evidenceSchemaDelta byte = 2
	// evidenceSchemaAnchor rows carry the whole lease (every field) and
	// the reason verbatim, like schema 1: every anchorEvery-th row of a
	// job is one, so a page of evidence decodes from the anchor before it
	// instead of from row 1. Anchors of schema 3 were written with the
	// first leaseFieldsV2 fields, those of schema 5 (what is written now)
	// with every field.
	evidenceSchemaAnchorV2 byte = 3
	evidenceSchemaAnchor   byte = 5 // 4 is evidenceSchemaPack
	// evidenceSchemaDeltaQuoted rows are delta rows whose reason stores
	// quoted texts by reference (delta.go, quotedRef); a delta row whose
	// reason needs none is written as schema 2, as before.
	evidenceSchemaDeltaQuoted byte = 6
	// evidenceSchemaAnchorQuoted anchors are schema-5 anchors whose reason
	// stores quoted texts by reference (compactQuoted, against the
	// anchor's own lease alone: no ids, times relative to 0); an anchor
	// whose reason needs none is written as schema 5, as before.
	evidenceSchemaAnchorQuoted byte = 7
	// Anchors of schemas 5 and 7 carry the first leaseFieldsV3 fields and
	// are written for a lease not resolved by the coordinator; those of
	// evidenceSchemaAnchorResolved and evidenceSchemaAnchorResolvedQuoted
	// (written for one that is) are schemas 5 and 7 with every field.
	evidenceSchemaAnchorResolved       byte = 8
	evidenceSchemaAnchorResolvedQuoted byte = 9
)

// isAnchorRow reports whether a stored row is an anchor (of any schema).
func isAnchorRow(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	switch b[0] {
	case evidenceSchemaAnchor, evidenceSchemaAnchorV2, evidenceSchemaAnchorQuoted, evidenceSchemaAnchorResolved, evidenceSchemaAnchorResolvedQuoted:
		return true
	}
	return false
}

// storedFields is how many lease fields a record or an anchor of l is
// written with: every field for a lease resolved by the coordinator, the
// first leaseFieldsV3 otherwise (what a binary from before
// ResolvedByCoordinator reads).
func storedFields(l lease.Lease) int {
	if l.ResolvedByCoordinator {
		return leaseFields
	}
	return leaseFieldsV3
}

// anchorEvery is how often a job's row is written whole (rows
// anchorEvery, 2·anchorEvery, …; row 1 decodes against the empty lease
// anyway): a page of evidence starting anywhere decodes at most
// anchorEvery-1 rows it does not return. Short jobs, most of them, have
// no anchor and pay nothing.
const anchorEvery = 64

// isAnchor reports whether row number n is written whole.
func isAnchor(n uint64) bool { return n%anchorEvery == 0 }

// anchorBefore is the number of the row to start decoding at to reach row
// n (n >= 1): the anchor at or before it, or row 1.
func anchorBefore(n uint64) uint64 { return max(1, n-n%anchorEvery) }

// encodeRowAnchor writes r whole (schema 5, or 7 when its reason quotes
// texts it stores by reference): it decodes without the row before it.
func encodeRowAnchor(dst []byte, r storedRow) []byte {
	at := len(dst)
	schema, quotedSchema := evidenceSchemaAnchor, evidenceSchemaAnchorQuoted
	if r.Lease.ResolvedByCoordinator {
		schema, quotedSchema = evidenceSchemaAnchorResolved, evidenceSchemaAnchorResolvedQuoted
	}
	e := encoder{b: append(dst, schema)}
	e.uint(r.Number)
	encodeLease(&e, r.Lease, storedFields(r.Lease))
	e.uint(uint64(r.Decision.Outcome))
	e.uint(uint64(r.Decision.Event))
	if reason, quoted := compactQuoted(nil, r.Decision.Reason, nil, anchorValues(r.Lease), 0); quoted {
		e.b[at] = quotedSchema
		e.uint(uint64(len(reason)))
		e.b = append(e.b, reason...)
	} else {
		e.str(r.Decision.Reason)
	}
	e.uint(uint64(r.Kind))
	e.time(r.DecidedAt)
	return e.b
}

// anchorValues are the texts an anchor's reason may quote by reference:
// its lease's progress value.
func anchorValues(l lease.Lease) *[2]string { return &[2]string{l.ProgressValue, ""} }

// ErrCorrupt is returned when a stored record cannot be decoded.
var ErrCorrupt = fault.New(fault.Internal, "coordinator: corrupt lease record")

// record is a lease as stored: the lease and how many evidence rows the
// job has (the number of the last row, which is also the record's version:
// it grows with every decision about the job).
type record struct {
	Lease lease.Lease
	Rows  uint64
	// Stale counts the messages of the job's former holders (stalefold.go),
	// in the order they first sent one.
	Stale []StaleCount
}

// Row is one evidence row as stored: its number within the job (1, 2, …)
// and the row itself, with Names.
type Row struct {
	Number uint64
	lease.EvidenceRow
	Names RowNames
}

// RowNames are whom an evidence row's reason may name beyond the matrix's
// columns, so that a reader may be shown only its own tree's part of a job:
// from the lease after the decision, the job's owner, its former holders
// and a conflict's claimant; from the lease the decision was judged
// against (none for a job's first row and the unknown-job log), its
// holder, lease id and conflict claimant — the generation a reassignment
// replaced.
type RowNames struct {
	Owner, ConflictHolder                          string
	FormerHolders                                  [lease.MaxFormerHolders]string
	PriorHolder, PriorLeaseID, PriorConflictHolder string
}

type encoder struct{ b []byte }

func (e *encoder) uint(v uint64)       { e.b = binary.AppendUvarint(e.b, v) }
func (e *encoder) int(v int64)         { e.b = binary.AppendVarint(e.b, v) }
func (e *encoder) str(s string)        { e.uint(uint64(len(s))); e.b = append(e.b, s...) }
func (e *encoder) dur(d time.Duration) { e.int(int64(d)) }
func (e *encoder) flag(v bool) {
	if v {
		e.b = append(e.b, 1)
	} else {
		e.b = append(e.b, 0)
	}
}

// time stores t as Unix nanoseconds.
func (e *encoder) time(t time.Time) { e.timeFrom(t, 0) }

// timeFrom stores t relative to base (Unix nanoseconds; 0 gives the
// absolute encoding of time): a lease's times sit close to the decision's.
// Presence comes first: the zero time.Time has no Unix nanosecond value.
func (e *encoder) timeFrom(t time.Time, base int64) {
	if t.IsZero() {
		e.b = append(e.b, 0)
		return
	}
	e.b = append(e.b, 1)
	e.int(t.UnixNano() - base)
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: truncated or malformed %s", ErrCorrupt, what)
	}
}

func (d *decoder) uint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("integer")
		return 0
	}
	d.b = d.b[n:]
	return v
}

// int reads what binary.AppendVarint wrote: a zigzag-encoded uint.
func (d *decoder) int() int64 {
	u := d.uint()
	v := int64(u >> 1)
	if u&1 != 0 {
		v = ^v
	}
	return v
}

func (d *decoder) byte1(what string) byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) == 0 {
		d.fail(what)
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) str() string {
	n := d.uint()
	if d.err != nil {
		return ""
	}
	if n > uint64(len(d.b)) {
		d.fail("string")
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

func (d *decoder) dur() time.Duration { return time.Duration(d.int()) }

func (d *decoder) flag() bool {
	switch d.byte1("flag") {
	case 0:
		return false
	case 1:
		return true
	}
	d.fail("flag")
	return false
}

func (d *decoder) time() time.Time { return d.timeFrom(0) }

func (d *decoder) timeFrom(base int64) time.Time {
	if !d.flag() {
		return time.Time{}
	}
	n := d.int()
	if d.err != nil {
		return time.Time{}
	}
	return time.Unix(0, n+base).UTC()
}

func (d *decoder) done() error {
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("%w: %d trailing bytes", ErrCorrupt, len(d.b))
	}
	return d.err
}

func encodeRecord(dst []byte, r record) []byte {
	schema := leaseSchema
	switch {
	case r.Lease.ResolvedByCoordinator:
		schema = leaseSchemaResolved
	case len(r.Stale) > 0:
		schema = leaseSchemaStale
	}
	e := encoder{b: append(dst, schema)}
	e.uint(r.Rows)
	encodeLease(&e, r.Lease, storedFields(r.Lease))
	if len(r.Stale) > 0 || schema == leaseSchemaResolved {
		e.uint(uint64(len(r.Stale)))
		for _, c := range r.Stale {
			e.str(c.Holder)
			e.uint(c.Kept)
			e.uint(c.Folded)
		}
	}
	return e.b
}

// encodeLease writes the first fields fields of l.
func encodeLease(e *encoder, l lease.Lease, fields int) {
	for i := range fields {
		encodeField(e, i, &l, 0)
	}
}

func decodeRecord(b []byte) (record, error) {
	d := decoder{b: b}
	fields := leaseFieldsV3
	v := d.byte1("schema version")
	switch {
	case d.err != nil:
		return record{}, d.err
	case v == leaseSchemaV1:
		fields = leaseFieldsV1
	case v == leaseSchemaV2:
		fields = leaseFieldsV2
	case v == leaseSchemaResolved:
		fields = leaseFields
	case v != leaseSchema && v != leaseSchemaStale:
		return record{}, fmt.Errorf("%w: lease schema version %d is not %d, %d, %d, %d or %d", ErrCorrupt, v, leaseSchemaV1, leaseSchemaV2, leaseSchema, leaseSchemaStale, leaseSchemaResolved)
	}
	var r record
	r.Rows = d.uint()
	r.Lease = decodeLease(&d, fields)
	if v == leaseSchemaStale || v == leaseSchemaResolved {
		n := d.uint()
		if n == 0 && v == leaseSchemaResolved {
			return r, d.done() // a schema-5 record may have no counts
		}
		if n == 0 || n > lease.MaxFormerHolders {
			d.fail("former holders' counts")
		}
		for range n {
			if d.err != nil {
				break
			}
			r.Stale = append(r.Stale, StaleCount{Holder: d.str(), Kept: d.uint(), Folded: d.uint()})
		}
	}
	return r, d.done()
}

// decodeLease reads the first fields fields of a full lease.
func decodeLease(d *decoder, fields int) lease.Lease {
	var l lease.Lease
	for i := range fields {
		decodeField(d, i, &l, 0)
	}
	return l
}

// storedRow is an evidence row as stored: the whole lease after the
// decision (not only the matrix's columns), so that the newest row of a job
// is also its newest lease record. The job record (record) is only a
// checkpoint, written every few decisions; loading a job takes the
// checkpoint and then the rows after it (see Coordinator.New).
type storedRow struct {
	Number    uint64
	Lease     lease.Lease
	Decision  lease.Decision
	Kind      lease.Kind
	DecidedAt time.Time
}

// encodeRow writes r as a delta against prev, the lease as it stood
// before r's decision (the previous row's lease; the empty lease for row 1
// and for the unknown-job log).
func encodeRow(dst []byte, prev lease.Lease, r storedRow) []byte {
	at := len(dst)
	e := encoder{b: append(dst, evidenceSchemaDelta)}
	e.uint(r.Number)
	e.time(r.DecidedAt)
	base := timeBase(r.DecidedAt)
	encodeLeaseDelta(&e, &prev, &r.Lease, base)
	e.uint(uint64(r.Decision.Outcome))
	e.uint(uint64(r.Decision.Event))
	e.uint(uint64(r.Kind))
	// The reason is compacted in place, after the row so far, and its
	// length put in front of it after: no buffer of its own.
	var dict [reasonDictSize]string
	mark := len(e.b)
	var quoted bool
	e.b, quoted = compactQuoted(e.b, r.Decision.Reason, appendReasonDict(dict[:0], &prev, &r.Lease), reasonValues(prev, r.Lease), base)
	if quoted {
		e.b[at] = evidenceSchemaDeltaQuoted
	}
	return insertLength(e.b, mark)
}

// insertLength puts the uvarint length of b[at:] in front of it, as
// encoder.str would have written it.
func insertLength(b []byte, at int) []byte {
	var n [binary.MaxVarintLen64]byte
	k := binary.PutUvarint(n[:], uint64(len(b)-at))
	b = append(b, n[:k]...)
	copy(b[at+k:], b[at:len(b)-k])
	copy(b[at:], n[:k])
	return b
}

// decodeRow decodes a row against prev, the lease before it (see
// encodeRow). A schema-1 or anchor row needs no prev.
func decodeRow(prev lease.Lease, b []byte) (storedRow, error) {
	d := decoder{b: b}
	var r storedRow
	switch v := d.byte1("schema version"); {
	case d.err != nil:
		return storedRow{}, d.err
	case v == evidenceSchemaFull || isAnchorRow(b):
		fields := leaseFieldsV1
		switch v {
		case evidenceSchemaAnchorV2:
			fields = leaseFieldsV2
		case evidenceSchemaAnchor, evidenceSchemaAnchorQuoted:
			fields = leaseFieldsV3
		case evidenceSchemaAnchorResolved, evidenceSchemaAnchorResolvedQuoted:
			fields = leaseFields
		}
		r.Number = d.uint()
		r.Lease = decodeLease(&d, fields)
		r.Decision.Outcome = lease.Outcome(d.uint())
		r.Decision.Event = lease.AuditEvent(d.uint())
		r.Decision.Reason = d.str()
		r.Kind = lease.Kind(d.uint())
		r.DecidedAt = d.time()
		if err := d.done(); err != nil || v != evidenceSchemaAnchorQuoted && v != evidenceSchemaAnchorResolvedQuoted {
			return r, err
		}
		var err error
		r.Decision.Reason, err = expandQuoted([]byte(r.Decision.Reason), nil, anchorValues(r.Lease), 0)
		return r, err
	case v == evidenceSchemaDelta || v == evidenceSchemaDeltaQuoted:
	default:
		return storedRow{}, fmt.Errorf("%w: evidence schema version %d is not %d, %d, %d, %d, %d, %d, %d or %d", ErrCorrupt, v, evidenceSchemaFull, evidenceSchemaDelta, evidenceSchemaAnchorV2, evidenceSchemaAnchor, evidenceSchemaDeltaQuoted, evidenceSchemaAnchorQuoted, evidenceSchemaAnchorResolved, evidenceSchemaAnchorResolvedQuoted)
	}
	r.Number = d.uint()
	r.DecidedAt = d.time()
	r.Lease = decodeLeaseDelta(&d, prev, timeBase(r.DecidedAt))
	r.Decision.Outcome = lease.Outcome(d.uint())
	r.Decision.Event = lease.AuditEvent(d.uint())
	r.Kind = lease.Kind(d.uint())
	reason := []byte(d.str())
	if err := d.done(); err != nil {
		return storedRow{}, err
	}
	var vals *[2]string
	if b[0] == evidenceSchemaDeltaQuoted {
		vals = reasonValues(prev, r.Lease)
	}
	var err error
	r.Decision.Reason, err = expandQuoted(reason, reasonDict(prev, r.Lease), vals, timeBase(r.DecidedAt))
	return r, err
}

// rowReader decodes one job's rows in order, each against the lease of
// the row before it.
type rowReader struct {
	prev lease.Lease
	// number is the last row's number; 0 before row 1.
	number uint64
}

// next decodes the row after the last one. A delta row whose number does
// not follow is refused: it would decode against the wrong lease.
func (rr *rowReader) next(b []byte) (storedRow, error) {
	r, err := decodeRow(rr.prev, b)
	if err != nil {
		return storedRow{}, err
	}
	if (b[0] == evidenceSchemaDelta || b[0] == evidenceSchemaDeltaQuoted) && r.Number != rr.number+1 {
		return storedRow{}, fmt.Errorf("%w: evidence row %d follows row %d", ErrCorrupt, r.Number, rr.number)
	}
	rr.prev, rr.number = r.Lease, r.Number
	return r, nil
}

// row renders a stored row as the evidence matrix's row (the columns of
// lease.NewEvidenceRow); before is the lease it was judged against.
func (r storedRow) row(before lease.Lease) Row {
	l := r.Lease
	names := RowNames{Owner: l.Owner, ConflictHolder: l.ConflictHolder, FormerHolders: l.FormerHolders,
		PriorHolder: before.HolderIdentity, PriorLeaseID: before.LeaseID, PriorConflictHolder: before.ConflictHolder}
	return Row{Number: r.Number, Names: names, EvidenceRow: lease.EvidenceRow{
		JobID:             l.JobID,
		LeaseID:           l.LeaseID,
		Generation:        l.Generation,
		HolderIdentity:    l.HolderIdentity,
		IssuedAt:          l.IssuedAt,
		LeaseDuration:     l.LeaseDuration,
		ExpiresAt:         l.ExpiresAt,
		AckDeadline:       l.AckDeadline,
		AckState:          l.AckState,
		RenewSequence:     l.RenewSequence,
		RenewTime:         l.RenewTime,
		ProgressSequence:  l.ProgressSequence,
		ProgressValue:     l.ProgressValue,
		CancelRequested:   l.CancelRequested,
		CancelAck:         l.CancelAck,
		TerminalResult:    l.TerminalResult,
		StaleGeneration:   l.StaleGeneration,
		LateProgress:      l.LateProgress,
		LeaseExpired:      l.LeaseExpired,
		OwnershipConflict: l.OwnershipConflict,
		Decision:          r.Decision,
		Reason:            r.Decision.Reason,
		Message:           r.Kind,
		DecidedAt:         r.DecidedAt,
	}}
}
