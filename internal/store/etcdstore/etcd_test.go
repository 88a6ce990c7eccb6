package etcdstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tetherhq/tether/internal/etcdlocal"
	"github.com/tetherhq/tether/internal/etcdtest"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/etcdstore"
	"github.com/tetherhq/tether/internal/store/storetest"
)

func TestEtcdConformance(t *testing.T) {
	cluster := etcdtest.Start(t)
	storetest.Run(t, func(t *testing.T) store.Store {
		return etcdtest.OpenStore(t, cluster)
	})
}

// replicas opens n stores on one prefix, each with its own client: n
// control-plane replicas sharing one keyspace.
func replicas(t *testing.T, cluster *etcdlocal.Cluster, n int, mutate ...func(*etcdstore.EtcdOptions)) []*etcdstore.Etcd {
	t.Helper()
	prefix := etcdtest.Prefix(t)
	out := make([]*etcdstore.Etcd, n)
	for i := range out {
		out[i] = etcdtest.OpenStore(t, cluster, append([]func(*etcdstore.EtcdOptions){func(o *etcdstore.EtcdOptions) { o.Prefix = prefix }}, mutate...)...)
	}
	return out
}

func mustPut(t *testing.T, s store.Store, pairs ...string) {
	t.Helper()
	err := s.Update(t.Context(), func(tx store.Txn) error {
		for i := 0; i < len(pairs); i += 2 {
			if err := tx.Put([]byte(pairs[i]), []byte(pairs[i+1])); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("put %q: %v", pairs, err)
	}
}

func mustDelete(t *testing.T, s store.Store, key string) {
	t.Helper()
	if err := s.Update(t.Context(), func(tx store.Txn) error { return tx.Delete([]byte(key)) }); err != nil {
		t.Fatalf("delete %q: %v", key, err)
	}
}

// keysUnder returns the keys under prefix, committed.
func keysUnder(t *testing.T, s store.Store, prefix string) []string {
	t.Helper()
	var keys []string
	err := s.View(t.Context(), func(tx store.ReadTxn) error {
		return tx.Scan([]byte(prefix), nil, func(k, _ []byte) error {
			keys = append(keys, string(k))
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

func currentRevision(t *testing.T, s store.Store) uint64 {
	t.Helper()
	var rev uint64
	if err := s.View(t.Context(), func(tx store.ReadTxn) error { rev = tx.Revision(); return nil }); err != nil {
		t.Fatal(err)
	}
	return rev
}

// TestEtcdConcurrentIncrements has 64 goroutines, spread over two replicas
// (two stores with their own clients), increment one counter: every
// increment must survive, which takes conflict detection and retries
// within a replica and between replicas.
func TestEtcdConcurrentIncrements(t *testing.T) {
	cluster := etcdtest.Start(t)
	stores := replicas(t, cluster, 2)
	const goroutines, increments = 64, 10
	key := []byte("counter")
	mustPut(t, stores[0], "counter", "0")
	before := currentRevision(t, stores[0])

	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		s := stores[g%2]
		wg.Go(func() {
			for range increments {
				err := s.Update(context.Background(), func(tx store.Txn) error {
					v, err := tx.Get(key)
					if err != nil {
						return err
					}
					n, err := strconv.Atoi(string(v))
					if err != nil {
						return err
					}
					return tx.Put(key, []byte(strconv.Itoa(n+1)))
				})
				if err != nil {
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
	var got []byte
	if err := stores[1].View(t.Context(), func(tx store.ReadTxn) (err error) { got, err = tx.Get(key); return err }); err != nil {
		t.Fatal(err)
	}
	if want := strconv.Itoa(goroutines * increments); string(got) != want {
		t.Fatalf("counter = %s after %s increments: updates were lost", got, want)
	}
	if delta := currentRevision(t, stores[0]) - before; delta != goroutines*increments {
		t.Fatalf("%d increments advanced the revision by %d", goroutines*increments, delta)
	}
	var conflicts, exclusive uint64
	for i, s := range stores {
		st := s.Stats()
		t.Logf("replica %d: %+v", i, st)
		conflicts += st.Conflicts
		exclusive += st.Exclusive
	}
	if conflicts == 0 || exclusive == 0 {
		t.Fatalf("64 goroutines on one key caused %d conflicts and %d exclusive retries; the test did not exercise retries", conflicts, exclusive)
	}
}

// interleave runs fn as an Update on s; during its first attempt, after
// fn's reads, other (on another replica) commits. It returns how many
// attempts fn took.
func interleave(t *testing.T, s store.Store, fn func(tx store.Txn) error, other func()) int {
	t.Helper()
	attempts := 0
	err := s.Update(t.Context(), func(tx store.Txn) error {
		attempts++
		if err := fn(tx); err != nil {
			return err
		}
		if attempts == 1 {
			other()
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Update: %v", err)
	}
	return attempts
}

// TestEtcdSerializable forces the interleavings optimistic transactions get
// wrong when they check too little (lost updates, phantoms, write skew) or
// too much (false conflicts), by committing on a second replica in the
// middle of a transaction.
func TestEtcdSerializable(t *testing.T) {
	cluster := etcdtest.Start(t)

	t.Run("WriteSkewThroughScan", func(t *testing.T) {
		// Two doctors on call; each may leave only if the other stays. Run
		// one after the other they keep one on call; interleaved without
		// conflict detection on the scan, both leave.
		r := replicas(t, cluster, 2)
		mustPut(t, r[0], "oncall/alice", "", "oncall/bob", "")
		leave := func(name string) func(tx store.Txn) error {
			return func(tx store.Txn) error {
				n := 0
				if err := tx.Scan([]byte("oncall/"), nil, func(_, _ []byte) error { n++; return nil }); err != nil {
					return err
				}
				if n < 2 {
					return nil
				}
				return tx.Delete([]byte("oncall/" + name))
			}
		}
		attempts := interleave(t, r[0], leave("alice"), func() {
			if err := r[1].Update(t.Context(), leave("bob")); err != nil {
				t.Errorf("bob: %v", err)
			}
		})
		if got := keysUnder(t, r[0], "oncall/"); len(got) != 1 {
			t.Fatalf("on call after both tried to leave: %q, want exactly one", got)
		}
		if attempts != 2 {
			t.Fatalf("alice's transaction took %d attempts, want 2 (one conflict)", attempts)
		}
	})

	t.Run("PhantomInScannedRange", func(t *testing.T) {
		r := replicas(t, cluster, 2)
		mustPut(t, r[0], "jobs/1", "x")
		var counted int
		attempts := interleave(t, r[0], func(tx store.Txn) error {
			counted = 0
			if err := tx.Scan([]byte("jobs/"), nil, func(_, _ []byte) error { counted++; return nil }); err != nil {
				return err
			}
			return tx.Put([]byte("count"), []byte(strconv.Itoa(counted)))
		}, func() { mustPut(t, r[1], "jobs/2", "x") })
		if attempts != 2 || counted != 2 {
			t.Fatalf("a key inserted into a scanned range: %d attempts, counted %d; want a conflict, then 2", attempts, counted)
		}
	})

	t.Run("DeleteInScannedRange", func(t *testing.T) {
		r := replicas(t, cluster, 2)
		mustPut(t, r[0], "jobs/1", "x", "jobs/2", "x")
		var counted int
		attempts := interleave(t, r[0], func(tx store.Txn) error {
			counted = 0
			if err := tx.Scan([]byte("jobs/"), nil, func(_, _ []byte) error { counted++; return nil }); err != nil {
				return err
			}
			return tx.Put([]byte("count"), []byte(strconv.Itoa(counted)))
		}, func() { mustDelete(t, r[1], "jobs/2") })
		if attempts != 2 || counted != 1 {
			t.Fatalf("a key deleted from a scanned range: %d attempts, counted %d; want a conflict, then 1", attempts, counted)
		}
	})

	t.Run("AbsentKeyCreated", func(t *testing.T) {
		r := replicas(t, cluster, 2)
		var sawClaim bool
		attempts := interleave(t, r[0], func(tx store.Txn) error {
			_, err := tx.Get([]byte("claim"))
			sawClaim = err == nil
			if sawClaim {
				return nil
			}
			if !errors.Is(err, store.ErrNotFound) {
				return err
			}
			return tx.Put([]byte("claim"), []byte("first"))
		}, func() { mustPut(t, r[1], "claim", "second") })
		if attempts != 2 || !sawClaim {
			t.Fatalf("a key read as absent, then created: %d attempts, saw it %v; want a conflict, then seeing it", attempts, sawClaim)
		}
		var v []byte
		if err := r[0].View(t.Context(), func(tx store.ReadTxn) (err error) { v, err = tx.Get([]byte("claim")); return err }); err != nil || string(v) != "second" {
			t.Fatalf("claim = %q, %v; want the other replica's", v, err)
		}
	})

	t.Run("EarlyStoppedScanIgnoresKeysBeyond", func(t *testing.T) {
		// A scan that stopped at jobs/2 read nothing after it: a key
		// inserted beyond must not conflict, one inserted before must.
		r := replicas(t, cluster, 2)
		mustPut(t, r[0], "jobs/1", "x", "jobs/2", "x", "jobs/5", "x")
		firstTwo := func(tx store.Txn) error {
			n := 0
			err := tx.Scan([]byte("jobs/"), nil, func(_, _ []byte) error {
				if n++; n == 2 {
					return store.ErrStopScan
				}
				return nil
			})
			if err != nil {
				return err
			}
			return tx.Put([]byte("seen"), []byte("2"))
		}
		if attempts := interleave(t, r[0], firstTwo, func() { mustPut(t, r[1], "jobs/3", "x") }); attempts != 1 {
			t.Fatalf("a key inserted after where the scan stopped caused %d attempts, want 1", attempts)
		}
		if attempts := interleave(t, r[0], firstTwo, func() { mustPut(t, r[1], "jobs/15", "x") }); attempts != 2 {
			t.Fatalf("a key inserted inside what the scan read caused %d attempts, want 2", attempts)
		}
	})

	t.Run("BlindWritesDoNotConflict", func(t *testing.T) {
		r := replicas(t, cluster, 2)
		attempts := interleave(t, r[0], func(tx store.Txn) error {
			return tx.Put([]byte("k"), []byte("mine"))
		}, func() { mustPut(t, r[1], "k", "theirs") })
		if attempts != 1 {
			t.Fatalf("a write that read nothing took %d attempts, want 1", attempts)
		}
	})

	t.Run("ConflictsExhaustAttempts", func(t *testing.T) {
		r := replicas(t, cluster, 2, func(o *etcdstore.EtcdOptions) { o.MaxAttempts = 3 })
		mustPut(t, r[0], "hot", "0")
		attempts := 0
		err := r[0].Update(t.Context(), func(tx store.Txn) error {
			attempts++
			if _, err := tx.Get([]byte("hot")); err != nil {
				return err
			}
			mustPut(t, r[1], "hot", strconv.Itoa(attempts)) // someone always wins the race
			return tx.Put([]byte("hot"), []byte("lost"))
		})
		if !errors.Is(err, store.ErrConflict) || attempts != 3 {
			t.Fatalf("always conflicting: Update returned %v after %d attempts; want ErrConflict after 3", err, attempts)
		}
		var v []byte
		_ = r[0].View(t.Context(), func(tx store.ReadTxn) (err error) { v, err = tx.Get([]byte("hot")); return err })
		if string(v) != "3" {
			t.Fatalf("hot = %q: a conflicting attempt wrote", v)
		}
	})

	t.Run("PanicFailsOnlyItsUpdate", func(t *testing.T) {
		s := etcdtest.OpenStore(t, cluster)
		err := s.Update(t.Context(), func(tx store.Txn) error {
			_ = tx.Put([]byte("k"), []byte("v"))
			panic("boom")
		})
		if !errors.Is(err, store.ErrPanicked) {
			t.Fatalf("panicking function: %v, want ErrPanicked", err)
		}
		mustPut(t, s, "after", "1")
		if got := keysUnder(t, s, ""); len(got) != 1 || got[0] != "after" {
			t.Fatalf("keys after a panic: %q", got)
		}
	})
}

// TestEtcdLargeSubtreeMark writes 10,000 nodes in one Update, then marks
// them all in another that scans them and rewrites each — the supervisor's
// mark of a 10,000-node subtree — which needs the raised etcd limits
// (10,000 writes and 10,000 comparisons against the default 128).
func TestEtcdLargeSubtreeMark(t *testing.T) {
	cluster := etcdtest.Start(t)
	s := etcdtest.OpenStore(t, cluster)
	const nodes = 10_000
	node := func(i int, state string) []byte {
		return fmt.Appendf(nil, `{"node_id":"n%05d","parent":"n%05d","state":%q,"labels":{"team":"search","model":"large"},"pad":%q}`,
			i, i/10, state, strings.Repeat("x", 80))
	}
	start := time.Now()
	err := s.Update(t.Context(), func(tx store.Txn) error {
		for i := range nodes {
			if err := tx.Put(fmt.Appendf(nil, "nodes/n%05d", i), node(i, "running")); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("writing %d nodes in one Update: %v", nodes, err)
	}
	t.Logf("wrote %d nodes in one Update in %v", nodes, time.Since(start))

	w, err := s.Watch(t.Context(), []byte("nodes/"))
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	err = s.Update(t.Context(), func(tx store.Txn) error {
		var keys [][]byte
		if err := tx.Scan([]byte("nodes/"), nil, func(k, v []byte) error {
			if !bytes.Contains(v, []byte(`"state":"running"`)) {
				return fmt.Errorf("node %s is not running", k)
			}
			keys = append(keys, bytes.Clone(k))
			return nil
		}); err != nil {
			return err
		}
		if len(keys) != nodes {
			return fmt.Errorf("scan found %d nodes", len(keys))
		}
		for i, k := range keys {
			if err := tx.Put(k, node(i, "draining")); err != nil {
				return err
			}
		}
		return tx.Put([]byte("terminations/t1"), []byte(`{"phase":"draining"}`))
	})
	if err != nil {
		t.Fatalf("marking %d nodes in one Update: %v", nodes, err)
	}
	t.Logf("marked %d nodes (scan + %d writes + %d comparisons) in %v", nodes, nodes, nodes, time.Since(start))

	select {
	case batch := <-w.Events():
		if len(batch) != nodes {
			t.Fatalf("the mark reached the watch as a batch of %d events, want all %d in one", len(batch), nodes)
		}
		for _, ev := range batch {
			if ev.Revision != batch[0].Revision || !bytes.Contains(ev.Value, []byte("draining")) {
				t.Fatalf("event %s at revision %d (batch at %d): %.40s", ev.Key, ev.Revision, batch[0].Revision, ev.Value)
			}
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("no watch batch for the mark: %v", w.Err())
	}
}

// TestEtcdTooLarge checks that an Update beyond etcd's limits fails as a
// whole with ErrTooLarge and a message naming the flag to raise, whether
// the store's options or the server's flags catch it.
func TestEtcdTooLarge(t *testing.T) {
	putsUnder := func(prefix string, n, size int) func(tx store.Txn) error {
		return func(tx store.Txn) error {
			for i := range n {
				if err := tx.Put(fmt.Appendf(nil, "%s%04d", prefix, i), bytes.Repeat([]byte("v"), size)); err != nil {
					return err
				}
			}
			return nil
		}
	}
	puts := func(n, size int) func(tx store.Txn) error { return putsUnder("k/", n, size) }
	wantTooLarge := func(t *testing.T, s store.Store, err error, flag string) {
		t.Helper()
		if !errors.Is(err, store.ErrTooLarge) || !strings.Contains(err.Error(), flag) {
			t.Fatalf("Update beyond the limits: %v; want ErrTooLarge naming %s", err, flag)
		}
		if got := keysUnder(t, s, "k/"); len(got) != 0 {
			t.Fatalf("a refused Update wrote %d keys", len(got))
		}
	}

	t.Run("StoreLimits", func(t *testing.T) {
		cluster := etcdtest.Start(t)
		s := etcdtest.OpenStore(t, cluster, func(o *etcdstore.EtcdOptions) { o.MaxTxnOps = 100 })
		if err := s.Update(t.Context(), puts(100, 10)); err != nil {
			t.Fatalf("100 writes with MaxTxnOps 100: %v", err)
		}
		mustDelete(t, s, "k/0000")
		mustDelete(t, s, "k/0001")
		err := s.Update(t.Context(), func(tx store.Txn) error {
			if err := tx.Delete([]byte("k/extra")); err != nil {
				return err
			}
			return puts(100, 10)(tx)
		})
		if !errors.Is(err, store.ErrTooLarge) || !strings.Contains(err.Error(), "--max-txn-ops") {
			t.Fatalf("101 writes with MaxTxnOps 100: %v; want ErrTooLarge naming --max-txn-ops", err)
		}
		if got := keysUnder(t, s, "k/"); len(got) != 98 {
			t.Fatalf("a refused Update changed the store: %d keys, want 98", len(got))
		}
	})

	t.Run("ServerDefaults", func(t *testing.T) {
		// etcd with its own defaults (128 operations, 1.5 MiB) under a
		// store that expects the documented flags: the server refuses.
		cluster := etcdtest.StartWithFlags(t, nil)
		s := etcdtest.OpenStore(t, cluster)
		if err := s.Update(t.Context(), putsUnder("ok/", 128, 10)); err != nil {
			t.Fatalf("128 writes against etcd's defaults: %v", err)
		}
		// Reads count too: each is a comparison at commit.
		wantTooLarge(t, s, s.Update(t.Context(), func(tx store.Txn) error {
			if err := tx.Scan([]byte("ok/"), nil, func(k, _ []byte) error { _, err := tx.Get(k); return err }); err != nil {
				return err
			}
			return tx.Put([]byte("k/0"), nil)
		}), "--max-txn-ops")
		wantTooLarge(t, s, s.Update(t.Context(), puts(129, 10)), "--max-txn-ops")
		wantTooLarge(t, s, s.Update(t.Context(), puts(2, 900_000)), "--max-request-bytes")
		// The store goes on after refusals.
		mustPut(t, s, "after", "1")
		// A prefetch larger than the server's bound falls back to
		// requests within it: the reads still answer, every one.
		var keys [][]byte
		for i := range 128 {
			keys = append(keys, fmt.Appendf(nil, "ok/%04d", i))
		}
		keys = append(keys, []byte("after"), []byte("absent"))
		for range 2 { // the second: the store already knows the bound
			err := s.View(t.Context(), func(tx store.ReadTxn) error {
				if err := store.Prefetch(tx, keys, [][]byte{[]byte("ok/")}); err != nil {
					return err
				}
				found := 0
				for _, k := range keys {
					if _, err := tx.Get(k); err == nil {
						found++
					} else if !errors.Is(err, store.ErrNotFound) {
						return err
					}
				}
				if found != 129 {
					return fmt.Errorf("found %d of the 129 keys written", found)
				}
				return nil
			})
			if err != nil {
				t.Fatalf("a prefetch of 131 ranges against etcd's defaults: %v", err)
			}
		}
	})
}

// compactNow compacts the cluster's history up to its current revision,
// as etcd's auto-compaction would, after moving the revision past what
// the store has read with a write outside its namespace.
func compactNow(t *testing.T, cluster *etcdlocal.Cluster) int64 {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: cluster.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	resp, err := c.Put(t.Context(), "/elsewhere", "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Compact(t.Context(), resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

// TestEtcdCompaction checks what etcd's compaction does to the store's
// readers: an Update whose snapshot is compacted runs again, a View fails
// rather than read across revisions, a live watch goes on, and a watch
// that would have to resume from a compacted revision ends with
// ErrWatchLagged.
func TestEtcdCompaction(t *testing.T) {
	cluster := etcdtest.Start(t)
	s := etcdtest.OpenStore(t, cluster)
	mustPut(t, s, "a", "1", "b", "2")

	t.Run("UpdateRetries", func(t *testing.T) {
		attempts := 0
		err := s.Update(t.Context(), func(tx store.Txn) error {
			attempts++
			if _, err := tx.Get([]byte("a")); err != nil {
				return err
			}
			if attempts == 1 {
				compactNow(t, cluster)
			}
			v, err := tx.Get([]byte("b"))
			if err != nil {
				return err
			}
			return tx.Put([]byte("c"), v)
		})
		if err != nil || attempts != 2 {
			t.Fatalf("Update whose snapshot was compacted: %v after %d attempts; want success on the second", err, attempts)
		}
	})

	t.Run("ViewFails", func(t *testing.T) {
		err := s.View(t.Context(), func(tx store.ReadTxn) error {
			if _, err := tx.Get([]byte("a")); err != nil {
				return err
			}
			compactNow(t, cluster)
			_, err := tx.Get([]byte("b"))
			return err
		})
		if err == nil || !strings.Contains(err.Error(), "compacted") {
			t.Fatalf("View whose snapshot was compacted: %v; want an error saying so", err)
		}
	})

	t.Run("LiveWatchGoesOn", func(t *testing.T) {
		w, err := s.Watch(t.Context(), []byte("w/"))
		if err != nil {
			t.Fatal(err)
		}
		mustPut(t, s, "w/1", "x")
		compactNow(t, cluster)
		mustPut(t, s, "w/2", "x")
		for _, want := range []string{"w/1", "w/2"} {
			select {
			case batch, ok := <-w.Events():
				if !ok {
					t.Fatalf("watch ended: %v", w.Err())
				}
				if string(batch[0].Key) != want {
					t.Fatalf("event for %s, want %s", batch[0].Key, want)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("no event for %s", want)
			}
		}
	})

	t.Run("ResumeFromCompactedRevision", func(t *testing.T) {
		rev := compactNow(t, cluster)
		w, err := etcdstore.EtcdWatchFrom(t.Context(), s, nil, rev-1)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case _, ok := <-w.Events():
			if ok {
				t.Fatalf("a watch from a compacted revision delivered events")
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("a watch from a compacted revision did not end")
		}
		if err := w.Err(); !errors.Is(err, store.ErrWatchLagged) || !strings.Contains(err.Error(), "compacted") {
			t.Fatalf("watch from a compacted revision ended with %v, want ErrWatchLagged saying why", err)
		}
	})
}

// TestEtcdMemberCrash kills a member with SIGKILL under a live watch and
// restarts it: acknowledged writes survive, and the watch either delivers
// what follows or ends with ErrWatchLagged — it never silently skips.
func TestEtcdMemberCrash(t *testing.T) {
	cluster := etcdtest.Start(t)
	s := etcdtest.OpenStore(t, cluster)
	w, err := s.Watch(t.Context(), []byte("k/"))
	if err != nil {
		t.Fatal(err)
	}
	const acknowledged = 50
	for i := range acknowledged {
		mustPut(t, s, fmt.Sprintf("k/%02d", i), "v")
	}
	victim := cluster.Members[0]
	if err := victim.Kill(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := victim.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	// The client reconnects by itself; the write waits for it.
	if err := s.Update(ctx, func(tx store.Txn) error { return tx.Put([]byte("k/after"), []byte("v")) }); err != nil {
		t.Fatalf("write after the restart: %v", err)
	}
	if got := keysUnder(t, s, "k/"); len(got) != acknowledged+1 {
		t.Fatalf("%d keys after a crash, want the %d acknowledged before it and one after", len(got), acknowledged+1)
	}

	seen := map[string]bool{}
	for !seen["k/after"] {
		select {
		case batch, ok := <-w.Events():
			if !ok {
				if !errors.Is(w.Err(), store.ErrWatchLagged) {
					t.Fatalf("watch ended with %v; want ErrWatchLagged if it cannot go on", w.Err())
				}
				return
			}
			for _, ev := range batch {
				seen[string(ev.Key)] = true
			}
		case <-ctx.Done():
			t.Fatalf("the watch neither delivered the write after the restart nor ended")
		}
	}
	if len(seen) != acknowledged+1 {
		t.Fatalf("the watch delivered %d distinct keys, want %d: it skipped some", len(seen), acknowledged+1)
	}
}

// TestEtcdNamespaces checks that stores with different prefixes, other
// etcd keys, and the store's own metadata never see each other.
func TestEtcdNamespaces(t *testing.T) {
	cluster := etcdtest.Start(t)
	a := etcdtest.OpenStore(t, cluster)
	b := etcdtest.OpenStore(t, cluster)
	wa, err := a.Watch(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	mustPut(t, b, "k", "b")
	// The store's reserved part of its namespace (elections live there).
	if _, err := a.Client().Put(t.Context(), a.MetadataPrefix("leader/x"), "replica-1"); err != nil {
		t.Fatal(err)
	}
	mustPut(t, a, "k", "a")
	if got := keysUnder(t, a, ""); len(got) != 1 || got[0] != "k" {
		t.Fatalf("store a sees %q, want only its own key", got)
	}
	select {
	case batch := <-wa.Events():
		if len(batch) != 1 || string(batch[0].Key) != "k" || string(batch[0].Value) != "a" {
			t.Fatalf("store a's watch of everything delivered %v first; want only its own write", batch)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no event for store a's own write")
	}
}

func TestOpenEtcdUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	start := time.Now()
	_, err = etcdstore.OpenEtcd(t.Context(), etcdstore.EtcdOptions{Endpoints: []string{"http://" + addr}, DialTimeout: 300 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), addr) {
		t.Fatalf("OpenEtcd with nothing listening: %v; want an error naming the endpoint", err)
	}
	if elapsed := time.Since(start); elapsed > 10*time.Second {
		t.Fatalf("OpenEtcd took %v to give up with a 300ms DialTimeout", elapsed)
	}
	if _, err := etcdstore.OpenEtcd(t.Context(), etcdstore.EtcdOptions{}); err == nil {
		t.Fatal("OpenEtcd without endpoints succeeded")
	}
}

// TestEtcdUpdateCancelledWhileWaitingForTurn checks that an Update waiting
// for an exclusive retry to finish gives up with its context and writes
// nothing.
func TestEtcdUpdateCancelledWhileWaitingForTurn(t *testing.T) {
	cluster := etcdtest.Start(t)
	r := replicas(t, cluster, 2)
	mustPut(t, r[0], "hot", "0")
	holding := make(chan struct{})
	release := make(chan struct{})
	attempts := 0
	done := make(chan error, 1)
	go func() {
		done <- r[0].Update(context.Background(), func(tx store.Txn) error {
			attempts++
			if _, err := tx.Get([]byte("hot")); err != nil {
				return err
			}
			switch attempts {
			case 1:
				// Another replica wins the race: the first attempt conflicts.
				if err := r[1].Update(context.Background(), func(tx store.Txn) error { return tx.Put([]byte("hot"), []byte("1")) }); err != nil {
					return err
				}
			case 2:
				close(holding) // the retry runs alone: hold it there
				<-release
			}
			return tx.Put([]byte("hot"), []byte("mine"))
		})
	}()
	<-holding
	ctx, cancel := context.WithCancel(t.Context())
	waiting := make(chan error, 1)
	var ran atomic.Bool
	go func() {
		waiting <- r[0].Update(ctx, func(tx store.Txn) error { ran.Store(true); return tx.Put([]byte("other"), []byte("x")) })
	}()
	deadline := time.Now().Add(10 * time.Second)
	for r[0].Stats().Waiting != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the second Update is not waiting for its turn: %+v", r[0].Stats())
		}
		runtime.Gosched()
	}
	cancel()
	if err := <-waiting; !errors.Is(err, context.Canceled) {
		t.Fatalf("Update cancelled while a retry ran alone: %v, want context.Canceled", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("the retried Update: %v", err)
	}
	if ran.Load() || len(keysUnder(t, r[0], "other")) != 0 {
		t.Fatal("the cancelled Update ran or wrote")
	}
}

// Prefetch turns one round trip per read into one per batch of reads: a
// View that reads 300 keys and scans 50 prefixes after prefetching them
// sends a handful of requests, not 350.
func TestEtcdPrefetchBatchesReads(t *testing.T) {
	cluster := etcdtest.Start(t)
	s := etcdtest.OpenStore(t, cluster)
	var keys, prefixes [][]byte
	err := s.Update(t.Context(), func(tx store.Txn) error {
		for i := range 300 {
			k := fmt.Appendf(nil, "nodes/%04d", i)
			keys = append(keys, k)
			if err := tx.Put(k, []byte("n")); err != nil {
				return err
			}
		}
		for i := range 50 {
			p := fmt.Appendf(nil, "children/%04d/", i)
			prefixes = append(prefixes, p)
			if err := tx.Put(append(p, "kid"...), nil); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	readAll := func(tx store.ReadTxn) error {
		for _, k := range keys {
			if _, err := tx.Get(k); err != nil {
				return err
			}
		}
		for _, p := range prefixes {
			n := 0
			if err := tx.Scan(p, nil, func(_, _ []byte) error { n++; return nil }); err != nil {
				return err
			}
			if n != 1 {
				return fmt.Errorf("scan %s: %d keys, want 1", p, n)
			}
		}
		return nil
	}
	requests := func(fn func(tx store.ReadTxn) error) uint64 {
		t.Helper()
		before := s.Stats().ReadRequests
		if err := s.View(t.Context(), fn); err != nil {
			t.Fatal(err)
		}
		return s.Stats().ReadRequests - before
	}
	plain := requests(readAll)
	prefetched := requests(func(tx store.ReadTxn) error {
		if err := store.Prefetch(tx, keys, prefixes); err != nil {
			return err
		}
		return readAll(tx)
	})
	// One request: a prefetch's first fixes the View's revision too.
	if plain < 350 || prefetched != 1 {
		t.Fatalf("350 reads took %d requests plainly and %d after Prefetch; want ≥ 350 and 1", plain, prefetched)
	}
	t.Logf("350 reads: %d requests plainly, %d after Prefetch", plain, prefetched)
}

// A scan of many pages reads the pages after the first in slices of the
// keys (a range request costs etcd the whole range, however few keys it
// returns). Whatever bytes the keys use and wherever the scan starts, it
// visits every key of the prefix from its start exactly once, in order —
// in a View and, merged with the transaction's own writes, in an Update.
func TestEtcdLongScanVisitsEveryKeyOnceInOrder(t *testing.T) {
	cluster := etcdtest.Start(t)
	st := etcdtest.OpenStore(t, cluster)
	ctx := context.Background()
	alphabets := []string{"0123456789", "\x00\x01\xfe\xff", "ab", "abcdefghijklmnopqrstuvwxyz234567"}
	for round, alphabet := range alphabets {
		prefix := fmt.Sprintf("long%d/", round)
		seed := uint64(round)
		want := map[string]bool{}
		for len(want) < 3000 {
			n := 1 + int((seed>>40)%12) // "ab" alone makes 8,190 keys of 1 to 12 bytes
			key := []byte(prefix)
			for range n {
				seed = seed*6364136223846793005 + 1442695040888963407
				key = append(key, alphabet[(seed>>33)%uint64(len(alphabet))])
			}
			want[string(key)] = true
		}
		sorted := make([]string, 0, len(want))
		for k := range want {
			sorted = append(sorted, k)
		}
		slices.Sort(sorted)
		for i := 0; i < len(sorted); i += 400 {
			err := st.Update(ctx, func(tx store.Txn) error {
				for _, k := range sorted[i:min(i+400, len(sorted))] {
					if err := tx.Put([]byte(k), []byte("v")); err != nil {
						return err
					}
				}
				// Neighbours on both sides of the prefix.
				if err := tx.Put([]byte(strings.TrimSuffix(prefix, "/")), nil); err != nil {
					return err
				}
				return tx.Put([]byte(strings.TrimSuffix(prefix, "/")+"0"), nil)
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		for _, from := range []int{0, 1, len(sorted) / 3, len(sorted) - 600} {
			start := []byte(sorted[from])
			if from == 0 {
				start = nil
			}
			var got []string
			err := st.View(ctx, func(tx store.ReadTxn) error {
				return tx.Scan([]byte(prefix), start, func(k, _ []byte) error { got = append(got, string(k)); return nil })
			})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, sorted[from:]) {
				t.Fatalf("alphabet %q from %d: a View's scan visited %d keys, want the %d stored from there, in order", alphabet, from, len(got), len(sorted)-from)
			}
		}
		// In an Update: its own writes (one new key, one deleted) merged in.
		added, deleted := prefix+strings.Repeat("\xff", 13), sorted[1500] // longer than any stored key
		wantTx := append(slices.Clone(sorted[:1500]), sorted[1501:]...)
		wantTx = append(wantTx, added)
		var got []string
		err := st.Update(ctx, func(tx store.Txn) error {
			got = got[:0]
			if err := tx.Put([]byte(added), nil); err != nil {
				return err
			}
			if err := tx.Delete([]byte(deleted)); err != nil {
				return err
			}
			return tx.Scan([]byte(prefix), nil, func(k, _ []byte) error { got = append(got, string(k)); return nil })
		})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, wantTx) {
			t.Fatalf("alphabet %q: an Update's scan visited %d keys, want %d", alphabet, len(got), len(wantTx))
		}
	}
}

// A scan that outruns its first page and reaches the end of its prefix
// takes a request per page (or slice) and two to find nothing more: not
// one per byte of the keys it probes past the last (a walk of a
// 1,000-entry index, %010d keys, took ten requests).
func TestEtcdScanToTheEndTakesARequestPerPage(t *testing.T) {
	cluster := etcdtest.Start(t)
	s := etcdtest.OpenStore(t, cluster)
	err := s.Update(t.Context(), func(tx store.Txn) error {
		for i := range 1000 {
			if err := tx.Put(fmt.Appendf(nil, "index/%010d", i), nil); err != nil {
				return err
			}
		}
		// A neighbour after the prefix, which the scan must not reach.
		return tx.Put([]byte("index0"), nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, from := range []int{0, 300} {
		before := s.Stats().ReadRequests
		seen := 0
		err := s.View(t.Context(), func(tx store.ReadTxn) error {
			return tx.Scan([]byte("index/"), fmt.Appendf(nil, "index/%010d", from), func(_, _ []byte) error { seen++; return nil })
		})
		if err != nil {
			t.Fatal(err)
		}
		requests := s.Stats().ReadRequests - before
		if seen != 1000-from || requests > 4 {
			t.Fatalf("a scan from %d visited %d keys (want %d) in %d requests (want at most 4)", from, seen, 1000-from, requests)
		}
	}
}
