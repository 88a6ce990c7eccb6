package coordinator

import (
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
	}
}

func TestRecordsRoundTrip(t *testing.T) {
	r := record{Lease: sampleLease(), Rows: 42}
	got, err := decodeRecord(encodeRecord(nil, r))
	if err != nil || got != r {
		t.Fatalf("record round trip: %v\n got %+v\nwant %+v", err, got, r)
	}
	if _, err := decodeRecord(encodeRecord(nil, record{})); err != nil {
		t.Fatalf("the zero record: %v", err)
	}
	row := storedRow{Number: 9, Lease: sampleLease(), Decision: lease.Decision{Outcome: lease.OutcomeRejected, Event: lease.EventStaleGeneration, Reason: "stale"},
		Kind: lease.KindRenew, DecidedAt: sampleLease().IssuedAt}
	gotRow, err := decodeRow(encodeRow(nil, row))
	if err != nil || gotRow.Number != row.Number || gotRow.Lease != row.Lease || gotRow.Kind != row.Kind ||
		gotRow.Decision.Outcome != row.Decision.Outcome || gotRow.Decision.Event != row.Decision.Event || gotRow.Decision.Reason != "stale" || !gotRow.DecidedAt.Equal(row.DecidedAt) {
		t.Fatalf("row round trip: %v\n got %+v\nwant %+v", err, gotRow, row)
	}
	if m := gotRow.row(); m.Reason != "stale" || m.Generation != 8 || m.Message != lease.KindRenew {
		t.Fatalf("matrix row %+v", m)
	}
	enc := encodeRecord(nil, r)
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
	f.Add(encodeRow(nil, storedRow{Number: 1, Lease: sampleLease(), Kind: lease.KindAck}))
	f.Add([]byte{1, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, err := decodeRecord(b); err == nil {
			if again, err := decodeRecord(encodeRecord(nil, r)); err != nil || again != r {
				t.Fatalf("record does not survive re-encoding: %v", err)
			}
		}
		if r, err := decodeRow(b); err == nil {
			if _, err := decodeRow(encodeRow(nil, r)); err != nil {
				t.Fatalf("row does not survive re-encoding: %v", err)
			}
		}
	})
}
