package coordinator

import (
	"errors"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/tetherhq/tether/supervisor/lease"
)

func sampleLease() lease.Lease {
	at := time.Date(2026, 11, 30, 12, 0, 0, 123456789, time.UTC)
	return lease.Lease{
		JobID: "job/ü", LeaseID: "l_1", Generation: 8, HolderIdentity: "n_w", IssuedAt: at, LeaseDuration: 30 * time.Second,
		ExpiresAt: at.Add(30 * time.Second), AckDeadline: at.Add(10 * time.Second), AckState: lease.AckAcked, State: lease.StateActive,
		RenewSequence: 3, RenewTime: at.Add(time.Second), ProgressSequence: 14, ProgressValue: "70%",
		CancelRequested: true, CancelRequestedAt: at.Add(2 * time.Second), TerminalDetail: "d", StaleGeneration: true,
		LateProgress: true, OwnershipConflict: true, ConflictHolder: "n_x", AcquireTime: at, LastRenewTime: at.Add(time.Second), Transitions: 7,
		Owner: "n_planner", FormerHolders: [lease.MaxFormerHolders]string{"n_a", "n_b"}, AutoReassigns: 2,
	}
}

// A record of schema 1 (written before Owner and FormerHolders existed)
// still decodes, with those fields empty.
func TestSchemaOneRecordsStillDecode(t *testing.T) {
	l := sampleLease()
	e := encoder{b: []byte{leaseSchemaV1}}
	e.uint(42)
	for i := range leaseFieldsV1 {
		encodeField(&e, i, &l, 0)
	}
	got, err := decodeRecord(e.b)
	l.Owner, l.FormerHolders, l.AutoReassigns = "", [lease.MaxFormerHolders]string{}, 0
	if err != nil || !reflect.DeepEqual(got, record{Lease: l, Rows: 42}) {
		t.Fatalf("schema 1 record: %v\n got %+v\nwant %+v", err, got, l)
	}
	bad := encodeRecord(nil, record{Lease: sampleLease(), Rows: 1})
	bad[0] = 9
	if _, err := decodeRecord(bad); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("schema 9: got %v, want ErrCorrupt", err)
	}
}

func TestRecordsRoundTrip(t *testing.T) {
	r := record{Lease: sampleLease(), Rows: 42}
	got, err := decodeRecord(encodeRecord(nil, r))
	if err != nil || !reflect.DeepEqual(got, r) {
		t.Fatalf("record round trip: %v\n got %+v\nwant %+v", err, got, r)
	}
	// A record with its former holders' counts (schema 4).
	withStale := record{Lease: sampleLease(), Rows: 7, Stale: []StaleCount{{Holder: "w1", Kept: 32, Folded: 1 << 40}, {Holder: "w3", Kept: 2}}}
	if got, err := decodeRecord(encodeRecord(nil, withStale)); err != nil || !reflect.DeepEqual(got, withStale) {
		t.Fatalf("record with counts round trip: %v\n got %+v\nwant %+v", err, got, withStale)
	}
	if _, err := decodeRecord(encodeRecord(nil, record{})); err != nil {
		t.Fatalf("the zero record: %v", err)
	}
	row := storedRow{Number: 9, Lease: sampleLease(), Decision: lease.Decision{Outcome: lease.OutcomeRejected, Event: lease.EventStaleGeneration, Reason: "stale"},
		Kind: lease.KindRenew, DecidedAt: sampleLease().IssuedAt}
	for _, prev := range []lease.Lease{{}, sampleLease(), {JobID: "other", Generation: 99, ExpiresAt: time.Unix(1, 0)}} {
		gotRow, err := decodeRow(prev, encodeRow(nil, prev, row))
		if err != nil || !sameRow(gotRow, row) {
			t.Fatalf("row round trip against %+v: %v\n got %+v\nwant %+v", prev, err, gotRow, row)
		}
		if m := gotRow.row(lease.Lease{}); m.Reason != "stale" || m.Generation != 8 || m.Message != lease.KindRenew {
			t.Fatalf("matrix row %+v", m)
		}
	}
	enc := encodeRecord(nil, withStale)
	for i := range enc {
		if _, err := decodeRecord(enc[:i]); err == nil {
			t.Fatalf("a record truncated to %d bytes decoded", i)
		}
	}
	bad := append([]byte{}, enc...)
	bad[0] = 99
	if _, err := decodeRecord(bad); err == nil {
		t.Fatal("an unknown schema version decoded")
	}
}

