package badgerstore

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/tetherhq/tether/internal/store"

	badger "github.com/dgraph-io/badger/v4"
	"go.opentelemetry.io/otel/trace"
)

// mutation is the final state of one key after a transaction.
type mutation struct {
	key     []byte
	value   []byte
	deleted bool
}

// mutationCost estimates what one write costs against Badger's
// per-transaction limits. Badger charges at most len(key)+len(value)+14 for
// an entry plus 10 for its version; rounding up keeps our estimate an upper
// bound, so a transaction we accept always fits.
func mutationCost(m mutation) int64 {
	return int64(len(m.key)+len(m.value)) + 32
}

// appliedUpdate is an Update whose closure succeeded and that wrote
// something: its writes and the revision they were given.
type appliedUpdate struct {
	writes   []mutation // sorted by key
	revision uint64
	events   []store.Event // in key order, as writes (matching relies on it)
}

// batch is one group commit in the making: the Updates the committer has
// run so far, in order, and the state they leave behind.
type batch struct {
	clock *clock
	// snapshot reads the committed state; it is opened on the first read
	// that misses the batch, as many batches never read the database.
	// endSnapshot discards it.
	snapshot    *badger.Txn
	endSnapshot func()
	// pending is the latest state of every key written in the batch.
	pending writeSet
	updates []*appliedUpdate
	// revision is the revision of the last applied update, or the committed
	// revision if there is none yet.
	revision uint64
	limits   txnLimits
	// recent is the committer's memory of committed values (recent.go),
	// read before the snapshot and filled from it.
	recent *recentValues
}

// txnLimits bound the writes of a single Update so that it always fits in
// one Badger transaction together with the revision key.
type txnLimits struct {
	count int
	cost  int64
}

func newBatch(clock *clock, revision uint64, limits txnLimits, recent *recentValues) *batch {
	return &batch{clock: clock, pending: newWriteSet(), revision: revision, limits: limits, recent: recent}
}

// release frees the read snapshot; the batch must not be read afterwards.
func (b *batch) release() {
	if b.snapshot != nil {
		b.endSnapshot()
		b.snapshot, b.endSnapshot = nil, nil
	}
}

func (b *batch) readSnapshot() *badger.Txn {
	if b.snapshot == nil {
		b.snapshot, b.endSnapshot = b.clock.view()
	}
	return b.snapshot
}

// lookup returns the state of key below an Update's own writes: the batch's
// pending writes, then the committed database. With wantValue it returns a
// copy of the value that the caller owns.
func (b *batch) lookup(key []byte, wantValue bool) (value []byte, found bool, err error) {
	if m, ok := b.pending.get(string(key)); ok {
		if m.deleted {
			return nil, false, nil
		}
		if wantValue {
			value = bytes.Clone(m.value)
		}
		return value, true, nil
	}
	if m, ok := b.recent.get(key); ok {
		if m.absent {
			return nil, false, nil
		}
		if wantValue {
			value = append(make([]byte, 0, len(m.value)), m.value...)
		}
		return value, true, nil
	}
	item, err := b.readSnapshot().Get(key)
	if errors.Is(err, badger.ErrKeyNotFound) {
		b.recent.set(key, nil, true)
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("store: read key: %w", err)
	}
	if wantValue {
		if value, err = item.ValueCopy(nil); err != nil {
			return nil, false, fmt.Errorf("store: read value: %w", err)
		}
		if value == nil {
			value = []byte{}
		}
		b.recent.set(key, value, false)
	}
	return value, true, nil
}

// begin starts the overlay transaction for the next Update of the batch.
func (b *batch) begin() *updateTxn {
	return &updateTxn{batch: b, writes: newWriteSet()}
}

// apply folds a successful Update's writes into the batch and gives it the
// next revision. Updates that wrote nothing take no revision.
func (b *batch) apply(t *updateTxn, cause trace.SpanContext) {
	if t.writes.len() == 0 {
		return
	}
	b.revision++
	u := &appliedUpdate{
		writes:   make([]mutation, 0, t.writes.len()),
		revision: b.revision,
		events:   make([]store.Event, 0, t.writes.len()),
	}
	t.writes.all(func(m mutation) {
		u.writes = append(u.writes, m)
		b.pending.set(m)
	})
	for _, m := range u.writes {
		ev := store.Event{Type: store.EventPut, Key: m.key, Value: m.value, Revision: u.revision, Trace: cause}
		if m.deleted {
			ev.Type, ev.Value = store.EventDelete, nil
		}
		u.events = append(u.events, ev)
	}
	b.updates = append(b.updates, u)
}

// updateTxn is the Txn an Update closure sees. Its own writes live in an
// overlay on top of the batch, so a failed closure is undone by dropping the
// overlay, and reads see the closure's writes, then the batch's, then the
// committed state.
type updateTxn struct {
	batch    *batch
	writes   writeSet
	cost     int64
	finished bool
}

var errTxnFinished = store.ErrTxnFinished

func (t *updateTxn) Revision() uint64 { return t.batch.revision }

