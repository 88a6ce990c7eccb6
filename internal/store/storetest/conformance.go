// Package storetest is the conformance suite for store.Store backends. Every
// backend's tests call Run; a backend is done when the suite passes under
// the race detector.
//
// The suite checks behaviour only through the Store interface. It never
// sleeps to synchronise: it waits for conditions, each bounded by a deadline
// so that a broken backend fails instead of hanging.
package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/store"
)

// waitTimeout bounds every wait for something the store must do by itself
// (deliver an event, end a watch). It is generous so that slow, loaded CI
// machines do not fail healthy backends.
const waitTimeout = 10 * time.Second

// Run runs the suite. open must return a new, empty store each time it is
// called; Run closes it at the end of the subtest (a store that is already
// closed may return nil or ErrClosed from a second Close).
func Run(t *testing.T, open func(t *testing.T) store.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s store.Store)
	}{
		{"GetPutDelete", testGetPutDelete},
		{"ValuesAreCopied", testValuesAreCopied},
		{"ReadsOwnWrites", testReadsOwnWrites},
		{"ErrorDiscardsWrites", testErrorDiscardsWrites},
		{"ScanOrderPrefixStart", testScanOrderPrefixStart},
		{"ScanStopAndError", testScanStopAndError},
		{"ScanInsideUpdate", testScanInsideUpdate},
		{"SnapshotIsolation", testSnapshotIsolation},
		{"RevisionIncreases", testRevisionIncreases},
		{"InvalidKeys", testInvalidKeys},
		{"ContextAlreadyDone", testContextAlreadyDone},
		{"WatchCommitOrderAndPrefix", testWatchCommitOrderAndPrefix},
		{"WatchStartsNow", testWatchStartsNow},
		{"WatchEndsOnCancel", testWatchEndsOnCancel},
		{"WatchThenScanHasNoGaps", testWatchThenScanHasNoGaps},
		{"WatchRevisionsUnderConcurrency", testWatchRevisionsUnderConcurrency},
		{"ConcurrentCounter", testConcurrentCounter},
		{"ConcurrentBankTransfers", testConcurrentBankTransfers},
		{"LargeTransaction", testLargeTransaction},
		{"ValueSizeLimit", testValueSizeLimit},
		{"Closed", testClosed},
		{"CloseWithUpdatesInFlight", testCloseWithUpdatesInFlight},
		{"PrefetchChangesNoAnswer", testPrefetchChangesNoAnswer},
		{"PrefetchKeepsConflictDetection", testPrefetchKeepsConflictDetection},
		{"PrefetchScansFromChangesNoAnswer", testPrefetchScansFromChangesNoAnswer},
		{"PrefetchReadsChangesNoAnswer", testPrefetchReadsChangesNoAnswer},
		{"PrefetchReadsKeepsConflictDetection", testPrefetchReadsKeepsConflictDetection},
		{"ExpectAnswers", testExpectAnswers},
		{"ExpectFencesWriters", testExpectFencesWriters},
		{"ExpectRevisionAnswers", testExpectRevisionAnswers},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := open(t)
			t.Cleanup(func() {
				if err := s.Close(); err != nil && !errors.Is(err, store.ErrClosed) {
					t.Errorf("Close: %v", err)
				}
			})
			tc.fn(t, s)
		})
	}
}

// --- helpers ---------------------------------------------------------------

type kv struct{ key, value string }

