package etcdstore_test

import (
	"strconv"
	"testing"

	"github.com/tetherhq/tether/internal/etcdtest"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/storetest"
)

// TestRogue46GAWaitingCommitThatCanOnlyFailIsNotSent: commits queued in
// the group commit behind one that writes what they read (cancel
// acknowledgements of one termination meeting at an ancestor's shard of
// the stop rules' totals) can only fail once it lands: their comparisons
// are of revisions it replaced. They are answered the conflict at once
// and retried, where each went to etcd as a commit of its own that etcd
// refused. Four increments of one key, queued together: 7 commit
// requests before (the first, three refused one after the other, three
// retries), 4 now; every increment lands once, and a member that read
// nothing the landed commit wrote is still sent and lands with it.
func TestRogue46GAWaitingCommitThatCanOnlyFailIsNotSent(t *testing.T) {
	cluster := etcdtest.Start(t)
	s := replicas(t, cluster, 1)[0]
	mustPut(t, s, "n", "0", "other", "0")
	before := s.Stats()
	var fns []func(store.Txn) error
	for i := range 4 {
		fns = append(fns, func(tx store.Txn) error {
			if err := storetest.Increment("n")(tx); err != nil {
				return err
			}
			return tx.Put([]byte("own/"+strconv.Itoa(i)), []byte("x"))
		})
	}
	// One that reads a key none of them writes: never doomed.
	fns = append(fns, storetest.Increment("other"))
	attempts := heldUpdates(t, s, fns...)
	after := s.Stats()
	if got := getInt(t, s, "n"); got != 4 {
		t.Fatalf("four increments left n = %d", got)
	}
	if got := getInt(t, s, "other"); got != 1 {
		t.Fatalf("the independent increment left other = %d", got)
	}
	if keys := keysUnder(t, s, "own/"); len(keys) != 4 {
		t.Fatalf("own keys: %q", keys)
	}
	sum := 0
	for _, a := range attempts[:4] {
		sum += a
	}
	if sum != 7 || attempts[4] != 1 {
		t.Errorf("attempts %v: want the first increment and the independent one once, the three others twice", attempts)
	}
	if got := after.CommitRequests - before.CommitRequests; got != 4 {
		t.Errorf("%d commit requests, want 4 (the merged first, then the three retries): a doomed commit was sent", got)
	}
	if got := after.Doomed - before.Doomed; got != 3 {
		t.Errorf("%d commits answered as doomed, want 3", got)
	}
}

// TestRogue46GACommitThatStillHoldsIsSentAndLands: a waiting commit is
// answered as doomed only when its comparisons cannot hold. One that read
// a key absent, behind one that deleted it (still absent), and one that
// read a key the landed one did not write, are sent and land in one
// attempt each.
func TestRogue46GACommitThatStillHoldsIsSentAndLands(t *testing.T) {
	cluster := etcdtest.Start(t)
	s := replicas(t, cluster, 1)[0]
	mustPut(t, s, "kept", "0")
	before := s.Stats()
	attempts := heldUpdates(t, s,
		func(tx store.Txn) error {
			if err := tx.Delete([]byte("gone")); err != nil {
				return err
			}
			return storetest.Increment("kept")(tx)
		},
		// Reads "gone" absent (the first deletes it: they are not
		// merged), writes beside it.
		func(tx store.Txn) error {
			if _, err := tx.Get([]byte("gone")); err == nil {
				t.Error("gone is present")
			}
			return tx.Put([]byte("beside"), []byte("x"))
		},
	)
	after := s.Stats()
	if attempts[0] != 1 || attempts[1] != 1 {
		t.Errorf("attempts %v, want [1 1]: a commit whose comparisons still hold was answered as doomed", attempts)
	}
	if got := after.Doomed - before.Doomed; got != 0 {
		t.Errorf("%d doomed, want 0", got)
	}
	if got := after.CommitRequests - before.CommitRequests; got != 2 {
		t.Errorf("%d commit requests, want 2: the second waited for the first", got)
	}
	if got := getInt(t, s, "kept"); got != 1 {
		t.Fatalf("kept = %d", got)
	}
}
