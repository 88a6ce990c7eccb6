package etcdstore_test

import (
	"context"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tetherhq/tether/internal/etcdtest"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/etcdstore"
	"github.com/tetherhq/tether/internal/store/storetest"
)

// heldUpdates runs fns as concurrent Updates on s while its group commit
// is held, releases it once all of them wait in its queue, in the order
// given (so that they meet in one merged commit, as far as they may), and
// returns how many
// attempts each took.
func heldUpdates(t *testing.T, s *etcdstore.Etcd, fns ...func(tx store.Txn) error) []int {
	t.Helper()
	release := etcdstore.HoldCommits(s)
	attempts := make([]atomic.Int32, len(fns))
	errs := make([]error, len(fns))
	var wg sync.WaitGroup
	for i, fn := range fns {
		wg.Go(func() {
			errs[i] = s.Update(context.Background(), func(tx store.Txn) error {
				attempts[i].Add(1)
				return fn(tx)
			})
		})
		// In order: the queue's first is the first merged.
		for etcdstore.QueuedCommits(s) < i+1 {
			runtime.Gosched()
		}
	}
	release()
	wg.Wait()
	out := make([]int, len(fns))
	for i := range fns {
		if errs[i] != nil {
			t.Fatalf("update %d: %v", i, errs[i])
		}
		out[i] = int(attempts[i].Load())
	}
	return out
}

