package badgerstore

import (
	"context"
	"errors"
	"sync"
	"testing"

	badger "github.com/dgraph-io/badger/v4"

	"github.com/tetherhq/tether/internal/store"
)

// TestDiscardTsStaysAtTheOldestOpenRead: the discard timestamp the store
// gives Badger follows the commits while nothing reads, stops at a read
// that is open, and catches up once that read has ended.
func TestDiscardTsStaysAtTheOldestOpenRead(t *testing.T) {
	s, err := OpenBadger(t.TempDir(), BadgerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	put := func(key, value string) {
		t.Helper()
		if err := s.Update(ctx, func(tx store.Txn) error { return tx.Put([]byte(key), []byte(value)) }); err != nil {
			t.Fatal(err)
		}
	}
	put("k", "0")
	if got, want := s.clock.discardTs(), s.clock.lastCommitted(); got != want || got == 0 {
		t.Fatalf("discard timestamp with no read open = %d, want the last commit's, %d", got, want)
	}

	held, releaseCh, ended := make(chan uint64), make(chan struct{}), make(chan error, 1)
	release := sync.OnceFunc(func() { close(releaseCh) })
	defer release() // before Close, which waits for the View
	go func() {
		ended <- s.View(ctx, func(tx store.ReadTxn) error {
			held <- s.clock.lastCommitted()
			<-releaseCh
			return nil
		})
	}()
	readTs := <-held
	for i := range 3 {
		put("k", string(rune('1'+i)))
	}
	if got := s.clock.discardTs(); got != readTs {
		t.Fatalf("discard timestamp with a read open at %d = %d, want %d", readTs, got, readTs)
	}
	release()
	if err := <-ended; err != nil {
		t.Fatal(err)
	}
	put("k", "4")
	if got, want := s.clock.discardTs(), s.clock.lastCommitted(); got != want {
		t.Fatalf("discard timestamp after the read ended = %d, want the last commit's, %d", got, want)
	}
}

// TestCompactionKeepsWhatAnOpenReadSees runs Badger's compaction while a
// View is open at an old version of a key that was since overwritten and
// deleted: the View still reads its version. Once the View has ended, the
// next compaction drops every version of the deleted key (without a
// discard timestamp Badger would keep them all).
func TestCompactionKeepsWhatAnOpenReadSees(t *testing.T) {
	// One level-0 table too many makes Flatten compact level 0 into the
	// next, where the discard timestamp applies.
	tuneBadger = func(o badger.Options) badger.Options { return o.WithNumLevelZeroTables(1) }
	defer func() { tuneBadger = nil }()
	s, err := OpenBadger(t.TempDir(), BadgerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	update := func(fn func(tx store.Txn) error) {
		t.Helper()
		if err := s.Update(ctx, fn); err != nil {
			t.Fatal(err)
		}
	}
	key := []byte("k")
	// compact writes everything to level-0 tables (two: a memtable is
	// flushed when a prefix is dropped) and compacts them into level 1.
	compact := func() {
		t.Helper()
		for range 2 {
			update(func(tx store.Txn) error { return tx.Put([]byte("scratch"), []byte("x")) })
			if err := s.db.DropPrefix([]byte("scratch")); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.db.Flatten(1); err != nil {
			t.Fatal(err)
		}
	}
	versions := func() int {
		t.Helper()
		txn := s.db.NewTransactionAt(s.clock.lastCommitted(), false)
		defer txn.Discard()
		it := txn.NewKeyIterator(key, badger.IteratorOptions{AllVersions: true})
		defer it.Close()
		n := 0
		for it.Rewind(); it.Valid(); it.Next() {
			n++
		}
		return n
	}

	update(func(tx store.Txn) error { return tx.Put(key, []byte("old")) })
	held, rereadCh, ended := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	reread := sync.OnceFunc(func() { close(rereadCh) })
	defer reread() // before Close, which waits for the View
	go func() {
		ended <- s.View(ctx, func(tx store.ReadTxn) error {
			if _, err := tx.Get(key); err != nil {
				return err
			}
			close(held)
			<-rereadCh
			v, err := tx.Get(key)
			if err != nil {
				return err
			}
			if string(v) != "old" {
				return errors.New("read " + string(v) + ", want old")
			}
			return nil
		})
	}()
	<-held
	for _, v := range []string{"new", "newer"} {
		update(func(tx store.Txn) error { return tx.Put(key, []byte(v)) })
	}
	update(func(tx store.Txn) error { return tx.Delete(key) })
	compact()
	reread()
	if err := <-ended; err != nil {
		t.Fatalf("the View open across the compaction: %v", err)
	}

	compact()
	if n := versions(); n != 0 {
		t.Fatalf("%d versions of the deleted key survived a compaction with no read open, want 0", n)
	}
}