// FuzzDecode: the decoders never panic on arbitrary bytes, and whatever
// decodes re-encodes to the same bytes.
func FuzzDecode(f *testing.F) {
	f.Add(encodeRecord(nil, record{Lease: sampleLease(), Rows: 1}))
	f.Add(encodeRecord(nil, record{Lease: sampleLease(), Rows: 3, Stale: []StaleCount{{Holder: "w1", Kept: 32, Folded: 5}}}))
	f.Add(encodeRow(nil, lease.Lease{}, storedRow{Number: 1, Lease: sampleLease(), Kind: lease.KindAck}))
	f.Add(encodeRow(nil, sampleLease(), storedRow{Number: 2, Lease: sampleLease(), Kind: lease.KindAck,
		Decision: lease.Decision{Reason: "lease \"l_1\" at 2026-11-30T12:00:00.123456789Z \x01"}}))
	f.Add(encodeRowFull(storedRow{Number: 1, Lease: sampleLease(), Kind: lease.KindAck}))
	f.Add([]byte{1, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, err := decodeRecord(b); err == nil {
			if again, err := decodeRecord(encodeRecord(nil, r)); err != nil || !reflect.DeepEqual(again, r) {
				t.Fatalf("record does not survive re-encoding: %v", err)
			}
		}
		prev := sampleLease()
		if r, err := decodeRow(prev, b); err == nil {
			if again, err := decodeRow(prev, encodeRow(nil, prev, r)); err != nil || !sameRow(again, r) {
				t.Fatalf("row does not survive re-encoding: %v\n got %+v\nwant %+v", err, again, r)
			}
		}
	})
}

func sameRow(a, b storedRow) bool {
	// The decision's cause (behind Decision.Err) is not stored: a stored
	// rejection is read for its event and reason.
	return a.Number == b.Number && a.Lease == b.Lease && a.Kind == b.Kind && a.DecidedAt.Equal(b.DecidedAt) &&
		a.Decision.Outcome == b.Decision.Outcome && a.Decision.Event == b.Decision.Event && a.Decision.Reason == b.Decision.Reason
}

// encodeRowFull writes a row as schema 1 did (the whole lease, the reason
// verbatim): data directories written before schema 2 hold such rows.
func encodeRowFull(r storedRow) []byte {
	e := encoder{b: []byte{evidenceSchemaFull}}
	e.uint(r.Number)
	for i := range leaseFieldsV1 {
		encodeField(&e, i, &r.Lease, 0)
	}
	e.uint(uint64(r.Decision.Outcome))
	e.uint(uint64(r.Decision.Event))
	e.str(r.Decision.Reason)
	e.uint(uint64(r.Kind))
	e.time(r.DecidedAt)
	return e.b
}

// history judges a job's life through the real state machine and returns
// its rows as the shard stores them: each row's lease is the lease after
// the decision.
func history(t *testing.T) []storedRow {
	t.Helper()
	p := lease.DefaultPolicy()
	at := time.Date(2026, 11, 30, 23, 0, 0, 123456789, time.UTC)
	job := "jobs/report-7"
	var rows []storedRow
	var l lease.Lease
	step := func(m lease.Message) {
		next, d, _ := lease.Step(l, m, at, p)
		rows = append(rows, storedRow{Number: uint64(len(rows) + 1), Lease: next, Decision: d, Kind: m.Kind(), DecidedAt: at})
		l = next
		at = at.Add(1234567 * time.Microsecond)
	}
	step(lease.Offer{JobID: job, LeaseID: "l_00000000000000000001", HolderIdentity: "n_worker1", LeaseDuration: 30 * time.Second, AckTimeout: 5 * time.Second})
	claim := lease.Claim{JobID: job, LeaseID: "l_00000000000000000001", Generation: 1, HolderIdentity: "n_worker1"}
	step(lease.Ack{Claim: claim})
	for seq := range uint64(5) {
		step(lease.Renew{Claim: claim, RenewSequence: seq + 1})
	}
	step(lease.Renew{Claim: claim, RenewSequence: 5})
	step(lease.Progress{Claim: claim, ProgressSequence: 1, ProgressValue: "half \x01 done"})
	step(lease.Renew{Claim: lease.Claim{JobID: job, LeaseID: "l_bogus", Generation: 7, HolderIdentity: "n_rogue"}, RenewSequence: 9})
	step(lease.RequestCancel{JobID: job, Reason: "operator stop"})
	step(lease.CancelAck{Claim: claim})
	step(lease.Reassign{JobID: job, LeaseID: "l_00000000000000000002", HolderIdentity: "n_worker2", LeaseDuration: time.Minute, Reason: "handover"})
	at = at.Add(time.Hour)
	step(lease.Tick{JobID: job})
	step(lease.Resolve{JobID: job, Result: lease.ResultCancelled, Reason: "stopped by the operator"})
	if len(rows) != 15 {
		t.Fatalf("history has %d rows", len(rows))
	}
	return rows
}

