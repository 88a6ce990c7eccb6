package badgerstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/tetherhq/tether/internal/store"
	"log/slog"
	"sync"

	badger "github.com/dgraph-io/badger/v4"
)

// BadgerOptions tune a Badger store. The zero value is the production
// configuration.
type BadgerOptions struct {
	// InMemory keeps the whole store in memory, for tests: nothing is
	// durable, and the directory passed to OpenBadger must be empty.
	InMemory bool
	// Logger receives Badger's warnings and errors and the committer's own
	// reports (failed commits, panicking Update functions). Nil means
	// slog.Default().
	Logger *slog.Logger
	// MaxBatch caps how many Updates one group commit takes. Zero means
	// 1024.
	MaxBatch int
	// WatchBuffer is how many committed transactions a watcher may have
	// unread before its watch ends with ErrWatchLagged. Zero means 1024.
	WatchBuffer int
	// MemTableSize is Badger's memtable size, 0 for Badger's default
	// (64 MiB). Badger caps one transaction at 15% of it, which caps the
	// writes of one Update; it must be at least 8 MiB so that a value of
	// MaxValueSize fits.
	MemTableSize int64
}

const (
	defaultMaxBatch    = 1024
	defaultWatchBuffer = 1024
	minMemTableSize    = 8 << 20
)

// Badger is the embedded Store backend: Badger on a local directory, with a
// group committer for durable writes. See the package documentation.
type Badger struct {
	db        *badger.DB
	clock     *clock
	queue     *requestQueue
	hub       *watchHub
	committer *committer
	stats     badgerCounters

	// lifecycle keeps Close from closing the database under a running View.
	lifecycle sync.RWMutex
	closed    bool

	closeOnce sync.Once
	closeErr  error
}

var _ store.Store = (*Badger)(nil)

// OpenBadger opens (creating if needed) the store in dir.
func OpenBadger(dir string, opts BadgerOptions) (*Badger, error) {
	if opts.InMemory != (dir == "") {
		return nil, errors.New("store: open badger: give a directory, or no directory with InMemory")
	}
	if opts.MemTableSize != 0 && opts.MemTableSize < minMemTableSize {
		return nil, fmt.Errorf("store: open badger: MemTableSize %d is below the %d-byte minimum", opts.MemTableSize, minMemTableSize)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = defaultMaxBatch
	}
	if opts.WatchBuffer <= 0 {
		opts.WatchBuffer = defaultWatchBuffer
	}

	bopts := badger.DefaultOptions(dir).
		WithInMemory(opts.InMemory).
		// Durability comes from this: every Badger commit syncs before it
		// returns. The committer makes one commit serve many Updates.
		WithSyncWrites(true).
		// The committer is the only writer, so there is nothing to detect.
		WithDetectConflicts(false).
		WithMetricsEnabled(false).
		WithLogger(badgerLogger{opts.Logger})
	if opts.MemTableSize != 0 {
		bopts = bopts.WithMemTableSize(opts.MemTableSize)
	}
	if tuneBadger != nil {
		bopts = tuneBadger(bopts)
	}
	if !opts.InMemory {
		if err := removeEmptyMemtables(dir, opts.Logger); err != nil {
			return nil, err
		}
	}
	// Managed mode: the store numbers the commits (timestamps.go).
	db, err := badger.OpenManaged(bopts)
	if err != nil {
		return nil, fmt.Errorf("store: open badger: %w", err)
	}
	if !opts.InMemory && !skipValueLogSync(db) {
		opts.Logger.Warn("store: cannot turn off Badger's per-commit sync of its value log (see vlogsync.go); every commit syncs it too: as durable, one device flush slower")
	}
	clock := newClock(db)
	revision, err := readRevision(clock)
	if err != nil {
		db.Close()
		return nil, err
	}

	s := &Badger{
		db:    db,
		clock: clock,
		queue: newRequestQueue(),
		hub:   newWatchHub(opts.WatchBuffer),
	}
	s.committer = &committer{
		db:       db,
		queue:    s.queue,
		hub:      s.hub,
		log:      opts.Logger,
		maxBatch: opts.MaxBatch,
		limits: txnLimits{
			// Room for the revision entry and Badger's own per-transaction
			// bookkeeping, so one Update always fits in one transaction.
			count: int(db.MaxBatchCount()) - 2,
			cost:  db.MaxBatchSize() - revisionCost - 64,
		},
		stats:    &s.stats,
		revision: revision,
		clock:    clock,
		ts:       clock.lastCommitted(),
		recent:   newRecentValues(recentEntries, recentBytes, recentMaxValue),
		done:     make(chan struct{}),
	}
	go s.committer.run()
	return s, nil
}

