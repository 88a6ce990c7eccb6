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