// Every field of lease.Lease is stored: a field added to the lease without
// a case in encodeField and decodeField would be lost on a restart.
func TestEveryLeaseFieldIsStored(t *testing.T) {
	if n := reflect.TypeFor[lease.Lease]().NumField(); n != leaseFields {
		t.Fatalf("lease.Lease has %d fields, the codec stores %d", n, leaseFields)
	}
	// Each field, changed alone, makes a delta that carries it.
	full := sampleLease()
	full.CancelAck, full.CancelAckedAt = true, full.IssuedAt.Add(3*time.Second)
	full.TerminalResult, full.TerminalAt = lease.ResultCancelled, full.IssuedAt.Add(4*time.Second)
	full.UnresolvedUntil, full.LeaseExpired = full.IssuedAt.Add(time.Hour), true
	full.ResolvedByCoordinator = true
	v := reflect.ValueOf(full)
	for i := range leaseFields {
		if v.Field(i).IsZero() {
			t.Fatalf("the test lease leaves %s unset", v.Type().Field(i).Name)
		}
		var l lease.Lease
		reflect.ValueOf(&l).Elem().Field(i).Set(v.Field(i))
		got, err := decodeRow(lease.Lease{}, encodeRow(nil, lease.Lease{}, storedRow{Number: 1, Lease: l}))
		if err != nil || got.Lease != l {
			t.Fatalf("field %s: %v\n got %+v\nwant %+v", v.Type().Field(i).Name, err, got.Lease, l)
		}
	}
}

func TestDeltaRowsRoundTripAJobsHistory(t *testing.T) {
	rows := history(t)
	var stored [][]byte
	var prev lease.Lease
	deltaBytes, fullBytes := 0, 0
	for _, r := range rows {
		b := encodeRow(nil, prev, r)
		stored = append(stored, b)
		prev = r.Lease
		deltaBytes += len(b)
		fullBytes += len(encodeRowFull(r))
		if r.Kind == lease.KindRenew && r.Decision.Outcome == lease.OutcomeAccepted {
			if full := len(encodeRowFull(r)); len(b)*2 > full {
				t.Errorf("an accepted renew takes %d bytes as a delta, %d in full: want less than half", len(b), full)
			}
		}
	}
	t.Logf("%d rows: %d bytes as deltas, %d in full", len(rows), deltaBytes, fullBytes)

	var rr rowReader
	for i, b := range stored {
		got, err := rr.next(b)
		if err != nil || !sameRow(got, rows[i]) {
			t.Fatalf("row %d: %v\n got %+v\nwant %+v", i+1, err, got, rows[i])
		}
	}

	// A load starts from a checkpoint: the job record holds the lease
	// after row 8, and the rows after it decode against it.
	rr = rowReader{prev: rows[7].Lease, number: 8}
	for i := 8; i < len(rows); i++ {
		got, err := rr.next(stored[i])
		if err != nil || !sameRow(got, rows[i]) {
			t.Fatalf("row %d after the checkpoint: %v", i+1, err)
		}
	}

	// A missing row is corruption, not a silent misreading.
	rr = rowReader{}
	if _, err := rr.next(stored[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := rr.next(stored[2]); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("row 3 after row 1: got %v, want ErrCorrupt", err)
	}
}

func TestSchemaOneRowsStillDecode(t *testing.T) {
	rows := history(t)
	// An old data directory: the first rows in schema 1, then the
	// coordinator upgraded and went on in schema 2.
	var rr rowReader
	for i, r := range rows {
		b := encodeRowFull(r)
		if i >= 6 {
			b = encodeRow(nil, rows[i-1].Lease, r)
		}
		got, err := rr.next(b)
		if err != nil || !sameRow(got, r) {
			t.Fatalf("row %d: %v\n got %+v\nwant %+v", i+1, err, got, r)
		}
	}
	bad := encodeRow(nil, lease.Lease{}, rows[0])
	bad[0] = 3
	if _, err := decodeRow(lease.Lease{}, bad); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("schema 3: got %v, want ErrCorrupt", err)
	}
}

