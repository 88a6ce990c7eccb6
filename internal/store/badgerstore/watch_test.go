package badgerstore

import (
	"slices"
	"strings"
	"testing"

	"github.com/tetherhq/tether/internal/store"
)

// An Update's events are in key order, so a prefix's are one run of them:
// matching returns exactly those, in order, and a watcher appending to
// what it got cannot write over the events after them.
func TestMatchingIsTheRunOfThePrefix(t *testing.T) {
	keys := []string{"c", "a/2", "b/1", "a", "a0", "a/2/x", "ab", "a/", "b/2", "a/1"}
	slices.Sort(keys)
	events := make([]store.Event, len(keys))
	for i, k := range keys {
		events[i] = store.Event{Key: []byte(k), Revision: uint64(i)}
	}
	for _, prefix := range []string{"", "a", "a/", "a/2", "a0", "b/", "b/3", "c", "d", "0"} {
		var want []string
		for _, k := range keys {
			if strings.HasPrefix(k, prefix) {
				want = append(want, k)
			}
		}
		got := matching(events, []byte(prefix))
		var gotKeys []string
		for _, ev := range got {
			gotKeys = append(gotKeys, string(ev.Key))
		}
		if !slices.Equal(gotKeys, want) {
			t.Errorf("prefix %q: got %q, want %q", prefix, gotKeys, want)
		}
		if len(got) > 0 {
			_ = append(got, store.Event{Key: []byte("overwritten")})
			for i, ev := range events {
				if string(ev.Key) != keys[i] {
					t.Fatalf("prefix %q: appending to the match overwrote event %d: %q", prefix, i, ev.Key)
				}
			}
		}
	}
	if got := matching(nil, []byte("a")); got != nil {
		t.Errorf("no events: got %v", got)
	}
}
