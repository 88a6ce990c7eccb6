package badgerstore

import (
	"reflect"
	"unsafe"

	badger "github.com/dgraph-io/badger/v4"

	"github.com/tetherhq/tether/internal/store"
)

// Every value the store writes stays in Badger's LSM tree, whose log (the
// active memtable's WAL) Badger syncs on every commit with SyncWrites: a
// value goes to the value log only from ValueThreshold bytes on, and the
// store refuses values above store.MaxValueSize, which is below Badger's
// default (and largest) threshold of 1 MiB. The value log therefore never
// holds anything, yet with SyncWrites Badger syncs it on every commit
// before it syncs the WAL (valueLog.write): an msync of a file with
// nothing dirty, which on ext4 still costs a device cache flush. That
// second flush was half of a lone commit (measured: 347 µs per synced
// Badger transaction with it, 174 µs without, interleaved on one disk;
// a write plus fdatasync of a plain file took 157 µs), and so a third of
// a lone lease renewal.
//
// Badger has no option for "sync the WAL, not the value log", so
// skipValueLogSync turns off the value log's copy of SyncWrites after Open
// (the WAL keeps the database's copy). It finds the field by name and
// reports false, changing nothing, if this Badger version moved it: the
// store is then as durable as before and only slower, and
// TestValueLogSyncSkipped fails so that whoever upgraded Badger looks.
//
// It must run before the first write: the committer, which starts after
// it, is Badger's only writer, and reaches the value log through Badger's
// write channel (a happens-before edge).
func skipValueLogSync(db *badger.DB) bool {
	if db.Opts().ValueThreshold <= store.MaxValueSize || db.Opts().VLogPercentile != 0 {
		// A value could reach the value log: keep syncing it.
		return false
	}
	f := reflect.ValueOf(db).Elem().FieldByName("vlog")
	if !f.IsValid() || f.Kind() != reflect.Struct {
		return false
	}
	f = f.FieldByName("opt")
	if !f.IsValid() || f.Type() != reflect.TypeFor[badger.Options]() {
		return false
	}
	f = f.FieldByName("SyncWrites")
	if !f.IsValid() || f.Kind() != reflect.Bool || !f.CanAddr() {
		return false
	}
	*(*bool)(unsafe.Pointer(f.UnsafeAddr())) = false
	return true
}

// valueLogSynced reports whether Badger syncs db's value log on every
// commit (for tests).
func valueLogSynced(db *badger.DB) bool {
	return reflect.ValueOf(db).Elem().FieldByName("vlog").FieldByName("opt").FieldByName("SyncWrites").Bool()
}