func TestReasonCompaction(t *testing.T) {
	l := sampleLease()
	dict := reasonDict(lease.Lease{}, l)
	base := timeBase(l.IssuedAt)
	for _, reason := range []string{
		"",
		"plain words only",
		`renew gen 8 lease "l_1" from "n_w" accepted at 2026-11-30T12:00:01.123456789Z: expiry 2026-11-30T12:00:30.123456789Z`,
		"\x01\x01\xff\x01\xfe",
		"ends with the escape \x01",
		`"job/ü" job/ü "n_w""n_w"n_w 30s`,
		"2026-11-30T12:00:30.123456789", // no zone: not a timestamp
		"2026-11-30T12:00:30.120Z",      // trailing zero: renders shorter
		"2026-13-30T12:00:30Z",          // month 13: another instant
		"1066-10-14T09:00:00Z 9999-12-31T23:59:59.999999999Z 0000-01-01T00:00:00Z",
		"2026-11-30T12:00:30Z2026-11-30T12:00:30.5Z",
	} {
		b := compactReason(nil, reason, dict, base)
		got, err := expandReason(b, dict, base)
		if err != nil || got != reason {
			t.Fatalf("%q: compacted to %q, expanded to %q (%v)", reason, b, got, err)
		}
	}
	long := `renew gen 8 lease "l_00000000000000000001" from "n_0000000000000001" seq 3 accepted at 2026-11-30T12:00:01.123456789Z: expiry 2026-11-30T12:00:30.123456789Z -> 2026-11-30T12:00:31.123456789Z`
	l.LeaseID, l.HolderIdentity = "l_00000000000000000001", "n_0000000000000001"
	if b := compactReason(nil, long, reasonDict(lease.Lease{}, l), base); len(b)*2 > len(long) {
		t.Fatalf("a renew's reason of %d bytes compacts to %d: %q", len(long), len(b), b)
	}
	for _, bad := range [][]byte{{reasonRef}, {'a', reasonRef, 200}, {reasonRef, reasonTimeRef}, {reasonRef, reasonTimeRef, 0x80}} {
		if _, err := expandReason(bad, dict, base); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%q: got %v, want ErrCorrupt", bad, err)
		}
	}
}

// The compactor's renderer is package lease's (time.RFC3339Nano in UTC).
func TestReasonTimeRendersAsRFC3339Nano(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 20000 {
		nanos := r.Int64N(1<<62) - 1<<61
		if i%3 == 0 {
			nanos -= nanos % int64(time.Millisecond)
		}
		if i%5 == 0 {
			nanos -= nanos % int64(time.Second)
		}
		want := time.Unix(0, nanos).UTC().Format(time.RFC3339Nano)
		if got := string(appendReasonTime(nil, nanos)); got != want {
			t.Fatalf("%d: got %s, want %s", nanos, got, want)
		}
		if back, n, ok := parseReasonTime(want + " tail"); !ok || back != nanos || n != len(want) {
			t.Fatalf("%s parsed as %d (%d bytes, %v)", want, back, n, ok)
		}
	}
}

// FuzzReason: compaction is lossless for any reason and any ids.
func FuzzReason(f *testing.F) {
	f.Add(`lease "l_1" from "n_w" at 2026-11-30T12:00:01.123456789Z`, "l_1x", "n_wx", int64(0))
	f.Add("\x01\xff\xfe", "\x01\x01\x01\x01", "\xff\xff\xff\xff", int64(-1))
	f.Fuzz(func(t *testing.T, reason, leaseID, holder string, base int64) {
		l := sampleLease()
		l.LeaseID, l.HolderIdentity = leaseID, holder
		dict := reasonDict(sampleLease(), l)
		got, err := expandReason(compactReason(nil, reason, dict, base), dict, base)
		if err != nil || got != reason {
			t.Fatalf("%q came back as %q (%v)", reason, got, err)
		}
	})
}
