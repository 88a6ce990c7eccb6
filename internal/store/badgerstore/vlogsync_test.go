package badgerstore

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/tetherhq/tether/internal/store"
)

// TestValueLogSyncSkipped: a store on disk syncs the memtable's WAL on
// every commit and not Badger's value log, which never holds a value of
// the store (every value, up to store.MaxValueSize, stays in the LSM tree).
// It fails when a Badger upgrade moved the option skipValueLogSync turns
// off, or began putting the store's values in the value log.
func TestValueLogSyncSkipped(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenBadger(dir, BadgerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if valueLogSynced(s.db) {
		t.Fatal("Badger still syncs the value log on every commit: skipValueLogSync found no option to turn off")
	}
	if !s.db.Opts().SyncWrites {
		t.Fatal("the database's own SyncWrites (the WAL's) is off: commits would not be durable")
	}
	ctx := context.Background()
	big := bytes.Repeat([]byte("v"), store.MaxValueSize)
	for i := range 20 {
		value := []byte(fmt.Sprint(i))
		if i%5 == 0 {
			value = big
		}
		if err := s.Update(ctx, func(tx store.Txn) error { return tx.Put(fmt.Appendf(nil, "k/%02d", i), value) }); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// A value log with no entries is its header alone (Badger truncates
	// the file to what was written when it closes).
	vlogs, err := filepath.Glob(filepath.Join(dir, "*.vlog"))
	if err != nil || len(vlogs) == 0 {
		t.Fatalf("no value log in %s (%v)", dir, err)
	}
	for _, name := range vlogs {
		fi, err := os.Stat(name)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() > vlogHeaderSize {
			t.Fatalf("%s holds %d bytes: a value of the store went to the value log, which is no longer synced", name, fi.Size())
		}
	}
	// And the values are there after a reopen, read from the LSM tree.
	s, err = OpenBadger(dir, BadgerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	err = s.View(ctx, func(tx store.ReadTxn) error {
		v, err := tx.Get([]byte("k/05"))
		if err == nil && !bytes.Equal(v, big) {
			err = fmt.Errorf("k/05 reads %d bytes, want %d", len(v), len(big))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// vlogHeaderSize is the size of an empty Badger value log file.
const vlogHeaderSize = 20
