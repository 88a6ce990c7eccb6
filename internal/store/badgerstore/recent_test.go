package badgerstore

import (
	"bytes"
	"testing"

	"pgregory.net/rapid"
)

// TestRecentValuesNeverStale checks the committer's memory of committed
// values against the latest state set for each key, under random sets
// (small, empty, absent and too-large values), reads and forgets, with
// small bounds and enough distinct keys to turn the generations over many
// times: a read either misses or returns the latest state, never an older
// one, and the memory stays within its bounds.
func TestRecentValuesNeverStale(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		entries := rapid.IntRange(1, 16).Draw(t, "entries")
		maxBytes := rapid.IntRange(1, 256).Draw(t, "bytes")
		maxValue := rapid.IntRange(0, 32).Draw(t, "maxValue")
		r := newRecentValues(entries, maxBytes, maxValue)
		type state struct {
			value  []byte
			absent bool
		}
		model := map[string]state{}
		keys := rapid.IntRange(1, 4*entries).Draw(t, "keys")
		ops := rapid.IntRange(1, 2000).Draw(t, "ops")
		for range ops {
			k := []byte{'k', byte(rapid.IntRange(0, keys-1).Draw(t, "key"))}
			switch rapid.IntRange(0, 9).Draw(t, "op") {
			case 0:
				r.set(k, nil, true)
				model[string(k)] = state{absent: true}
			case 1:
				v := bytes.Repeat([]byte{'L'}, maxValue+1+rapid.IntRange(0, 8).Draw(t, "extra"))
				r.set(k, v, false)
				model[string(k)] = state{value: v}
			case 2:
				if rapid.IntRange(0, 20).Draw(t, "forget") == 0 {
					r.forget()
				}
			case 3, 4, 5:
				v := []byte(rapid.StringN(0, maxValue, -1).Draw(t, "value"))
				if len(v) > maxValue {
					v = v[:maxValue]
				}
				model[string(k)] = state{value: bytes.Clone(v)}
				r.set(k, v, false)
				copy(v, bytes.Repeat([]byte{'x'}, len(v))) // the memory keeps a copy
			default:
				got, ok := r.get(k)
				if !ok {
					continue
				}
				want, known := model[string(k)]
				if !known {
					t.Fatalf("get(%q) found a value never set", k)
				}
				if got.absent != want.absent || !bytes.Equal(got.value, want.value) {
					t.Fatalf("get(%q) = %q (absent %v), want the latest, %q (absent %v)", k, got.value, got.absent, want.value, want.absent)
				}
				if len(got.value) > maxValue {
					t.Fatalf("get(%q) returned a value of %d bytes, more than the %d kept", k, len(got.value), maxValue)
				}
			}
			if n := r.len(); n > 2*entries {
				t.Fatalf("%d keys remembered, more than 2 × %d", n, entries)
			}
			if b := r.cur.bytes + r.prev.bytes; b > 2*(maxBytes+maxValue) {
				t.Fatalf("%d bytes of values remembered, more than 2 × (%d + %d)", b, maxBytes, maxValue)
			}
		}
	})
}
