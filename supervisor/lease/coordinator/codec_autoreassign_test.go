package coordinator

import (
	"testing"

	"github.com/tetherhq/tether/supervisor/lease"
)

// Records and anchor rows written before Lease.AutoReassigns existed
// (lease schema 2, anchor schema 3: the first leaseFieldsV2 fields) still
// decode, with the count 0; what is written now carries it.
func TestRecordsFromBeforeAutoReassignsStillDecode(t *testing.T) {
	l := sampleLease()
	e := encoder{b: []byte{leaseSchemaV2}}
	e.uint(42)
	for i := range leaseFieldsV2 {
		encodeField(&e, i, &l, 0)
	}
	got, err := decodeRecord(e.b)
	want := l
	want.AutoReassigns = 0
	if err != nil || got.Lease != want || got.Rows != 42 || got.Stale != nil {
		t.Fatalf("schema 2 record: %v\n got %+v\nwant %+v", err, got.Lease, want)
	}

	row := storedRow{Number: anchorEvery, Lease: l, Decision: lease.Decision{Outcome: lease.OutcomeAccepted, Event: lease.EventReassigned, Reason: "r"},
		Kind: lease.KindReassign, DecidedAt: l.IssuedAt}
	a := encoder{b: []byte{evidenceSchemaAnchorV2}}
	a.uint(row.Number)
	for i := range leaseFieldsV2 {
		encodeField(&a, i, &row.Lease, 0)
	}
	a.uint(uint64(row.Decision.Outcome))
	a.uint(uint64(row.Decision.Event))
	a.str(row.Decision.Reason)
	a.uint(uint64(row.Kind))
	a.time(row.DecidedAt)
	if !isAnchorRow(a.b) {
		t.Fatal("a schema 3 anchor is not taken for an anchor")
	}
	gotRow, err := decodeRow(lease.Lease{}, a.b)
	wantRow := row
	wantRow.Lease.AutoReassigns = 0
	if err != nil || !sameRow(gotRow, wantRow) {
		t.Fatalf("schema 3 anchor: %v\n got %+v\nwant %+v", err, gotRow, wantRow)
	}

	// What is written now keeps the count, in records and anchors.
	if r, err := decodeRecord(encodeRecord(nil, record{Lease: l, Rows: 1})); err != nil || r.Lease.AutoReassigns != 2 {
		t.Fatalf("record: %v, count %d, want 2", err, r.Lease.AutoReassigns)
	}
	anchor := encodeRowAnchor(nil, row)
	if !isAnchorRow(anchor) {
		t.Fatal("an anchor is not taken for an anchor")
	}
	if r, err := decodeRow(lease.Lease{}, anchor); err != nil || r.Lease.AutoReassigns != 2 {
		t.Fatalf("anchor: %v, count %d, want 2", err, r.Lease.AutoReassigns)
	}
}