func getInt(t *testing.T, s store.Store, key string) int {
	t.Helper()
	var n int
	err := s.View(t.Context(), func(tx store.ReadTxn) error {
		v, err := tx.Get([]byte(key))
		if err != nil {
			return err
		}
		n, err = strconv.Atoi(string(v))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestEtcdGroupCommit plays concurrent Updates merged into one etcd
// transaction through a real etcd: independent ones go in one request and
// all land; ones that conflict with each other are never merged (etcd
// checks every nested transaction against the state before any applies,
// so merging them would lose an update); and a member whose own reads went
// stale conflicts alone, is retried, and does not fail or hold back the
// others.
func TestEtcdGroupCommit(t *testing.T) {
	cluster := etcdtest.Start(t)

	t.Run("IndependentUpdatesGoInOneRequest", func(t *testing.T) {
		s := replicas(t, cluster, 1)[0]
		w, err := s.Watch(t.Context(), []byte("k/"))
		if err != nil {
			t.Fatal(err)
		}
		before := s.Stats()
		var fns []func(store.Txn) error
		for i := range 8 {
			fns = append(fns, func(tx store.Txn) error {
				return tx.Put([]byte("k/"+strconv.Itoa(i)), []byte("v"))
			})
		}
		attempts := heldUpdates(t, s, fns...)
		after := s.Stats()
		for i, a := range attempts {
			if a != 1 {
				t.Errorf("update %d took %d attempts", i, a)
			}
		}
		if got := after.CommitRequests - before.CommitRequests; got != 1 {
			t.Errorf("8 independent Updates took %d commit requests, want 1 merged", got)
		}
		if got := after.Merged - before.Merged; got != 8 {
			t.Errorf("%d Updates went merged, want 8", got)
		}
		if keys := keysUnder(t, s, "k/"); len(keys) != 8 {
			t.Errorf("keys after the merged commit: %q", keys)
		}
		batch := <-w.Events()
		if len(batch) != 8 {
			t.Fatalf("the merged commit's watch batch holds %d events, want 8", len(batch))
		}
		for _, ev := range batch {
			if ev.Revision != batch[0].Revision {
				t.Fatalf("one merged commit delivered revisions %d and %d", batch[0].Revision, ev.Revision)
			}
		}
	})

	t.Run("ConflictingUpdatesAreNotMerged", func(t *testing.T) {
		s := replicas(t, cluster, 1)[0]
		mustPut(t, s, "n", "0", "m", "0")
		// Two increments of one key, each also writing a key of its own;
		// then a scan of a prefix against an insert into it.
		attempts := heldUpdates(t, s,
			func(tx store.Txn) error {
				if err := storetest.Increment("n")(tx); err != nil {
					return err
				}
				return tx.Put([]byte("own/a"), []byte("a"))
			},
			func(tx store.Txn) error {
				if err := storetest.Increment("n")(tx); err != nil {
					return err
				}
				return tx.Put([]byte("own/b"), []byte("b"))
			},
		)
		if got := getInt(t, s, "n"); got != 2 {
			t.Fatalf("two increments merged left n = %d: an update was lost", got)
		}
		if attempts[0]+attempts[1] != 3 {
			t.Errorf("attempts %v: the second increment should have conflicted once and been retried", attempts)
		}
		if keys := keysUnder(t, s, "own/"); len(keys) != 2 {
			t.Errorf("own keys: %q", keys)
		}

		// Write skew: each writes what the other reads. Merged, both
		// would read 0 and leave x = y = 1, which no serial order gives.
		mustPut(t, s, "x", "0", "y", "0")
		plusOne := func(from, to string) func(tx store.Txn) error {
			return func(tx store.Txn) error {
				v, err := tx.Get([]byte(from))
				if err != nil {
					return err
				}
				n, err := strconv.Atoi(string(v))
				if err != nil {
					return err
				}
				return tx.Put([]byte(to), []byte(strconv.Itoa(n+1)))
			}
		}
		heldUpdates(t, s, plusOne("x", "y"), plusOne("y", "x"))
		if x, y := getInt(t, s, "x"), getInt(t, s, "y"); x+y != 3 {
			t.Fatalf("y = x+1 and x = y+1 committed together left x = %d, y = %d: not serializable", x, y)
		}

		// The same with scans: each counts the keys of a prefix and adds
		// a key to the other's. Merged, both would count 1.
		mustPut(t, s, "p/1", "x", "q/1", "x")
		countInto := func(scanned, into string) func(tx store.Txn) error {
			return func(tx store.Txn) error {
				n := 0
				if err := tx.Scan([]byte(scanned), nil, func(_, _ []byte) error { n++; return nil }); err != nil {
					return err
				}
				return tx.Put([]byte(into), []byte(strconv.Itoa(n)))
			}
		}
		heldUpdates(t, s, countInto("p/", "q/count"), countInto("q/", "p/count"))
		if p, q := getInt(t, s, "p/count"), getInt(t, s, "q/count"); max(p, q) != 2 {
			t.Fatalf("two counts, each adding a key to the other's prefix, committed together counted %d and %d: not serializable", q, p)
		}
	})

	t.Run("AStaleMemberDoesNotFailTheOthers", func(t *testing.T) {
		stores := replicas(t, cluster, 2)
		s, other := stores[0], stores[1]
		mustPut(t, s, "a", "0", "b", "0")
		before := s.Stats()
		var once sync.Once
		attempts := heldUpdates(t, s,
			func(tx store.Txn) error {
				if err := storetest.Increment("a")(tx); err != nil {
					return err
				}
				// Another replica changes a after this attempt read it:
				// this member's comparison fails inside the merged commit.
				var err error
				once.Do(func() {
					err = other.Update(context.Background(), storetest.Increment("a"))
				})
				return err
			},
			storetest.Increment("b"),
		)
		after := s.Stats()
		if attempts[0] != 2 || attempts[1] != 1 {
			t.Errorf("attempts %v, want [2 1]: only the stale member is retried", attempts)
		}
		if a, b := getInt(t, s, "a"), getInt(t, s, "b"); a != 2 || b != 1 {
			t.Fatalf("a = %d, b = %d, want 2 and 1", a, b)
		}
		if got := after.Merged - before.Merged; got != 2 {
			t.Errorf("%d Updates went merged, want 2", got)
		}
		if got := after.CommitRequests - before.CommitRequests; got != 2 {
			t.Errorf("%d commit requests, want 2 (the merged one, then the stale member's retry)", got)
		}
	})
}

// TestEtcdFirstReadsMerged: the first reads of concurrent Views and
// Update attempts go to etcd as one request, each snapshot answered with
// its own keys, at one revision that holds every commit acknowledged
// before they began; an Update whose snapshot came from the merged read
// still commits, and one that read a key changed since conflicts and is
// retried.
func TestEtcdFirstReadsMerged(t *testing.T) {
	cluster := etcdtest.Start(t)
	s := replicas(t, cluster, 1)[0]
	for i := range 6 {
		mustPut(t, s, "r/"+strconv.Itoa(i), strconv.Itoa(i))
	}
	before := s.Stats()
	release := etcdstore.HoldReads(s)
	got := make([]string, 6)
	revs := make([]uint64, 6)
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() {
			err := s.View(context.Background(), func(tx store.ReadTxn) error {
				v, err := tx.Get([]byte("r/" + strconv.Itoa(i)))
				got[i], revs[i] = string(v), tx.Revision()
				return err
			})
			if err != nil {
				t.Error(err)
			}
		})
	}
	for etcdstore.QueuedReads(s) < 6 {
		runtime.Gosched()
	}
	release()
	wg.Wait()
	after := s.Stats()
	for i := range 6 {
		if got[i] != strconv.Itoa(i) || revs[i] != revs[0] {
			t.Fatalf("view %d read %q at revision %d (view 0 at %d)", i, got[i], revs[i], revs[0])
		}
	}
	if n := after.ReadRequests - before.ReadRequests; n != 1 {
		t.Fatalf("6 views' first reads took %d requests, want 1", n)
	}

	// Two increments whose first reads are merged: one commits, the
	// other conflicts with it and is retried; neither is lost.
	mustPut(t, s, "n", "0")
	release = etcdstore.HoldReads(s)
	for range 2 {
		wg.Go(func() {
			if err := s.Update(context.Background(), storetest.Increment("n")); err != nil {
				t.Error(err)
			}
		})
	}
	for etcdstore.QueuedReads(s) < 2 {
		runtime.Gosched()
	}
	release()
	wg.Wait()
	if n := getInt(t, s, "n"); n != 2 {
		t.Fatalf("two increments from one merged read left n = %d", n)
	}
}