func (t *updateTxn) Get(key []byte) ([]byte, error) {
	if t.finished {
		return nil, errTxnFinished
	}
	if err := checkBadgerKey(key); err != nil {
		return nil, err
	}
	if m, ok := t.writes.get(string(key)); ok {
		if m.deleted {
			return nil, store.ErrNotFound
		}
		return bytes.Clone(m.value), nil
	}
	value, found, err := t.batch.lookup(key, true)
	switch {
	case err != nil:
		return nil, err
	case !found:
		return nil, store.ErrNotFound
	}
	return value, nil
}

func (t *updateTxn) Put(key, value []byte) error {
	if t.finished {
		return errTxnFinished
	}
	if err := checkBadgerKey(key); err != nil {
		return err
	}
	if err := store.CheckValue(value); err != nil {
		return err
	}
	if value == nil {
		// Keep "present with an empty value" distinct from "absent".
		value = []byte{}
	}
	// Copy both: the caller may reuse its slices, and the batch keeps ours
	// until the commit and hands them to watchers afterwards.
	return t.record(mutation{key: bytes.Clone(key), value: bytes.Clone(value)})
}

func (t *updateTxn) Delete(key []byte) error {
	if t.finished {
		return errTxnFinished
	}
	if err := checkBadgerKey(key); err != nil {
		return err
	}
	_, existed, err := t.batch.lookup(key, false)
	if err != nil {
		return err
	}
	if !existed {
		// Deleting a key nobody below this Update can see changes nothing:
		// drop any write of our own and emit no event, as etcd does.
		if old, ok := t.writes.get(string(key)); ok {
			t.cost -= mutationCost(old)
			t.writes.remove(string(key))
		}
		return nil
	}
	return t.record(mutation{key: bytes.Clone(key), deleted: true})
}

// record adds m to the overlay unless the Update would outgrow one Badger
// transaction, which is the largest unit the store can apply atomically.
func (t *updateTxn) record(m mutation) error {
	cost := t.cost + mutationCost(m)
	count := t.writes.len() + 1
	if old, ok := t.writes.get(string(m.key)); ok {
		cost -= mutationCost(old)
		count--
	}
	if count > t.batch.limits.count || cost > t.batch.limits.cost {
		return fmt.Errorf("%w: the transaction's writes exceed %d entries or %d bytes",
			store.ErrTooLarge, t.batch.limits.count, t.batch.limits.cost)
	}
	t.writes.set(m)
	t.cost = cost
	return nil
}

func (t *updateTxn) Scan(prefix, start []byte, fn func(key, value []byte) error) error {
	if t.finished {
		return errTxnFinished
	}
	if err := store.CheckPrefix(prefix); err != nil {
		return err
	}
	lower := store.ScanLowerBound(prefix, start)
	// Writes made by fn during the scan are not visited: the uncommitted
	// keys of the range are gathered up front, the Update's own over the
	// batch's, each set visiting only the range.
	var own, below []mutation
	t.writes.ascend(prefix, lower, func(m mutation) bool {
		own = append(own, m)
		return true
	})
	t.batch.pending.ascend(prefix, lower, func(m mutation) bool {
		below = append(below, m)
		return true
	})
	return mergeScan(t.batch.readSnapshot(), prefix, lower, mergeOverlay(own, below), fn)
}

// mergeOverlay merges two key-sorted mutation lists; own wins on equal keys.
func mergeOverlay(own, below []mutation) []mutation {
	if len(below) == 0 {
		return own
	}
	if len(own) == 0 {
		return below
	}
	out := make([]mutation, 0, len(own)+len(below))
	i, j := 0, 0
	for i < len(own) && j < len(below) {
		switch c := bytes.Compare(own[i].key, below[j].key); {
		case c < 0:
			out = append(out, own[i])
			i++
		case c > 0:
			out = append(out, below[j])
			j++
		default:
			out = append(out, own[i])
			i++
			j++
		}
	}
	out = append(out, own[i:]...)
	return append(out, below[j:]...)
}

// mergeScan visits, in key order, the keys under prefix from lower on in the
// snapshot merged with overlay (sorted), where overlay wins on equal keys.
func mergeScan(snapshot *badger.Txn, prefix, lower []byte, overlay []mutation, fn func(key, value []byte) error) error {
	it := snapshot.NewIterator(badger.IteratorOptions{Prefix: prefix})
	defer it.Close()
	it.Seek(lower)
	next := 0
	for {
		var err error
		dbValid := it.ValidForPrefix(prefix)
		switch {
		case next < len(overlay) && (!dbValid || bytes.Compare(overlay[next].key, it.Item().Key()) <= 0):
			m := overlay[next]
			next++
			if dbValid && bytes.Equal(m.key, it.Item().Key()) {
				it.Next()
			}
			if m.deleted {
				continue
			}
			// Full slice expressions: an append by fn must not write into
			// the batch's memory.
			err = fn(m.key[:len(m.key):len(m.key)], m.value[:len(m.value):len(m.value)])
		case dbValid:
			item := it.Item()
			key := item.Key()
			err = item.Value(func(value []byte) error {
				return fn(key[:len(key):len(key)], value[:len(value):len(value)])
			})
			it.Next()
		default:
			return nil
		}
		if errors.Is(err, store.ErrStopScan) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
