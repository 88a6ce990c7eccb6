package coordinator

import (
	"reflect"
	"strconv"
	"testing"

	"github.com/tetherhq/tether/supervisor/lease"
)

// A lease's ResolvedByCoordinator is stored (records of schema 5, anchors
// of schemas 8 and 9, a delta row's bit 33), and a lease without it is
// written as before (records of schemas 3 and 4, anchors of 5 and 7), so a
// binary from before the field reads every record that does not carry it
// and refuses, rather than misreads, one that does. What was stored before
// the field existed reads false.
func TestRogue32CResolvedByCoordinatorIsStored(t *testing.T) {
	plain := sampleLease()
	resolved := sampleLease()
	resolved.State, resolved.TerminalResult, resolved.TerminalAt = lease.StateTerminal, lease.ResultFailed, resolved.IssuedAt
	resolved.ResolvedByCoordinator = true
	stale := []StaleCount{{Holder: "w1", Kept: 3}}
	for _, c := range []struct {
		what   string
		r      record
		schema byte
	}{
		{"a lease not resolved", record{Lease: plain, Rows: 4}, leaseSchema},
		{"a lease not resolved, with counts", record{Lease: plain, Rows: 4, Stale: stale}, leaseSchemaStale},
		{"a lease resolved", record{Lease: resolved, Rows: 4}, leaseSchemaResolved},
		{"a lease resolved, with counts", record{Lease: resolved, Rows: 4, Stale: stale}, leaseSchemaResolved},
	} {
		b := encodeRecord(nil, c.r)
		if b[0] != c.schema {
			t.Errorf("%s: written in schema %d, want %d", c.what, b[0], c.schema)
		}
		if got, err := decodeRecord(b); err != nil || !reflect.DeepEqual(got, c.r) {
			t.Errorf("%s: round trip %v\n got %+v\nwant %+v", c.what, err, got, c.r)
		}
	}
	for _, c := range []struct {
		what           string
		l              lease.Lease
		reason         string
		schema, quoted byte
	}{
		{"a lease not resolved", plain, "r", evidenceSchemaAnchor, evidenceSchemaAnchorQuoted},
		{"a lease resolved", resolved, "r", evidenceSchemaAnchorResolved, evidenceSchemaAnchorResolvedQuoted},
	} {
		for _, q := range []bool{false, true} {
			l := c.l
			reason, want := c.reason, c.schema
			if q {
				l.ProgressValue = "\x01\x02"
				reason, want = "progress "+strconv.Quote(l.ProgressValue), c.quoted
			}
			row := storedRow{Number: anchorEvery, Lease: l, Decision: lease.Decision{Outcome: lease.OutcomeAccepted, Event: lease.EventResolved, Reason: reason},
				Kind: lease.KindResolve, DecidedAt: l.IssuedAt}
			b := encodeRowAnchor(nil, row)
			if b[0] != want || !isAnchorRow(b) {
				t.Errorf("%s (quoted %v): anchor written in schema %d (anchor %v), want %d", c.what, q, b[0], isAnchorRow(b), want)
			}
			if got, err := decodeRow(lease.Lease{}, b); err != nil || !sameRow(got, row) {
				t.Errorf("%s (quoted %v): anchor round trip %v\n got %+v\nwant %+v", c.what, q, err, got, row)
			}
		}
	}
	// A delta row carries the field only where it changes, in bit 33.
	row := storedRow{Number: 2, Lease: resolved, Decision: lease.Decision{Outcome: lease.OutcomeAccepted, Event: lease.EventResolved, Reason: "r"}, Kind: lease.KindResolve, DecidedAt: resolved.IssuedAt}
	prev := resolved
	prev.ResolvedByCoordinator = false
	if got, err := decodeRow(prev, encodeRow(nil, prev, row)); err != nil || !got.Lease.ResolvedByCoordinator {
		t.Errorf("the resolving row: %v, resolved %v", err, got.Lease.ResolvedByCoordinator)
	}

	// A record of schema 3 and an anchor of schema 5, written before the
	// field existed, read false.
	e := encoder{b: []byte{leaseSchema}}
	e.uint(42)
	for i := range leaseFieldsV3 {
		encodeField(&e, i, &resolved, 0)
	}
	want := resolved
	want.ResolvedByCoordinator = false
	if got, err := decodeRecord(e.b); err != nil || got.Lease != want {
		t.Errorf("a schema-3 record: %v\n got %+v\nwant %+v", err, got.Lease, want)
	}
}