func put(t *testing.T, s store.Store, pairs ...string) {
	t.Helper()
	if len(pairs)%2 != 0 {
		t.Fatalf("put: odd number of arguments")
	}
	err := s.Update(t.Context(), func(tx store.Txn) error {
		for i := 0; i < len(pairs); i += 2 {
			if err := tx.Put([]byte(pairs[i]), []byte(pairs[i+1])); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Update(put %q): %v", pairs, err)
	}
}

func del(t *testing.T, s store.Store, keys ...string) {
	t.Helper()
	err := s.Update(t.Context(), func(tx store.Txn) error {
		for _, k := range keys {
			if err := tx.Delete([]byte(k)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Update(delete %q): %v", keys, err)
	}
}

// get returns the committed value of key, or ok=false if it is absent.
func get(t *testing.T, s store.Store, key string) (value string, ok bool) {
	t.Helper()
	err := s.View(t.Context(), func(tx store.ReadTxn) error {
		v, err := tx.Get([]byte(key))
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		value, ok = string(v), true
		return nil
	})
	if err != nil {
		t.Fatalf("View(get %q): %v", key, err)
	}
	return value, ok
}

func wantValue(t *testing.T, s store.Store, key, want string) {
	t.Helper()
	got, ok := get(t, s, key)
	if !ok {
		t.Fatalf("key %q is absent, want %q", key, want)
	}
	if got != want {
		t.Fatalf("key %q = %q, want %q", key, got, want)
	}
}

func wantAbsent(t *testing.T, s store.Store, key string) {
	t.Helper()
	if got, ok := get(t, s, key); ok {
		t.Fatalf("key %q = %q, want absent", key, got)
	}
}

// collect scans with tx and returns what it visited.
func collect(tx store.ReadTxn, prefix, start string) ([]kv, error) {
	var out []kv
	var startKey []byte
	if start != "" {
		startKey = []byte(start)
	}
	err := tx.Scan([]byte(prefix), startKey, func(k, v []byte) error {
		out = append(out, kv{string(k), string(v)})
		return nil
	})
	return out, err
}

func scan(t *testing.T, s store.Store, prefix, start string) []kv {
	t.Helper()
	var out []kv
	err := s.View(t.Context(), func(tx store.ReadTxn) error {
		var err error
		out, err = collect(tx, prefix, start)
		return err
	})
	if err != nil {
		t.Fatalf("View(scan %q from %q): %v", prefix, start, err)
	}
	return out
}

func revision(t *testing.T, s store.Store) uint64 {
	t.Helper()
	var rev uint64
	if err := s.View(t.Context(), func(tx store.ReadTxn) error {
		rev = tx.Revision()
		return nil
	}); err != nil {
		t.Fatalf("View(revision): %v", err)
	}
	return rev
}

func wantKVs(t *testing.T, what string, got []kv, want ...kv) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("%s:\n got  %q\n want %q", what, got, want)
	}
}

func keysOf(pairs []kv) []string {
	out := make([]string, len(pairs))
	for i, p := range pairs {
		out[i] = p.key
	}
	return out
}

func watch(t *testing.T, s store.Store, ctx context.Context, prefix string) store.Watcher {
	t.Helper()
	w, err := s.Watch(ctx, []byte(prefix))
	if err != nil {
		t.Fatalf("Watch(%q): %v", prefix, err)
	}
	return w
}

// nextBatch waits for the watcher's next batch of events.
func nextBatch(t *testing.T, w store.Watcher) []store.Event {
	t.Helper()
	select {
	case batch, ok := <-w.Events():
		if !ok {
			t.Fatalf("watch ended early: %v", w.Err())
		}
		if len(batch) == 0 {
			t.Fatalf("watch delivered an empty batch")
		}
		return batch
	case <-time.After(waitTimeout):
		t.Fatalf("no watch event within %v", waitTimeout)
		return nil
	}
}

// waitEnded drains the watcher until its channel closes and returns Err.
func waitEnded(t *testing.T, w store.Watcher) error {
	t.Helper()
	deadline := time.After(waitTimeout)
	for {
		select {
		case _, ok := <-w.Events():
			if !ok {
				return w.Err()
			}
		case <-deadline:
			t.Fatalf("watch did not end within %v", waitTimeout)
		}
	}
}

// eventString renders an event without its revision, for comparisons
// that do not depend on the order of events inside one transaction.
func eventString(ev store.Event) string {
	if ev.Type == store.EventDelete {
		if ev.Value != nil {
			return fmt.Sprintf("delete %s with a value %q", ev.Key, ev.Value)
		}
		return fmt.Sprintf("delete %s", ev.Key)
	}
	return fmt.Sprintf("%s %s=%s", ev.Type, ev.Key, ev.Value)
}

// wantBatch checks that batch is one transaction at revision rev with
// exactly the given events (in any order).
func wantBatch(t *testing.T, batch []store.Event, rev uint64, want ...string) {
	t.Helper()
	got := make([]string, len(batch))
	for i, ev := range batch {
		got[i] = eventString(ev)
		if ev.Revision != rev {
			t.Errorf("event %s has revision %d, want %d", got[i], ev.Revision, rev)
		}
	}
	slices.Sort(got)
	want = slices.Clone(want)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("watch batch:\n got  %q\n want %q", got, want)
	}
}

// --- basic reads and writes -------------------------------------------------

func testGetPutDelete(t *testing.T, s store.Store) {
	wantAbsent(t, s, "a")
	err := s.View(t.Context(), func(tx store.ReadTxn) error {
		_, err := tx.Get([]byte("a"))
		return err
	})
	if !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get of a missing key: %v, want ErrNotFound", err)
	}

	put(t, s, "a", "1")
	wantValue(t, s, "a", "1")
	put(t, s, "a", "2")
	wantValue(t, s, "a", "2")

	put(t, s, "empty", "")
	err = s.View(t.Context(), func(tx store.ReadTxn) error {
		v, err := tx.Get([]byte("empty"))
		if err != nil {
			return err
		}
		if len(v) != 0 {
			return fmt.Errorf("empty value read back as %q", v)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("a key with an empty value must exist: %v", err)
	}

	del(t, s, "a")
	wantAbsent(t, s, "a")
	// Deleting what is not there is not an error.
	del(t, s, "a", "never-written")
	wantValue(t, s, "empty", "")
}

func testValuesAreCopied(t *testing.T, s store.Store) {
	value := []byte("original")
	key := []byte("k")
	if err := s.Update(t.Context(), func(tx store.Txn) error { return tx.Put(key, value) }); err != nil {
		t.Fatal(err)
	}
	// The caller may reuse its buffers once Update has returned.
	copy(value, "XXXXXXXX")
	copy(key, "j")
	wantValue(t, s, "k", "original")
	wantAbsent(t, s, "j")

	// Get hands out slices the caller owns.
	err := s.View(t.Context(), func(tx store.ReadTxn) error {
		v, err := tx.Get([]byte("k"))
		if err != nil {
			return err
		}
		copy(v, "YYYYYYYY")
		v2, err := tx.Get([]byte("k"))
		if err != nil {
			return err
		}
		if string(v2) != "original" {
			return fmt.Errorf("writing to a slice from Get changed the store: %q", v2)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	err = s.Update(t.Context(), func(tx store.Txn) error {
		if err := tx.Put([]byte("k2"), []byte("abc")); err != nil {
			return err
		}
		v, err := tx.Get([]byte("k2"))
		if err != nil {
			return err
		}
		copy(v, "ZZZ")
		if v2, err := tx.Get([]byte("k2")); err != nil || string(v2) != "abc" {
			return fmt.Errorf("writing to a slice from Txn.Get changed the transaction: %q, %v", v2, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	wantValue(t, s, "k2", "abc")
}

func testReadsOwnWrites(t *testing.T, s store.Store) {
	put(t, s, "b", "old-b", "c", "old-c")
	err := s.Update(t.Context(), func(tx store.Txn) error {
		check := func(key, want string) error {
			v, err := tx.Get([]byte(key))
			if want == "" {
				if !errors.Is(err, store.ErrNotFound) {
					return fmt.Errorf("Get(%q) = %q, %v; want ErrNotFound", key, v, err)
				}
				return nil
			}
			if err != nil || string(v) != want {
				return fmt.Errorf("Get(%q) = %q, %v; want %q", key, v, err, want)
			}
			return nil
		}
		steps := []func() error{
			func() error { return tx.Put([]byte("a"), []byte("1")) },
			func() error { return check("a", "1") },
			func() error { return tx.Put([]byte("a"), []byte("2")) },
			func() error { return check("a", "2") },
			func() error { return check("b", "old-b") },
			func() error { return tx.Delete([]byte("b")) },
			func() error { return check("b", "") },
			func() error { return tx.Put([]byte("c"), []byte("new-c")) },
			func() error {
				got, err := collect(tx, "", "")
				if err != nil {
					return err
				}
				want := []kv{{"a", "2"}, {"c", "new-c"}}
				if !slices.Equal(got, want) {
					return fmt.Errorf("Scan inside the transaction = %q, want %q", got, want)
				}
				return nil
			},
			func() error { return tx.Put([]byte("b"), []byte("again")) },
			func() error { return check("b", "again") },
			func() error { return tx.Put([]byte("d"), []byte("x")) },
			func() error { return tx.Delete([]byte("d")) },
			func() error { return check("d", "") },
		}
		for i, step := range steps {
			if err := step(); err != nil {
				return fmt.Errorf("step %d: %w", i, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	wantKVs(t, "after the transaction", scan(t, s, "", ""),
		kv{"a", "2"}, kv{"b", "again"}, kv{"c", "new-c"})
}

func testErrorDiscardsWrites(t *testing.T, s store.Store) {
	put(t, s, "x", "1", "y", "1")
	before := revision(t, s)
	errBoom := errors.New("boom")
	err := s.Update(t.Context(), func(tx store.Txn) error {
		for _, step := range []error{
			tx.Put([]byte("x"), []byte("2")),
			tx.Delete([]byte("y")),
			tx.Put([]byte("z"), []byte("3")),
		} {
			if step != nil {
				return step
			}
		}
		return errBoom
	})
	if err != errBoom {
		t.Fatalf("Update returned %v, want the function's error unchanged", err)
	}
	wantKVs(t, "after a failed Update", scan(t, s, "", ""), kv{"x", "1"}, kv{"y", "1"})
	if got := revision(t, s); got != before {
		t.Fatalf("a failed Update moved the revision from %d to %d", before, got)
	}

	// Wrapped sentinels come through intact too.
	err = s.Update(t.Context(), func(tx store.Txn) error {
		_, err := tx.Get([]byte("missing"))
		return fmt.Errorf("loading: %w", err)
	})
	if !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Update returned %v, want it to wrap ErrNotFound", err)
	}

	// A failed Update leaves nothing behind for the next one.
	put(t, s, "w", "1")
	wantKVs(t, "after a later Update", scan(t, s, "", ""), kv{"w", "1"}, kv{"x", "1"}, kv{"y", "1"})
}

// --- scans ---------------------------------------------------------------------

var scanKeys = []string{"a", "a/", "a/1", "a/10", "a/2", "a/b/c", "a/\xff", "a0", "b/1", "\x01first", "\xfflast"}

func seedScanKeys(t *testing.T, s store.Store) {
	t.Helper()
	var pairs []string
	// Written in scrambled order: order must come from the store.
	for _, i := range []int{5, 2, 9, 0, 7, 3, 10, 1, 8, 4, 6} {
		pairs = append(pairs, scanKeys[i], "v"+scanKeys[i])
	}
	put(t, s, pairs...)
}

func testScanOrderPrefixStart(t *testing.T, s store.Store) {
	seedScanKeys(t, s)
	under := func(keys ...string) []kv {
		out := make([]kv, len(keys))
		for i, k := range keys {
			out[i] = kv{k, "v" + k}
		}
		return out
	}
	cases := []struct {
		prefix, start string
		want          []kv
	}{
		{"a/", "", under("a/", "a/1", "a/10", "a/2", "a/b/c", "a/\xff")},
		{"a/", "a/10", under("a/10", "a/2", "a/b/c", "a/\xff")},
		{"a/", "a/11", under("a/2", "a/b/c", "a/\xff")},
		{"a/", "0", under("a/", "a/1", "a/10", "a/2", "a/b/c", "a/\xff")}, // start before the prefix
		{"a/", "b", nil}, // start past the prefix
		{"a/b/", "", under("a/b/c")},
		{"a", "", under("a", "a/", "a/1", "a/10", "a/2", "a/b/c", "a/\xff", "a0")},
		{"nothing/", "", nil},
		{"", "", under(scanKeys[9], "a", "a/", "a/1", "a/10", "a/2", "a/b/c", "a/\xff", "a0", "b/1", "\xfflast")},
		{"", "b", under("b/1", "\xfflast")},
	}
	for _, c := range cases {
		what := fmt.Sprintf("Scan(prefix %q, start %q)", c.prefix, c.start)
		wantKVs(t, what, scan(t, s, c.prefix, c.start), c.want...)
	}
}

func testScanStopAndError(t *testing.T, s store.Store) {
	seedScanKeys(t, s)
	var visited []string
	err := s.View(t.Context(), func(tx store.ReadTxn) error {
		return tx.Scan([]byte("a/"), nil, func(k, _ []byte) error {
			visited = append(visited, string(k))
			if len(visited) == 2 {
				return store.ErrStopScan
			}
			return nil
		})
	})
	if err != nil {
		t.Fatalf("Scan stopped with ErrStopScan returned %v, want nil", err)
	}
	if want := []string{"a/", "a/1"}; !slices.Equal(visited, want) {
		t.Fatalf("Scan with ErrStopScan visited %q, want %q", visited, want)
	}

	errStop := errors.New("callback failed")
	visited = nil
	err = s.View(t.Context(), func(tx store.ReadTxn) error {
		return tx.Scan([]byte("a/"), nil, func(k, _ []byte) error {
			visited = append(visited, string(k))
			return errStop
		})
	})
	if !errors.Is(err, errStop) {
		t.Fatalf("Scan returned %v, want the callback's error", err)
	}
	if len(visited) != 1 {
		t.Fatalf("Scan went on after its callback failed: visited %q", visited)
	}
}

func testScanInsideUpdate(t *testing.T, s store.Store) {
	seedScanKeys(t, s)
	err := s.Update(t.Context(), func(tx store.Txn) error {
		for _, step := range []error{
			tx.Put([]byte("a/15"), []byte("new")),
			tx.Delete([]byte("a/2")),
			tx.Put([]byte("a/10"), []byte("changed")),
			tx.Put([]byte("a/0"), []byte("before start")),
		} {
			if step != nil {
				return step
			}
		}
		got, err := collect(tx, "a/", "a/1")
		if err != nil {
			return err
		}
		want := []kv{{"a/1", "va/1"}, {"a/10", "changed"}, {"a/15", "new"}, {"a/b/c", "va/b/c"}, {"a/\xff", "va/\xff"}}
		if !slices.Equal(got, want) {
			return fmt.Errorf("Scan inside Update:\n got  %q\n want %q", got, want)
		}
		var stoppedAt []string
		err = tx.Scan([]byte("a/"), nil, func(k, _ []byte) error {
			stoppedAt = append(stoppedAt, string(k))
			if len(stoppedAt) == 3 {
				return store.ErrStopScan
			}
			return nil
		})
		if err != nil || !slices.Equal(stoppedAt, []string{"a/", "a/0", "a/1"}) {
			return fmt.Errorf("stopped Scan inside Update visited %q, returned %v", stoppedAt, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	got := keysOf(scan(t, s, "a/", ""))
	if want := []string{"a/", "a/0", "a/1", "a/10", "a/15", "a/b/c", "a/\xff"}; !slices.Equal(got, want) {
		t.Fatalf("after the Update, keys under a/ are %q, want %q", got, want)
	}
}

func testSnapshotIsolation(t *testing.T, s store.Store) {
	put(t, s, "k", "old")
	err := s.View(t.Context(), func(tx store.ReadTxn) error {
		rev := tx.Revision()
		// Commit while the snapshot is open; it must not see the change.
		put(t, s, "k", "new", "k2", "added")
		if v, err := tx.Get([]byte("k")); err != nil || string(v) != "old" {
			return fmt.Errorf("snapshot read k = %q, %v after a later commit; want \"old\"", v, err)
		}
		if _, err := tx.Get([]byte("k2")); !errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("snapshot sees k2, written after it began (err %v)", err)
		}
		got, err := collect(tx, "k", "")
		if err != nil {
			return err
		}
		if want := []kv{{"k", "old"}}; !slices.Equal(got, want) {
			return fmt.Errorf("snapshot scan = %q, want %q", got, want)
		}
		if tx.Revision() != rev {
			return fmt.Errorf("snapshot revision moved from %d to %d", rev, tx.Revision())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	wantValue(t, s, "k", "new")
	wantValue(t, s, "k2", "added")
}

func testRevisionIncreases(t *testing.T, s store.Store) {
	r0 := revision(t, s)
	put(t, s, "a", "1")
	r1 := revision(t, s)
	put(t, s, "b", "1")
	r2 := revision(t, s)
	put(t, s, "a", "2", "b", "2")
	r3 := revision(t, s)
	if !(r0 < r1 && r1 < r2 && r2 < r3) {
		t.Fatalf("revisions after three writing Updates: %d, %d, %d, %d; want strictly increasing", r0, r1, r2, r3)
	}

	var readAt uint64
	err := s.Update(t.Context(), func(tx store.Txn) error {
		readAt = tx.Revision()
		_, err := tx.Get([]byte("a"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if readAt != r3 {
		t.Fatalf("an Update reads at revision %d, want the latest, %d", readAt, r3)
	}
	if got := revision(t, s); got != r3 {
		t.Fatalf("an Update that wrote nothing moved the revision from %d to %d", r3, got)
	}
	del(t, s, "never-written")
	if got := revision(t, s); got != r3 {
		t.Fatalf("deleting a missing key moved the revision from %d to %d", r3, got)
	}
	del(t, s, "a")
	if got := revision(t, s); got <= r3 {
		t.Fatalf("a delete left the revision at %d, want above %d", got, r3)
	}
}

func testInvalidKeys(t *testing.T, s store.Store) {
	long := string(bytes.Repeat([]byte("k"), store.MaxKeySize+1))
	for _, key := range []string{"", "\x00", "\x00rev", "\x00user", long} {
		err := s.Update(t.Context(), func(tx store.Txn) error { return tx.Put([]byte(key), []byte("v")) })
		if !errors.Is(err, store.ErrInvalidKey) {
			t.Errorf("Put(%.20q): %v, want ErrInvalidKey", key, err)
		}
		err = s.View(t.Context(), func(tx store.ReadTxn) error {
			_, err := tx.Get([]byte(key))
			return err
		})
		if !errors.Is(err, store.ErrInvalidKey) {
			t.Errorf("Get(%.20q): %v, want ErrInvalidKey", key, err)
		}
	}
	err := s.View(t.Context(), func(tx store.ReadTxn) error {
		return tx.Scan([]byte{0}, nil, func(_, _ []byte) error { return nil })
	})
	if !errors.Is(err, store.ErrInvalidKey) {
		t.Errorf("Scan of the reserved prefix: %v, want ErrInvalidKey", err)
	}
	if _, err := s.Watch(t.Context(), []byte{0}); !errors.Is(err, store.ErrInvalidKey) {
		t.Errorf("Watch of the reserved prefix: %v, want ErrInvalidKey", err)
	}
	put(t, s, string(bytes.Repeat([]byte("k"), store.MaxKeySize)), "longest key")
	// Nothing the store keeps for itself shows up in a full scan.
	if got := keysOf(scan(t, s, "", "")); len(got) != 1 || len(got[0]) != store.MaxKeySize {
		t.Fatalf("full scan found %d keys, want only the one written", len(got))
	}
}

func testContextAlreadyDone(t *testing.T, s store.Store) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	ran := false
	err := s.Update(ctx, func(tx store.Txn) error {
		ran = true
		return tx.Put([]byte("k"), []byte("v"))
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Update with a cancelled context: %v, want context.Canceled", err)
	}
	if ran {
		t.Fatalf("Update ran its function after its context was cancelled")
	}
	wantAbsent(t, s, "k")
	if err := s.View(ctx, func(store.ReadTxn) error { return nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("View with a cancelled context: %v, want context.Canceled", err)
	}
	if _, err := s.Watch(ctx, []byte("k")); !errors.Is(err, context.Canceled) {
		t.Fatalf("Watch with a cancelled context: %v, want context.Canceled", err)
	}
}

// --- watches -----------------------------------------------------------------

func testWatchCommitOrderAndPrefix(t *testing.T, s store.Store) {
	w := watch(t, s, t.Context(), "w/")
	if err := w.Err(); err != nil {
		t.Fatalf("Err of a running watch = %v, want nil", err)
	}

	put(t, s, "w/a", "1", "x/b", "1")
	r1 := revision(t, s)
	put(t, s, "x/c", "1")  // other prefix: no event
	del(t, s, "w/missing") // changes nothing: no event
	errDiscarded := errors.New("discarded")
	err := s.Update(t.Context(), func(tx store.Txn) error {
		if err := tx.Put([]byte("w/failed"), []byte("1")); err != nil {
			return err
		}
		return errDiscarded
	})
	if err != errDiscarded {
		t.Fatalf("failing Update returned %v", err)
	}
	del(t, s, "w/a")
	r2 := revision(t, s)
	put(t, s, "w/c", "3", "w/b", "2")
	r3 := revision(t, s)
	put(t, s, "w/a", "4")
	r4 := revision(t, s)

	wantBatch(t, nextBatch(t, w), r1, "put w/a=1")
	wantBatch(t, nextBatch(t, w), r2, "delete w/a")
	wantBatch(t, nextBatch(t, w), r3, "put w/b=2", "put w/c=3")
	// Anything spurious would have arrived before this.
	wantBatch(t, nextBatch(t, w), r4, "put w/a=4")
}

func testWatchStartsNow(t *testing.T, s store.Store) {
	put(t, s, "w/old", "1")
	w := watch(t, s, t.Context(), "w/")
	put(t, s, "w/new", "1")
	wantBatch(t, nextBatch(t, w), revision(t, s), "put w/new=1")
}

func testWatchEndsOnCancel(t *testing.T, s store.Store) {
	ctx, cancel := context.WithCancel(t.Context())
	w := watch(t, s, ctx, "w/")
	other := watch(t, s, t.Context(), "w/")
	cancel()
	if err := waitEnded(t, w); !errors.Is(err, context.Canceled) {
		t.Fatalf("Err after cancel = %v, want context.Canceled", err)
	}
	// Ending one watch leaves the others and the store running.
	put(t, s, "w/after", "1")
	wantBatch(t, nextBatch(t, other), revision(t, s), "put w/after=1")
}

// testWatchThenScanHasNoGaps follows the documented resume recipe (watch,
// then scan, then apply events above the scan's revision) while a writer
// runs, and checks the result equals the final state. The writer waits for
// the watch after its first third: had it finished before the watch began
// (a test goroutine descheduled for long enough on a loaded machine), the
// last write's event, which ends the test, would never come.
func testWatchThenScanHasNoGaps(t *testing.T, s store.Store) {
	const writes = 300
	started, watching := make(chan struct{}), make(chan struct{})
	writerDone := make(chan error, 1)
	go func() {
		for i := range writes {
			if i == writes/3 {
				close(started)
				select {
				case <-watching:
				case <-t.Context().Done(): // the test failed before watching
					writerDone <- t.Context().Err()
					return
				}
			}
			key := []byte("r/" + strconv.Itoa(i%17))
			err := s.Update(context.Background(), func(tx store.Txn) error {
				if i%7 == 6 {
					return tx.Delete(key)
				}
				return tx.Put(key, []byte(strconv.Itoa(i)))
			})
			if err != nil {
				writerDone <- err
				return
			}
		}
		writerDone <- s.Update(context.Background(), func(tx store.Txn) error {
			return tx.Put([]byte("r/~done"), nil)
		})
	}()
	<-started
	w := watch(t, s, t.Context(), "r/")
	close(watching)
	state := map[string]string{}
	var scanRev uint64
	err := s.View(t.Context(), func(tx store.ReadTxn) error {
		scanRev = tx.Revision()
		return tx.Scan([]byte("r/"), nil, func(k, v []byte) error {
			state[string(k)] = string(v)
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	var lastRev uint64
	for done := false; !done; {
		batch := nextBatch(t, w)
		rev := batch[0].Revision
		if rev <= lastRev {
			t.Fatalf("batch at revision %d delivered after %d: out of commit order", rev, lastRev)
		}
		lastRev = rev
		if rev <= scanRev {
			continue // already in the scan
		}
		for _, ev := range batch {
			if ev.Revision != rev {
				t.Fatalf("one transaction's events carry revisions %d and %d", rev, ev.Revision)
			}
			switch ev.Type {
			case store.EventPut:
				state[string(ev.Key)] = string(ev.Value)
			case store.EventDelete:
				delete(state, string(ev.Key))
			}
			done = done || string(ev.Key) == "r/~done"
		}
	}
	if err := <-writerDone; err != nil {
		t.Fatalf("writer: %v", err)
	}
	var rebuilt []kv
	for k, v := range state {
		rebuilt = append(rebuilt, kv{k, v})
	}
	slices.SortFunc(rebuilt, func(a, b kv) int { return bytes.Compare([]byte(a.key), []byte(b.key)) })
	wantKVs(t, "state rebuilt from scan + events vs. final state", rebuilt, scan(t, s, "r/", "")...)
}

// testWatchRevisionsUnderConcurrency checks that concurrent Updates are
// delivered in commit order, each exactly once: in a batch of its own, or,
// where the backend committed several together (etcd's group commit), in
// one batch at one revision.
func testWatchRevisionsUnderConcurrency(t *testing.T, s store.Store) {
	const writers, each = 8, 40
	w := watch(t, s, t.Context(), "c/")
	before := revision(t, s)
	updateConcurrently(t, writers, each, func(g, i int) error {
		key := fmt.Sprintf("c/%d/%d", g, i)
		return s.Update(context.Background(), func(tx store.Txn) error {
			return tx.Put([]byte(key), []byte("v"))
		})
	})
	seen := map[string]bool{}
	last := before
	for len(seen) < writers*each {
		batch := nextBatch(t, w)
		rev := batch[0].Revision
		if rev <= last {
			t.Fatalf("revision %d delivered after %d: each commit needs its own, increasing revision", rev, last)
		}
		last = rev
		for _, ev := range batch {
			if ev.Revision != rev {
				t.Fatalf("one batch carries revisions %d and %d", rev, ev.Revision)
			}
			if seen[string(ev.Key)] {
				t.Fatalf("event for %s delivered twice", ev.Key)
			}
			seen[string(ev.Key)] = true
		}
	}
	if after := revision(t, s); after != last {
		t.Fatalf("store revision %d, last event revision %d", after, last)
	}
}

// --- concurrency --------------------------------------------------------------

func testConcurrentCounter(t *testing.T, s store.Store) {
	const goroutines, increments = 64, 50
	put(t, s, "counter", "0")
	before := revision(t, s)
	incrementConcurrently(t, s, "counter", goroutines, increments, nil)
	if got := revision(t, s) - before; got != goroutines*increments {
		t.Fatalf("%d Updates advanced the revision by %d", goroutines*increments, got)
	}
}

// incrementConcurrently runs goroutines × increments read-modify-write
// Updates of the counter at key, each calling first (when not nil) before
// it reads, and checks that no increment was lost.
func incrementConcurrently(t *testing.T, s store.Store, key string, goroutines, increments int, first func(store.Txn) error) {
	t.Helper()
	updateConcurrently(t, goroutines, increments, func(_, _ int) error {
		return s.Update(context.Background(), func(tx store.Txn) error {
			if first != nil {
				if err := first(tx); err != nil {
					return err
				}
			}
			return Increment(key)(tx)
		})
	})
	wantValue(t, s, key, strconv.Itoa(goroutines*increments))
}

// Increment is an Update function that adds one to the decimal counter
// at key: a read-modify-write, for the tests that race them.
func Increment(key string) func(tx store.Txn) error {
	return func(tx store.Txn) error {
		v, err := tx.Get([]byte(key))
		if err != nil {
			return err
		}
		n, err := strconv.Atoi(string(v))
		if err != nil {
			return err
		}
		return tx.Put([]byte(key), []byte(strconv.Itoa(n+1)))
	}
}

// updateConcurrently runs update(g, i) for i from 0 to each-1 on each of
// goroutines goroutines g, a goroutine stopping at its first error, and
// fails t with the errors once all are done.
func updateConcurrently(t *testing.T, goroutines, each int, update func(g, i int) error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				if err := update(g, i); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// testConcurrentBankTransfers moves money between accounts from many
// goroutines while readers check, on every snapshot, that none is lost or
// created: a lost update or a torn read breaks the invariant.
func testConcurrentBankTransfers(t *testing.T, s store.Store) {
	const accounts, initial, movers, transfers = 10, 1000, 16, 100
	var pairs []string
	for i := range accounts {
		pairs = append(pairs, fmt.Sprintf("acct/%02d", i), strconv.Itoa(initial))
	}
	put(t, s, pairs...)

	readBalance := func(tx store.ReadTxn, key []byte) (int, error) {
		v, err := tx.Get(key)
		if err != nil {
			return 0, err
		}
		return strconv.Atoi(string(v))
	}
	checkTotal := func(tx store.ReadTxn) error {
		total, count := 0, 0
		err := tx.Scan([]byte("acct/"), nil, func(_, v []byte) error {
			n, err := strconv.Atoi(string(v))
			if err != nil {
				return err
			}
			if n < 0 {
				return fmt.Errorf("negative balance %d", n)
			}
			total += n
			count++
			return nil
		})
		if err != nil {
			return err
		}
		if total != accounts*initial || count != accounts {
			return fmt.Errorf("%d accounts hold %d, want %d accounts holding %d", count, total, accounts, accounts*initial)
		}
		return nil
	}

	stopReaders := make(chan struct{})
	var readers, wg sync.WaitGroup
	errs := make(chan error, movers+2)
	for range 2 {
		readers.Go(func() {
			for {
				select {
				case <-stopReaders:
					return
				default:
				}
				if err := s.View(context.Background(), checkTotal); err != nil {
					errs <- fmt.Errorf("reader: %w", err)
					return
				}
			}
		})
	}
	for g := range movers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 42))
			for range transfers {
				from := []byte(fmt.Sprintf("acct/%02d", rng.IntN(accounts)))
				to := []byte(fmt.Sprintf("acct/%02d", rng.IntN(accounts)))
				amount := 1 + rng.IntN(200)
				err := s.Update(context.Background(), func(tx store.Txn) error {
					if bytes.Equal(from, to) {
						return nil
					}
					a, err := readBalance(tx, from)
					if err != nil {
						return err
					}
					b, err := readBalance(tx, to)
					if err != nil {
						return err
					}
					if a < amount {
						return nil
					}
					if err := tx.Put(from, []byte(strconv.Itoa(a-amount))); err != nil {
						return err
					}
					return tx.Put(to, []byte(strconv.Itoa(b+amount)))
				})
				if err != nil {
					errs <- fmt.Errorf("transfer: %w", err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(stopReaders)
	readers.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := s.View(t.Context(), checkTotal); err != nil {
		t.Fatalf("final state: %v", err)
	}
	// Inside an Update the invariant holds too.
	if err := s.Update(t.Context(), func(tx store.Txn) error { return checkTotal(tx) }); err != nil {
		t.Fatalf("inside Update: %v", err)
	}
}

// --- sizes ------------------------------------------------------------------

func testLargeTransaction(t *testing.T, s store.Store) {
	const keys, size = 2000, 512
	value := func(i int) []byte {
		return bytes.Repeat([]byte{byte('a' + i%26)}, size)
	}
	err := s.Update(t.Context(), func(tx store.Txn) error {
		for i := range keys {
			if err := tx.Put([]byte(fmt.Sprintf("big/%05d", i)), value(i)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Update writing %d keys: %v", keys, err)
	}
	got := scan(t, s, "big/", "")
	if len(got) != keys {
		t.Fatalf("scan found %d keys, want %d", len(got), keys)
	}
	for i, p := range got {
		if p.key != fmt.Sprintf("big/%05d", i) || p.value != string(value(i)) {
			t.Fatalf("entry %d is %.20q=%.20q", i, p.key, p.value)
		}
	}
	// Delete them all in one transaction driven by a scan inside it.
	err = s.Update(t.Context(), func(tx store.Txn) error {
		var doomed [][]byte
		if err := tx.Scan([]byte("big/"), nil, func(k, _ []byte) error {
			doomed = append(doomed, bytes.Clone(k))
			return nil
		}); err != nil {
			return err
		}
		for _, k := range doomed {
			if err := tx.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Update deleting %d keys: %v", keys, err)
	}
	if got := scan(t, s, "big/", ""); len(got) != 0 {
		t.Fatalf("%d keys left after deleting all", len(got))
	}
}

func testValueSizeLimit(t *testing.T, s store.Store) {
	largest := bytes.Repeat([]byte("v"), store.MaxValueSize)
	if err := s.Update(t.Context(), func(tx store.Txn) error { return tx.Put([]byte("max"), largest) }); err != nil {
		t.Fatalf("Put of a value of MaxValueSize: %v", err)
	}
	got, ok := get(t, s, "max")
	if !ok || got != string(largest) {
		t.Fatalf("value of MaxValueSize did not read back (present %v, %d bytes)", ok, len(got))
	}
	err := s.Update(t.Context(), func(tx store.Txn) error {
		if err := tx.Put([]byte("small"), []byte("v")); err != nil {
			return err
		}
		return tx.Put([]byte("huge"), append(largest, 'x'))
	})
	if !errors.Is(err, store.ErrTooLarge) {
		t.Fatalf("Put of a value over MaxValueSize: %v, want ErrTooLarge", err)
	}
	wantAbsent(t, s, "huge")
	wantAbsent(t, s, "small")
}

// --- closing -----------------------------------------------------------------

func testClosed(t *testing.T, s store.Store) {
	put(t, s, "k", "v")
	w := watch(t, s, t.Context(), "")
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := waitEnded(t, w); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("watch Err after Close = %v, want ErrClosed", err)
	}
	if err := s.View(t.Context(), func(store.ReadTxn) error { return nil }); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("View after Close: %v, want ErrClosed", err)
	}
	ran := false
	err := s.Update(t.Context(), func(store.Txn) error { ran = true; return nil })
	if !errors.Is(err, store.ErrClosed) || ran {
		t.Fatalf("Update after Close: %v (ran %v), want ErrClosed without running", err, ran)
	}
	if _, err := s.Watch(t.Context(), []byte("k")); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Watch after Close: %v, want ErrClosed", err)
	}
}

// testCloseWithUpdatesInFlight closes the store under writers: every Update
// must either succeed or fail with ErrClosed, and none may hang.
func testCloseWithUpdatesInFlight(t *testing.T, s store.Store) {
	const writers = 16
	results := make(chan error, writers)
	progress := make(chan struct{}, writers)
	for g := range writers {
		go func() {
			for i := 0; ; i++ {
				err := s.Update(context.Background(), func(tx store.Txn) error {
					return tx.Put([]byte(fmt.Sprintf("w/%d", g)), []byte(strconv.Itoa(i)))
				})
				if err != nil {
					results <- err
					return
				}
				if i == 0 {
					progress <- struct{}{}
				}
			}
		}()
	}
	// Close once every writer has committed at least once.
	for range writers {
		<-progress
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	deadline := time.After(waitTimeout)
	for range writers {
		select {
		case err := <-results:
			if !errors.Is(err, store.ErrClosed) {
				t.Errorf("Update racing Close failed with %v, want ErrClosed", err)
			}
		case <-deadline:
			t.Fatalf("Updates still blocked %v after Close", waitTimeout)
		}
	}
}

// testPrefetchChangesNoAnswer: reads after Prefetch return exactly what
// they return without it — present and absent keys, scans of short and
// long prefixes (longer than a backend's page), in View and in Update
// (where the transaction's own writes still win).
func testPrefetchChangesNoAnswer(t *testing.T, s store.Store) {
	seedScanKeys(t, s)
	var long []string
	for i := range 700 {
		long = append(long, fmt.Sprintf("long/%04d", i), strconv.Itoa(i))
	}
	put(t, s, long...)
	keys := [][]byte{[]byte("a/1"), []byte("a/2"), []byte("absent"), []byte("a/b/c"), []byte("long/0699"), []byte("a/1")}
	prefixes := [][]byte{[]byte("a/"), []byte("long/"), []byte("nothing/"), []byte("")}
	read := func(tx store.ReadTxn) (string, error) {
		var out strings.Builder
		for _, k := range keys {
			v, err := tx.Get(k)
			switch {
			case errors.Is(err, store.ErrNotFound):
				fmt.Fprintf(&out, "%s absent; ", k)
			case err != nil:
				return "", err
			default:
				fmt.Fprintf(&out, "%s=%s; ", k, v)
			}
		}
		for _, p := range prefixes {
			got, err := collect(tx, string(p), "")
			if err != nil {
				return "", err
			}
			fmt.Fprintf(&out, "scan %q: %d keys %v; ", p, len(got), got[:min(3, len(got))])
		}
		return out.String(), nil
	}
	plain, prefetched := readPlainAndPrefetched(t, s, read, func(tx store.ReadTxn) error { return store.Prefetch(tx, keys, prefixes) })
	if plain != prefetched {
		t.Fatalf("View reads differ after Prefetch:\n plain      %s\n prefetched %s", plain, prefetched)
	}
	if !strings.Contains(plain, "scan \"long/\": 700 keys") {
		t.Fatalf("the long scan was cut short: %s", plain)
	}

	// In an Update, the transaction's own writes win over what was
	// prefetched, whichever came first.
	err := s.Update(context.Background(), func(tx store.Txn) error {
		if err := tx.Put([]byte("a/1"), []byte("mine")); err != nil {
			return err
		}
		if err := tx.Delete([]byte("long/0003")); err != nil {
			return err
		}
		if err := store.Prefetch(tx, keys, prefixes); err != nil {
			return err
		}
		if err := tx.Put([]byte("a/2"), []byte("mine too")); err != nil {
			return err
		}
		for k, want := range map[string]string{"a/1": "mine", "a/2": "mine too", "a/b/c": "va/b/c"} {
			if v, err := tx.Get([]byte(k)); err != nil || string(v) != want {
				return fmt.Errorf("Get(%s) after Prefetch = %q, %v; want %q", k, v, err, want)
			}
		}
		got, err := collect(tx, "long/", "")
		if err != nil {
			return err
		}
		if len(got) != 699 || got[3].key != "long/0004" {
			return fmt.Errorf("scan of long/ inside the Update: %d keys, the fourth %v; want 699 without long/0003", len(got), got[3])
		}
		return store.Prefetch(tx, [][]byte{[]byte("\x00reserved")}, nil)
	})
	if !errors.Is(err, store.ErrInvalidKey) {
		t.Fatalf("Prefetch of an invalid key: %v, want ErrInvalidKey (and nothing written)", err)
	}
	wantValue(t, s, "a/1", "va/1")
	wantValue(t, s, "long/0003", "3")
}

// testPrefetchKeepsConflictDetection: concurrent read-modify-write Updates
// that prefetch what they read lose no increment — an attempt whose
// prefetched read went stale is run again, from fresh reads, as without
// Prefetch.
func testPrefetchKeepsConflictDetection(t *testing.T, s store.Store) {
	put(t, s, "x", "0")
	incrementConcurrently(t, s, "x", 16, 20, func(tx store.Txn) error {
		return store.Prefetch(tx, [][]byte{[]byte("x"), []byte("unread")}, [][]byte{[]byte("x")})
	})
}

// testExpectAnswers: Expect answers as a read compared with the wanted
// value would, in Views and in Updates, including when the answer is
// false (a backend that deferred the comparison to the commit runs the
// function again and then answers false) and when the key was written by
// the transaction itself.
func testExpectAnswers(t *testing.T, s store.Store) {
	put(t, s, "token", "7", "empty", "")
	cases := []struct {
		key  string
		want []byte
		ok   bool
	}{
		{"token", []byte("7"), true},
		{"token", []byte("8"), false},
		{"token", nil, false},
		{"token", []byte{}, false},
		{"empty", []byte{}, true},
		{"empty", nil, false},
		{"absent", nil, true},
		{"absent", []byte{}, false},
		{"absent", []byte("7"), false},
	}
	for _, c := range cases {
		name := fmt.Sprintf("Expect(%s, %q)", c.key, c.want)
		if c.want == nil {
			name = fmt.Sprintf("Expect(%s, absent)", c.key)
		}
		var got bool
		if err := s.View(t.Context(), func(tx store.ReadTxn) (err error) {
			got, err = store.Expect(tx, []byte(c.key), c.want)
			return err
		}); err != nil || got != c.ok {
			t.Fatalf("View: %s = %v, %v; want %v", name, got, err, c.ok)
		}
		// In an Update that writes what it concluded: the value written
		// must follow the final answer, and a false answer must not let
		// the write of a true one through.
		if err := s.Update(t.Context(), func(tx store.Txn) (err error) {
			got, err = store.Expect(tx, []byte(c.key), c.want)
			if err != nil {
				return err
			}
			return tx.Put([]byte("concluded"), []byte(strconv.FormatBool(got)))
		}); err != nil || got != c.ok {
			t.Fatalf("Update: %s = %v, %v; want %v", name, got, err, c.ok)
		}
		wantValue(t, s, "concluded", strconv.FormatBool(c.ok))
		// In an Update that writes nothing.
		if err := s.Update(t.Context(), func(tx store.Txn) (err error) {
			got, err = store.Expect(tx, []byte(c.key), c.want)
			return err
		}); err != nil || got != c.ok {
			t.Fatalf("read-only Update: %s = %v, %v; want %v", name, got, err, c.ok)
		}
	}
	// The transaction's own writes are what Expect compares with, and a
	// write after Expect does not change what Expect saw.
	err := s.Update(t.Context(), func(tx store.Txn) error {
		if ok, err := store.Expect(tx, []byte("token"), []byte("7")); err != nil || !ok {
			return fmt.Errorf("Expect(token, 7) before writing = %v, %v", ok, err)
		}
		if err := tx.Put([]byte("token"), []byte("8")); err != nil {
			return err
		}
		if ok, err := store.Expect(tx, []byte("token"), []byte("8")); err != nil || !ok {
			return fmt.Errorf("Expect(token, 8) after writing 8 = %v, %v", ok, err)
		}
		if err := tx.Delete([]byte("empty")); err != nil {
			return err
		}
		if ok, err := store.Expect(tx, []byte("empty"), nil); err != nil || !ok {
			return fmt.Errorf("Expect(empty, absent) after deleting it = %v, %v", ok, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	wantValue(t, s, "token", "8")
	wantAbsent(t, s, "empty")
	err = s.Update(t.Context(), func(tx store.Txn) error {
		_, err := store.Expect(tx, []byte("\x00reserved"), nil)
		return err
	})
	if !errors.Is(err, store.ErrInvalidKey) {
		t.Fatalf("Expect of a reserved key: %v, want ErrInvalidKey", err)
	}
}

// testExpectRevisionAnswers: on a backend whose Updates implement
// store.RevisionExpecter, ExpectRevision answers whether the key was last
// written at the revision its watch event carried — false for another
// revision (a deferred comparison that fails at the commit voids the
// attempt, and the next one answers false), for a key rewritten since with
// the same value, for a missing key and for a key the transaction wrote —
// and a write concluded from a false answer's true one never commits.
func testExpectRevisionAnswers(t *testing.T, s store.Store) {
	supported := false
	if err := s.Update(t.Context(), func(tx store.Txn) error {
		_, supported = tx.(store.RevisionExpecter)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !supported {
		t.Skip("the backend keeps no revision per key")
	}
	w := watch(t, s, t.Context(), "rev/")
	put(t, s, "rev/k", "v")
	rev := nextBatch(t, w)[0].Revision
	put(t, s, "rev/same", "v")
	first := nextBatch(t, w)[0].Revision
	put(t, s, "rev/same", "v") // the same value, a later write
	expect := func(key string, rev uint64) (answer bool, attempts int) {
		t.Helper()
		if err := s.Update(t.Context(), func(tx store.Txn) (err error) {
			attempts++
			answer, err = tx.(store.RevisionExpecter).ExpectRevision([]byte(key), rev)
			if err != nil {
				return err
			}
			return tx.Put([]byte("rev-concluded"), []byte(strconv.FormatBool(answer)))
		}); err != nil {
			t.Fatalf("ExpectRevision(%s, %d): %v", key, rev, err)
		}
		wantValue(t, s, "rev-concluded", strconv.FormatBool(answer))
		return answer, attempts
	}
	if ok, _ := expect("rev/k", rev); !ok {
		t.Errorf("ExpectRevision(k, the revision that wrote it) = false, want true")
	}
	for _, c := range []struct {
		key string
		rev uint64
	}{{"rev/k", rev + 1}, {"rev/k", rev - 1}, {"rev/same", first}, {"rev/absent", rev}, {"rev/k", 0}} {
		if ok, _ := expect(c.key, c.rev); ok {
			t.Errorf("ExpectRevision(%s, %d) = true, want false", c.key, c.rev)
		}
	}
	if err := s.Update(t.Context(), func(tx store.Txn) error {
		if err := tx.Put([]byte("rev/k"), []byte("w")); err != nil {
			return err
		}
		ok, err := tx.(store.RevisionExpecter).ExpectRevision([]byte("rev/k"), rev)
		if err == nil && ok {
			err = errors.New("ExpectRevision of a key the transaction wrote = true, want false")
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	err := s.Update(t.Context(), func(tx store.Txn) error {
		_, err := tx.(store.RevisionExpecter).ExpectRevision([]byte("\x00reserved"), rev)
		return err
	})
	if !errors.Is(err, store.ErrInvalidKey) {
		t.Fatalf("ExpectRevision of a reserved key: %v, want ErrInvalidKey", err)
	}
}

// testExpectFencesWriters plays fencing: writers count under the token
// they hold (Expect(token, theirs), then increment count/<theirs>), while
// a fencer moves the token on and, in the same Update, freezes the count
// of the token it retires. A writer whose Expect was true must have
// committed while its token was current, so no count may move after it
// was frozen — an Expect that were not checked at the commit would let a
// writer that started before the move commit after it.
func testExpectFencesWriters(t *testing.T, s store.Store) {
	const writers, moves = 8, 30
	put(t, s, "token", "0")
	var token atomic.Int64
	done := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, writers+1)
	// progress gets a tick per finished writer Update (dropped when full).
	progress := make(chan struct{}, writers)
	for range writers {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				mine := strconv.FormatInt(token.Load(), 10)
				err := s.Update(context.Background(), func(tx store.Txn) error {
					ok, err := store.Expect(tx, []byte("token"), []byte(mine))
					if err != nil || !ok {
						return err
					}
					n := 0
					v, err := tx.Get([]byte("count/" + mine))
					switch {
					case errors.Is(err, store.ErrNotFound):
					case err != nil:
						return err
					default:
						if n, err = strconv.Atoi(string(v)); err != nil {
							return err
						}
					}
					return tx.Put([]byte("count/"+mine), []byte(strconv.Itoa(n+1)))
				})
				if err != nil {
					errs <- err
					return
				}
				select {
				case progress <- struct{}{}:
				default:
				}
			}
		})
	}
	wg.Go(func() {
		defer close(done)
		for i := range moves {
			// Let the writers commit under this token before it moves.
			for range writers {
				select {
				case <-progress:
				case <-time.After(waitTimeout):
					errs <- fmt.Errorf("no writer finished an Update within %v", waitTimeout)
					return
				}
			}
			err := s.Update(context.Background(), func(tx store.Txn) error {
				old := strconv.Itoa(i)
				if v, err := tx.Get([]byte("token")); err != nil || string(v) != old {
					return fmt.Errorf("token = %q, %v; want %s", v, err, old)
				}
				v, err := tx.Get([]byte("count/" + old))
				if errors.Is(err, store.ErrNotFound) {
					v, err = []byte("0"), nil
				}
				if err != nil {
					return err
				}
				if err := tx.Put([]byte("frozen/"+old), v); err != nil {
					return err
				}
				return tx.Put([]byte("token"), []byte(strconv.Itoa(i+1)))
			})
			if err != nil {
				errs <- err
				return
			}
			token.Store(int64(i + 1))
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for i := range moves {
		frozen, _ := get(t, s, "frozen/"+strconv.Itoa(i))
		count, _ := get(t, s, "count/"+strconv.Itoa(i))
		if count == "" {
			count = "0"
		}
		if frozen != count {
			t.Fatalf("token %d: %s increments were counted, but it was frozen at %s: a writer committed under a retired token", i, count, frozen)
		}
	}
}

// testPrefetchScansFromChangesNoAnswer: scans that start inside their
// prefix read the same with their first pages prefetched, in a View and in
// an Update (where the transaction's own writes still win), including a
// scan longer than one page and starts past the end.
func testPrefetchScansFromChangesNoAnswer(t *testing.T, s store.Store) {
	var pairs []string
	for i := range 700 {
		pairs = append(pairs, fmt.Sprintf("rows/a/%04d", i), strconv.Itoa(i))
	}
	for i := range 5 {
		pairs = append(pairs, fmt.Sprintf("rows/b/%04d", i), strconv.Itoa(i))
	}
	put(t, s, pairs...)
	scans := []store.ScanFrom{
		{Prefix: []byte("rows/a/"), Start: []byte("rows/a/0100")},
		{Prefix: []byte("rows/a/"), Start: []byte("rows/a/0699")},
		{Prefix: []byte("rows/b/"), Start: []byte("rows/b/0003")},
		{Prefix: []byte("rows/b/"), Start: []byte("rows/b/9999")},
		{Prefix: []byte("rows/b/"), Start: nil},
		{Prefix: []byte("rows/c/"), Start: []byte("rows/c/0001")},
	}
	read := func(tx store.ReadTxn) (string, error) {
		var out strings.Builder
		for _, sc := range scans {
			got, err := collect(tx, string(sc.Prefix), string(sc.Start))
			if err != nil {
				return "", err
			}
			fmt.Fprintf(&out, "%q from %q: %d keys %v; ", sc.Prefix, sc.Start, len(got), got[:min(3, len(got))])
		}
		return out.String(), nil
	}
	plain, prefetched := readPlainAndPrefetched(t, s, read, func(tx store.ReadTxn) error { return store.PrefetchScansFrom(tx, scans) })
	if plain != prefetched {
		t.Fatalf("View reads differ after PrefetchScansFrom:\n plain      %s\n prefetched %s", plain, prefetched)
	}
	if !strings.Contains(plain, `"rows/a/" from "rows/a/0100": 600 keys`) {
		t.Fatalf("the long scan was cut short: %s", plain)
	}
	err := s.Update(t.Context(), func(tx store.Txn) error {
		if err := store.PrefetchScansFrom(tx, scans); err != nil {
			return err
		}
		if err := tx.Put([]byte("rows/b/0004"), []byte("mine")); err != nil {
			return err
		}
		got, err := collect(tx, "rows/b/", "rows/b/0003")
		if err != nil {
			return err
		}
		if len(got) != 2 || got[1] != (kv{"rows/b/0004", "mine"}) {
			return fmt.Errorf("scan of rows/b/ from 0003 inside the Update: %v; want 0003 and the transaction's own 0004", got)
		}
		return store.PrefetchScansFrom(tx, []store.ScanFrom{{Prefix: []byte("\x00reserved")}})
	})
	if !errors.Is(err, store.ErrInvalidKey) {
		t.Fatalf("PrefetchScansFrom of a reserved prefix: %v, want ErrInvalidKey (and nothing written)", err)
	}
	wantValue(t, s, "rows/b/0004", "4")
}

// testPrefetchReadsChangesNoAnswer: keys and scans prefetched together
// read as they do unprefetched, in a View and in an Update (where the
// transaction's own writes still win), and a reserved key is refused.
func testPrefetchReadsChangesNoAnswer(t *testing.T, s store.Store) {
	var pairs []string
	for i := range 600 {
		pairs = append(pairs, fmt.Sprintf("rows/a/%04d", i), strconv.Itoa(i))
	}
	put(t, s, append(pairs, "head", "h", "empty", "")...)
	keys := [][]byte{[]byte("head"), []byte("empty"), []byte("absent"), []byte("rows/a/0005")}
	scans := []store.ScanFrom{
		{Prefix: []byte("rows/a/"), Start: []byte("rows/a/0010")},
		{Prefix: []byte("rows/a/"), Start: nil},
		{Prefix: []byte("rows/c/"), Start: []byte("rows/c/0001")},
	}
	read := func(tx store.ReadTxn) (string, error) {
		var out strings.Builder
		for _, k := range keys {
			v, err := tx.Get(k)
			fmt.Fprintf(&out, "%s=%q %v; ", k, v, err)
		}
		for _, sc := range scans {
			got, err := collect(tx, string(sc.Prefix), string(sc.Start))
			if err != nil {
				return "", err
			}
			fmt.Fprintf(&out, "%q from %q: %d keys %v; ", sc.Prefix, sc.Start, len(got), got[:min(3, len(got))])
		}
		return out.String(), nil
	}
	plain, prefetched := readPlainAndPrefetched(t, s, read, func(tx store.ReadTxn) error { return store.PrefetchReads(tx, keys, scans) })
	if plain != prefetched {
		t.Fatalf("View reads differ after PrefetchReads:\n plain      %s\n prefetched %s", plain, prefetched)
	}
	if !strings.Contains(plain, `"rows/a/" from "rows/a/0010": 590 keys`) {
		t.Fatalf("the long scan was cut short: %s", plain)
	}
	err := s.Update(t.Context(), func(tx store.Txn) error {
		if err := tx.Put([]byte("head"), []byte("mine")); err != nil {
			return err
		}
		if err := store.PrefetchReads(tx, keys, scans); err != nil {
			return err
		}
		if v, err := tx.Get([]byte("head")); err != nil || string(v) != "mine" {
			return fmt.Errorf("head inside the Update after its own write: %q, %v; want mine", v, err)
		}
		return store.PrefetchReads(tx, [][]byte{[]byte("\x00reserved")}, nil)
	})
	if !errors.Is(err, store.ErrInvalidKey) {
		t.Fatalf("PrefetchReads of a reserved key: %v, want ErrInvalidKey (and nothing written)", err)
	}
	wantValue(t, s, "head", "h")
}

// testPrefetchReadsKeepsConflictDetection: as with Prefetch, concurrent
// read-modify-write Updates that prefetch what they read (and more, never
// read) with PrefetchReads lose no increment.
func testPrefetchReadsKeepsConflictDetection(t *testing.T, s store.Store) {
	put(t, s, "x", "0")
	incrementConcurrently(t, s, "x", 16, 20, func(tx store.Txn) error {
		return store.PrefetchReads(tx, [][]byte{[]byte("x"), []byte("unread")}, []store.ScanFrom{{Prefix: []byte("x")}, {Prefix: []byte("rows/"), Start: []byte("rows/5")}})
	})
}

// readPlainAndPrefetched runs read in a View, then in another View after
// prefetch, so a test can check that prefetching changes no answer.
func readPlainAndPrefetched(t *testing.T, s store.Store, read func(store.ReadTxn) (string, error), prefetch func(store.ReadTxn) error) (plain, prefetched string) {
	t.Helper()
	if err := s.View(t.Context(), func(tx store.ReadTxn) (err error) {
		plain, err = read(tx)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.View(t.Context(), func(tx store.ReadTxn) (err error) {
		if err := prefetch(tx); err != nil {
			return err
		}
		prefetched, err = read(tx)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return plain, prefetched
}