// tuneBadger, set by tests before a store is opened, adjusts Badger's
// options (say, to make compaction deterministic).
var tuneBadger func(badger.Options) badger.Options

// OpenBadgerInMemory opens an empty store that lives in memory only, for
// tests.
func OpenBadgerInMemory() (*Badger, error) {
	return OpenBadger("", BadgerOptions{InMemory: true})
}

func readRevision(c *clock) (uint64, error) {
	txn, done := c.view()
	defer done()
	revision, err := snapshotRevision(txn)
	if err != nil {
		return 0, fmt.Errorf("store: read revision: %w", err)
	}
	return revision, nil
}

func snapshotRevision(txn *badger.Txn) (uint64, error) {
	item, err := txn.Get(revisionKey)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	var revision uint64
	err = item.Value(func(v []byte) error {
		revision, err = decodeRevision(v)
		return err
	})
	return revision, err
}

// View runs fn on a Badger snapshot. Views run concurrently with each other
// and with the committer.
func (s *Badger) View(ctx context.Context, fn func(tx store.ReadTxn) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.lifecycle.RLock()
	defer s.lifecycle.RUnlock()
	if s.closed {
		return store.ErrClosed
	}
	txn, done := s.clock.view()
	defer done()
	rt := &readTxn{txn: txn}
	defer func() { rt.finished = true }()
	return fn(rt)
}

// Update hands fn to the committer and waits until its writes are durable.
// If ctx ends while fn is still queued, Update returns ctx's error and fn
// never runs; once fn has started, Update waits for the commit. Update must
// not be called from inside another Update's function (the committer would
// wait for itself).
func (s *Badger) Update(ctx context.Context, fn func(tx store.Txn) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	r := &request{ctx: ctx, fn: fn, done: make(chan struct{})}
	if err := s.queue.push(r); err != nil {
		return err
	}
	s.committer.submit()
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		if r.state.CompareAndSwap(requestQueued, requestAbandoned) {
			return ctx.Err()
		}
		// The committer took it first: the outcome is on its way.
		<-r.done
		return r.err
	}
}

// Watch watches the keys under prefix; an empty prefix watches every key.
func (s *Badger) Watch(ctx context.Context, prefix []byte) (store.Watcher, error) {
	if err := store.CheckPrefix(prefix); err != nil {
		return nil, err
	}
	w, err := s.hub.add(ctx, prefix, false)
	if err != nil {
		return nil, err
	}
	return w, nil
}

// Watches returns how many watches are open: the committer hands every
// commit's events to each of them in turn, so this is what a commit's
// publication costs.
func (s *Badger) Watches() int {
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	return len(s.hub.watchers)
}

// WatchVisible is Watch for a consumer that keeps a view of the keys under
// prefix in memory and must never answer from it what a reader of the
// store could already contradict. Besides the events (which, as with every
// watch, are in the watcher's buffer before the Update that made them
// returns), it reports through unseen whether a change under prefix may
// already be visible to readers while its events are not yet in the
// buffer: from just before its commit until they are. A consumer that
// reads unseen() first and then drains the buffer has seen every change a
// read made before could have returned, or knows it may not have (unseen
// was true).
func (s *Badger) WatchVisible(ctx context.Context, prefix []byte) (w store.Watcher, unseen func() bool, err error) {
	if err := store.CheckPrefix(prefix); err != nil {
		return nil, nil, err
	}
	hw, err := s.hub.add(ctx, prefix, true)
	if err != nil {
		return nil, nil, err
	}
	return hw, func() bool { return hw.unseen.Load() > 0 }, nil
}

// WatchVisibleKeys is WatchVisible with unseen for one key: whether a
// change of that key (the whole key, under prefix) may already be visible
// to readers while its events are not yet in the buffer. A consumer that
// answers for one key (a cache of some keys' values) reads unseen(key)
// first and then drains the buffer; changes of other keys in flight do
// not make it miss, as WatchVisible's unseen does whenever any key under
// prefix is being committed (which, under a steady stream of writes, is
// nearly always).
func (s *Badger) WatchVisibleKeys(ctx context.Context, prefix []byte) (w store.Watcher, unseen func(key string) bool, err error) {
	if err := store.CheckPrefix(prefix); err != nil {
		return nil, nil, err
	}
	hw, err := s.hub.add(ctx, prefix, true)
	if err != nil {
		return nil, nil, err
	}
	return hw, hw.unseenKey, nil
}

