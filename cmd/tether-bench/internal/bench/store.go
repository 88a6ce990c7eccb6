package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"

	badger "github.com/dgraph-io/badger/v4"

	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
)

func init() {
	Register("store/durable-commit", storeDurableCommit)
}

// storeValue is the size of a typical lease or progress record.
var storeValue = bytes.Repeat([]byte("v"), 200)

// storeDurableCommit measures durable write throughput of the Badger store
// (group commit) against plain Badger with SyncWrites and one transaction
// per write, the design's baseline (docs/design.md §6). Each writer overwrites
// its own key, so the baseline has no conflicts to retry.
func storeDurableCommit(ctx context.Context, r *Report) error {
	groupAt := map[int]float64{}
	baselineAt := map[int]float64{}
	for _, writers := range []int{1, 64, 1024} {
		rate, perCommit, err := measureGroupCommit(ctx, r, writers)
		if err != nil {
			return fmt.Errorf("group commit, %d writers: %w", writers, err)
		}
		groupAt[writers] = rate
		r.Add(fmt.Sprintf("store/group-commit/writers=%d", writers), rate, "ops/s")
		r.Add(fmt.Sprintf("store/group-commit/writers=%d/updates-per-commit", writers), perCommit, "updates")

		rate, err = measureBadgerTxnPerWrite(ctx, r, writers)
		if err != nil {
			return fmt.Errorf("baseline, %d writers: %w", writers, err)
		}
		baselineAt[writers] = rate
		r.Add(fmt.Sprintf("store/badger-txn-per-write/writers=%d", writers), rate, "ops/s")
	}
	// The target: group commit at 64 writers at least 5x the baseline.
	r.Add("store/group-commit-vs-baseline/writers=64", groupAt[64]/baselineAt[64], "x")
	return nil
}

func measureGroupCommit(ctx context.Context, r *Report, writers int) (rate, updatesPerCommit float64, err error) {
	dir, err := os.MkdirTemp(r.Dir, "tether-bench-store-*")
	if err != nil {
		return 0, 0, err
	}
	defer os.RemoveAll(dir)
	s, err := badgerstore.OpenBadger(dir, badgerstore.BadgerOptions{})
	if err != nil {
		return 0, 0, err
	}
	defer s.Close()

	keys := writerKeys(writers)
	before := s.Stats()
	rate, err = Throughput(ctx, writers, r.Duration, func(ctx context.Context, w int) error {
		return s.Update(ctx, func(tx store.Txn) error { return tx.Put(keys[w], storeValue) })
	})
	if err != nil {
		return 0, 0, err
	}
	after := s.Stats()
	if batches := after.Batches - before.Batches; batches > 0 {
		updatesPerCommit = float64(after.Updates-before.Updates) / float64(batches)
	}
	return rate, updatesPerCommit, s.Close()
}

func measureBadgerTxnPerWrite(ctx context.Context, r *Report, writers int) (float64, error) {
	dir, err := os.MkdirTemp(r.Dir, "tether-bench-badger-*")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	db, err := badger.Open(badger.DefaultOptions(dir).WithSyncWrites(true).WithLogger(nil))
	if err != nil {
		return 0, err
	}
	keys := writerKeys(writers)
	rate, err := Throughput(ctx, writers, r.Duration, func(_ context.Context, w int) error {
		return db.Update(func(txn *badger.Txn) error { return txn.Set(keys[w], storeValue) })
	})
	if closeErr := db.Close(); err == nil {
		err = closeErr
	}
	return rate, err
}

func writerKeys(writers int) [][]byte {
	keys := make([][]byte, writers)
	for w := range keys {
		keys[w] = fmt.Appendf(nil, "bench/writer/%05d", w)
	}
	return keys
}
