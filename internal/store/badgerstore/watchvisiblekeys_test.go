package badgerstore_test

import (
	"context"
	"testing"

	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
)

// TestWatchVisibleKeysKnowsWhichKeyAReaderCanSeeChanged: the committer is
// held between a write's commit and the publication of its events, as in
// TestWatchVisibleKnowsEveryChangeAReaderCanSee. The consumer is told that
// the key being committed may be unseen — and only that key: another key
// under the prefix, which no batch in flight changes, is not (a cache of
// it need not miss while others are written). Once the Update returned,
// nothing is unseen. A watch established in the gap, which cannot know
// what the batch in flight changes, is told every key may be unseen.
func TestWatchVisibleKeysKnowsWhichKeyAReaderCanSeeChanged(t *testing.T) {
	committed, release, failed := make(chan struct{}), make(chan struct{}), make(chan struct{})
	reset := badgerstore.SetAfterCommit(func() {
		select {
		case committed <- struct{}{}:
			select {
			case <-release:
			case <-failed:
			}
		case <-failed:
		}
	})
	t.Cleanup(reset) // after the store's close: cleanups run last first
	s := openBadger(t, t.TempDir(), testOptions(t))
	t.Cleanup(func() { close(failed) }) // lets the committer go if the test stopped holding it
	ctx := context.Background()
	w, unseen, err := s.WatchVisibleKeys(ctx, []byte("node/"))
	if err != nil {
		t.Fatal(err)
	}
	write := func(key string, during func()) {
		done := make(chan error, 1)
		go func() {
			done <- s.Update(ctx, func(tx store.Txn) error { return tx.Put([]byte(key), []byte("v")) })
		}()
		<-committed
		if err := s.View(ctx, func(tx store.ReadTxn) error {
			_, err := tx.Get([]byte(key))
			return err
		}); err != nil {
			t.Fatalf("%s committed but not visible: %v", key, err)
		}
		during()
		release <- struct{}{}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{key, "node/a", "node/b"} {
			if unseen(k) {
				t.Fatalf("%s answered: %s is still unseen", key, k)
			}
		}
	}
	write("node/a", func() {
		if !unseen("node/a") {
			t.Fatal("node/a is visible to a reader, its event not yet published, and not unseen")
		}
		if unseen("node/b") {
			t.Fatal("node/b is unseen while only node/a is being committed")
		}
	})
	if batch := <-w.Events(); len(batch) != 1 || string(batch[0].Key) != "node/a" {
		t.Fatalf("events %v, want node/a", batch)
	}
	write("lease/a", func() {
		if unseen("node/a") || unseen("lease/a") {
			t.Fatal("a write under another prefix is unseen")
		}
	})
	var lateUnseen func(string) bool
	write("node/c", func() {
		if _, lateUnseen, err = s.WatchVisibleKeys(ctx, []byte("node/")); err != nil {
			t.Fatal(err)
		}
		if !lateUnseen("node/b") {
			t.Fatal("a watch established while a commit was visible and unpublished is not told any key may be unseen")
		}
	})
	if lateUnseen("node/b") || lateUnseen("node/c") {
		t.Fatal("the late watch still has unseen keys after the commit was published")
	}
}
