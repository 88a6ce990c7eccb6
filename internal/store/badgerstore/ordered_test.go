package badgerstore

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// TestWriteSetOrder checks the ordered index of pending writes against a
// sorted copy of its keys under random inserts, overwrites and removals,
// with runs small and large enough to split many times.
func TestWriteSetOrder(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		w := newWriteSet()
		model := map[string]bool{}
		key := rapid.StringMatching(`[a-h]{0,4}`)
		ops := rapid.IntRange(1, 4000).Draw(t, "ops")
		for range ops {
			k := "k" + key.Draw(t, "key")
			if rapid.IntRange(0, 3).Draw(t, "op") == 0 {
				w.remove(k)
				delete(model, k)
			} else {
				w.set(mutation{key: []byte(k), value: []byte(k)})
				model[k] = true
			}
		}
		want := make([]string, 0, len(model))
		for k := range model {
			want = append(want, k)
		}
		slices.Sort(want)
		if w.len() != len(want) {
			t.Fatalf("len %d, want %d", w.len(), len(want))
		}
		var all []string
		w.all(func(m mutation) { all = append(all, string(m.key)) })
		if !slices.Equal(all, want) {
			t.Fatalf("all = %q, want %q", all, want)
		}
		prefix := "k" + rapid.StringMatching(`[a-d]{0,2}`).Draw(t, "prefix")
		lower := prefix + rapid.StringMatching(`[a-d]{0,2}`).Draw(t, "lower")
		var got, exp []string
		w.ascend([]byte(prefix), []byte(lower), func(m mutation) bool {
			got = append(got, string(m.key))
			return true
		})
		for _, k := range want {
			if strings.HasPrefix(k, prefix) && k >= lower {
				exp = append(exp, k)
			}
		}
		if !slices.Equal(got, exp) {
			t.Fatalf("ascend(%q, %q) = %q, want %q", prefix, lower, got, exp)
		}
		for _, run := range w.order.runs {
			if len(run) == 0 || len(run) > 2*keyRun {
				t.Fatalf("run of %d keys", len(run))
			}
		}
	})
}

// TestWriteSetSplitsRuns inserts and removes enough keys, in a scrambled
// order, that the index splits and drops runs, and checks the order.
func TestWriteSetSplitsRuns(t *testing.T) {
	const n = 20 * keyRun
	w := newWriteSet()
	for i := range n {
		k := fmt.Sprintf("k%06d", (i*7919)%n)
		w.set(mutation{key: []byte(k)})
	}
	if len(w.order.runs) < 10 {
		t.Fatalf("%d keys in %d runs: the index did not split", n, len(w.order.runs))
	}
	for i := 0; i < n; i += 2 {
		w.remove(fmt.Sprintf("k%06d", i))
	}
	var got []string
	w.ascend([]byte("k"), []byte("k001"), func(m mutation) bool {
		got = append(got, string(m.key))
		return len(got) < 3
	})
	if want := []string{"k001001", "k001003", "k001005"}; !slices.Equal(got, want) {
		t.Fatalf("ascend from k001 = %q, want %q", got, want)
	}
	var all []string
	w.all(func(m mutation) { all = append(all, string(m.key)) })
	if len(all) != n/2 || !slices.IsSorted(all) {
		t.Fatalf("%d keys left, sorted %v; want %d sorted", len(all), slices.IsSorted(all), n/2)
	}
}
