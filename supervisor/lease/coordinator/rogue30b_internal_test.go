package coordinator

import (
	"errors"
	"strconv"
	"testing"

	"github.com/tetherhq/tether/supervisor/lease"
)

// FuzzRogue30BReasonQuoted: compaction with quoted texts is lossless for
// any reason, ids and progress values, and a row written without quoted
// references reads the same under either schema.
func FuzzRogue30BReasonQuoted(f *testing.F) {
	f.Add(`progress gen 1 lease "l_1" from "n_w" seq 1 value "\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01" accepted (accepted "\x01")`, "l_1x", "\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01", "\x01", int64(0))
	f.Add(`"\"\\" "a\"b" "\u00e9\t" "unterminated \"`, "\"", "a\"b", "é\t", int64(-1))
	f.Add("\"\x01\xfd\x01\" \"\\xff\" \"\\U0010ffff\"", "n_n_", "", "\U0010ffff", int64(7))
	f.Fuzz(func(t *testing.T, reason, leaseID, next, prev string, base int64) {
		before, after := sampleLease(), sampleLease()
		after.LeaseID, after.ProgressValue, before.ProgressValue = leaseID, next, prev
		dict, vals := reasonDict(before, after), reasonValues(before, after)
		b, quoted := compactQuoted(nil, reason, dict, vals, base)
		got, err := expandQuoted(b, dict, vals, base)
		if err != nil || got != reason {
			t.Fatalf("%q came back as %q (%v)", reason, got, err)
		}
		if !quoted {
			if plain := compactReason(nil, reason, dict, base); string(plain) != string(b) {
				t.Fatalf("%q: without quoted references %q, compactReason %q", reason, b, plain)
			}
		}
	})
}

// A quoted reference is refused where it does not belong (a schema-2
// row) and when it runs past the reason.
func TestRogue30BQuotedReferencesAreChecked(t *testing.T) {
	vals := &[2]string{"a", "b"}
	b, quoted := compactQuoted(nil, strconv.Quote("\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0b\x0c"), nil, vals, 0)
	if !quoted {
		t.Fatalf("a quoted run of control characters compacted to %q without a reference", b)
	}
	for _, bad := range [][]byte{b, {reasonRef, reasonQuotedRef}, {reasonRef, reasonQuotedRef, 0x80}, {reasonRef, reasonQuotedRef, 9, 'x'}} {
		v := vals
		if &bad[0] == &b[0] {
			v = nil // a schema-2 row has no quoted references
		}
		if _, err := expandQuoted(bad, nil, v, 0); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%q: got %v, want ErrCorrupt", bad, err)
		}
	}
	// A row of schema 2 made schema 6 reads the same, and the reverse is
	// refused or reads otherwise, never silently as if nothing changed.
	prev := sampleLease()
	next := prev
	next.ProgressValue = "\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01"
	r := storedRow{Number: 2, Lease: next, DecidedAt: next.IssuedAt, Kind: lease.KindProgress,
		Decision: lease.Decision{Reason: "value " + strconv.Quote(next.ProgressValue) + " and " + strconv.Quote("\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02")}}
	row := encodeRow(nil, prev, r)
	if row[0] != evidenceSchemaDeltaQuoted {
		t.Fatalf("a row whose reason quotes control characters is of schema %d, want %d", row[0], evidenceSchemaDeltaQuoted)
	}
	got, err := decodeRow(prev, row)
	if err != nil || got.Decision.Reason != r.Decision.Reason {
		t.Fatalf("read back %q (%v), want %q", got.Decision.Reason, err, r.Decision.Reason)
	}
	row[0] = evidenceSchemaDelta
	if got, err := decodeRow(prev, row); err == nil && got.Decision.Reason == r.Decision.Reason {
		t.Fatal("a schema-6 row read as schema 2 reads the same")
	}
}