// Close lets the committer finish every Update queued before it, ends all
// watches with ErrClosed and closes the database. Later calls return the
// first call's result. Close must not be called from an Update function.
func (s *Badger) Close() error {
	s.closeOnce.Do(func() {
		s.queue.close()
		<-s.committer.done
		s.lifecycle.Lock()
		s.closed = true
		s.lifecycle.Unlock()
		s.hub.close()
		if err := s.db.Close(); err != nil {
			s.closeErr = fmt.Errorf("store: close badger: %w", err)
		}
	})
	return s.closeErr
}

// BadgerStats are counters for watching the group committer at work.
type BadgerStats struct {
	// Updates is the number of Updates acknowledged as durable.
	Updates uint64
	// Batches is the number of group commits (batches that wrote
	// something); Updates/Batches is about the mean number of Updates that
	// shared one sync.
	Batches uint64
	// Transactions is the number of Badger transactions committed. It
	// exceeds Batches when a batch was too big for one transaction.
	Transactions uint64
	// Queued is the number of Updates waiting for the committer now.
	Queued int
}

// Stats returns the store's counters.
func (s *Badger) Stats() BadgerStats {
	return BadgerStats{
		Updates:      s.stats.updates.Load(),
		Batches:      s.stats.batches.Load(),
		Transactions: s.stats.transactions.Load(),
		Queued:       s.queue.len(),
	}
}

// badgerInternalPrefix starts the keys Badger keeps for itself. Badger
// refuses writes to them at commit time, where one would fail a whole
// batch, so the store refuses them up front, for reads too.
var badgerInternalPrefix = []byte("!badger!")

func checkBadgerKey(key []byte) error {
	if err := store.CheckKey(key); err != nil {
		return err
	}
	if bytes.HasPrefix(key, badgerInternalPrefix) {
		return fmt.Errorf("%w: keys starting with %q are reserved by Badger", store.ErrInvalidKey, badgerInternalPrefix)
	}
	return nil
}

// readTxn is the ReadTxn of View: a Badger read-only transaction.
type readTxn struct {
	txn      *badger.Txn
	finished bool

	revision     uint64
	revisionRead bool
}

func (t *readTxn) Get(key []byte) ([]byte, error) {
	if t.finished {
		return nil, errTxnFinished
	}
	if err := checkBadgerKey(key); err != nil {
		return nil, err
	}
	item, err := t.txn.Get(key)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return nil, store.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("store: read key: %w", err)
	}
	value, err := item.ValueCopy(nil)
	if err != nil {
		return nil, fmt.Errorf("store: read value: %w", err)
	}
	if value == nil {
		value = []byte{}
	}
	return value, nil
}

func (t *readTxn) Scan(prefix, start []byte, fn func(key, value []byte) error) error {
	if t.finished {
		return errTxnFinished
	}
	if err := store.CheckPrefix(prefix); err != nil {
		return err
	}
	return mergeScan(t.txn, prefix, store.ScanLowerBound(prefix, start), nil, fn)
}

// Revision reads the revision record of the snapshot, so it is exactly the
// revision of the last Update the snapshot sees.
func (t *readTxn) Revision() uint64 {
	if !t.revisionRead && !t.finished {
		// The record is written by every commit; failing to read it means
		// the snapshot is unusable, which the next Get or Scan reports.
		t.revision, _ = snapshotRevision(t.txn)
		t.revisionRead = true
	}
	return t.revision
}

// badgerLogger passes Badger's warnings and errors to slog and drops its
// chatter, which is useful only to Badger's developers.
type badgerLogger struct{ log *slog.Logger }

func (l badgerLogger) Errorf(format string, args ...any) {
	l.log.Error(badgerMessage(format, args), "component", "badger")
}

func (l badgerLogger) Warningf(format string, args ...any) {
	l.log.Warn(badgerMessage(format, args), "component", "badger")
}

func (badgerLogger) Infof(string, ...any)  {}
func (badgerLogger) Debugf(string, ...any) {}

func badgerMessage(format string, args []any) string {
	return string(bytes.TrimSpace(fmt.Appendf(nil, format, args...)))
}
