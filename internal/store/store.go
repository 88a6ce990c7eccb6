package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync/atomic"

	"go.opentelemetry.io/otel/trace"

	"github.com/tetherhq/tether/internal/fault"
)

// Sentinel errors. Backends wrap their own causes with these so callers can
// test with errors.Is.
var (
	// ErrNotFound is returned by Get when a key does not exist.
	ErrNotFound = fault.New(fault.NotFound, "store: key not found")
	// ErrConflict is returned by a backend when a read-write transaction lost
	// a race; Update retries it internally and returns it only when the
	// retry budget is exhausted.
	ErrConflict = fault.New(fault.Internal, "store: transaction conflict")
	// ErrClosed is returned after Close.
	ErrClosed = fault.New(fault.Unavailable, "store: closed")
	// ErrTooLarge is returned when a transaction or value exceeds the
	// backend's limits.
	ErrTooLarge = fault.New(fault.Exhausted, "store: transaction too large")
	// ErrPanicked is returned by Update when its function panicked. The
	// panic is confined to that Update: its writes are discarded and the
	// store goes on.
	ErrPanicked = fault.New(fault.Internal, "store: update function panicked")
	// ErrTxnFinished is returned by a transaction used after its View or
	// Update function returned.
	ErrTxnFinished = fault.New(fault.Internal, "store: transaction used after its Update function returned")
)

// Store is a transactional, ordered key-value store with prefix watches.
//
// Contract, for every backend:
//   - Update runs fn in a serializable read-write transaction. fn may be run
//     more than once (retry on conflict), so it must have no side effects
//     outside the transaction. When Update returns nil the writes are durable
//     (synced to disk, or committed by a quorum) — callers may acknowledge.
//     If fn returns an error, none of its writes are applied and Update
//     returns that error unchanged.
//   - Concurrent Updates may share one durable sync (group commit); each
//     still returns only after its own writes are durable. A backend may
//     commit several as one transaction (etcd merges small concurrent
//     commits that touch disjoint keys): they then share a revision, and a
//     watch delivers their changes in one batch.
//   - View runs fn on a consistent snapshot.
//   - Watch delivers, in commit order, the changes under a prefix committed
//     after the watch was established. To resume without gaps, establish the
//     watch first, then scan, and drop events whose Revision is not above
//     the scan's revision.
type Store interface {
	View(ctx context.Context, fn func(tx ReadTxn) error) error
	Update(ctx context.Context, fn func(tx Txn) error) error
	Watch(ctx context.Context, prefix []byte) (Watcher, error)
	Close() error
}

// ReadTxn is a read-only view of the store.
type ReadTxn interface {
	// Get returns the value of key or an error wrapping ErrNotFound. The
	// returned slice is owned by the caller.
	Get(key []byte) ([]byte, error)
	// Scan calls fn for each key with the prefix, in ascending key order,
	// starting at the first key >= start (start may be nil). Returning
	// ErrStopScan from fn ends the scan without error. key and value are
	// valid only during the call.
	Scan(prefix, start []byte, fn func(key, value []byte) error) error
	// Revision is the store revision this transaction reads at.
	Revision() uint64
}

// Read runs read in a View of s and returns what it read.
func Read[T any](ctx context.Context, s Store, read func(tx ReadTxn) (T, error)) (T, error) {
	var out T
	err := s.View(ctx, func(tx ReadTxn) error {
		var err error
		out, err = read(tx)
		return err
	})
	return out, err
}

// RunUpdate runs an Update's function fn on tx, for a backend: a panic in
// fn is logged with its stack and becomes ErrPanicked for that Update
// alone, so the updates that share its commit go on.
func RunUpdate(log *slog.Logger, fn func(Txn) error, tx Txn) (err error) {
	defer func() {
		if p := recover(); p != nil {
			log.Error("store: update function panicked", "panic", p, "stack", string(debug.Stack()))
			err = fmt.Errorf("%w: %v", ErrPanicked, p)
		}
	}()
	return fn(tx)
}

// IDsAfter lists up to limit ids of an index whose keys are prefix + id:
// those after the id after ("" for the first), in key order, and whether
// more follow.
func IDsAfter(tx ReadTxn, prefix []byte, after string, limit int) ([]string, bool, error) {
	var start []byte
	if after != "" {
		start = append(append(bytes.Clone(prefix), after...), 0)
	}
	var ids []string
	more := false
	err := tx.Scan(prefix, start, func(k, _ []byte) error {
		if len(ids) == limit {
			more = true
			return ErrStopScan
		}
		ids = append(ids, string(k[len(prefix):]))
		return nil
	})
	return ids, more, err
}

// KeysOf maps ids to their keys (or prefixes), for Prefetch.
func KeysOf(ids []string, key func(string) []byte) [][]byte {
	out := make([][]byte, len(ids))
	for i, id := range ids {
		out[i] = key(id)
	}
	return out
}

// Prefetch tells tx which reads are coming — Gets of keys, and Scans of
// prefixes (from their first key) — so that a backend whose reads are
// network round trips (etcd) fetches them together, in one request per
// few hundred reads, instead of one round trip each. It changes no answer
// and no guarantee: a prefetched read returns what the read would have
// returned, and an Update's conflict detection covers what fn reads, not
// what it prefetched. Backends that read locally (Badger) ignore it. Use
// it before loops that read one key or prefix per item of a known list.
func Prefetch(tx ReadTxn, keys, prefixes [][]byte) error {
	for _, k := range keys {
		if err := CheckKey(k); err != nil {
			return err
		}
	}
	for _, p := range prefixes {
		if err := CheckPrefix(p); err != nil {
			return err
		}
	}
	if p, ok := tx.(Prefetcher); ok && (len(keys) > 0 || len(prefixes) > 0) {
		return p.Prefetch(keys, prefixes)
	}
	return nil
}

// Prefetcher is implemented by the transactions of a backend whose reads
// are network round trips. Callers use the function Prefetch, which checks
// the keys and prefixes first; backends implement the method.
type Prefetcher interface {
	Prefetch(keys, prefixes [][]byte) error
}

// ScanFrom names a scan a transaction is about to make: of Prefix, from
// the first key >= Start (nil: from the prefix's first key), as
// ReadTxn.Scan takes them.
type ScanFrom struct {
	Prefix, Start []byte
}

// PrefetchScansFrom is Prefetch for scans that start inside their prefix
// (the rows after a checkpoint, say): a backend whose reads are round trips
// fetches the first page of each of them together, in one request per few
// hundred scans. Like Prefetch it changes no answer and no guarantee, and
// backends that read locally ignore it.
func PrefetchScansFrom(tx ReadTxn, scans []ScanFrom) error {
	for _, sc := range scans {
		if err := CheckPrefix(sc.Prefix); err != nil {
			return err
		}
	}
	if p, ok := tx.(ScanPrefetcher); ok && len(scans) > 0 {
		return p.PrefetchScansFrom(scans)
	}
	return nil
}

// ScanPrefetcher is implemented by the transactions of a backend whose
// reads are network round trips. Callers use the function
// PrefetchScansFrom, which checks the prefixes first.
type ScanPrefetcher interface {
	PrefetchScansFrom(scans []ScanFrom) error
}

// PrefetchReads is Prefetch of keys and PrefetchScansFrom of scans at
// once: a backend whose reads are round trips fetches them together, in
// one request per few hundred. It is for a transaction that knows, before
// its first read, what it will probably read after it (the keys a record
// it holds names): a key or a scan it then never reads costs a range and
// guards nothing. Like Prefetch it changes no answer and no guarantee, and
// backends that read locally ignore it.
func PrefetchReads(tx ReadTxn, keys [][]byte, scans []ScanFrom) error {
	for _, k := range keys {
		if err := CheckKey(k); err != nil {
			return err
		}
	}
	for _, sc := range scans {
		if err := CheckPrefix(sc.Prefix); err != nil {
			return err
		}
	}
	if len(keys) == 0 && len(scans) == 0 {
		return nil
	}
	if p, ok := tx.(ReadsPrefetcher); ok {
		return p.PrefetchReads(keys, scans)
	}
	if err := Prefetch(tx, keys, nil); err != nil {
		return err
	}
	return PrefetchScansFrom(tx, scans)
}

// ReadsPrefetcher is implemented by the transactions of a backend whose
// reads are network round trips. Callers use the function PrefetchReads,
// which checks the keys and prefixes first.
type ReadsPrefetcher interface {
	PrefetchReads(keys [][]byte, scans []ScanFrom) error
}

// Expect reports whether key holds want (want nil: key is absent) in tx.
// Inside an Update it is a read of key compared with want, and the Update
// commits only if that comparison still holds at the commit — the
// guarantee of any read. The difference: a backend whose reads are network
// round trips (etcd) may skip the read on an Update's first attempt,
// answer true, and check the comparison inside the commit instead; if it
// fails there, the attempt is void and the function runs again, and then
// Expect reads. So an Update whose only read is Expect costs one round
// trip, not two. Use it for a fencing token the function only compares
// (a term, an epoch), never for a value it needs: a false answer says the
// key does not hold want, and the caller reads the key to learn what it
// holds. Backends that read locally (Badger) and Views read and compare.
func Expect(tx ReadTxn, key, want []byte) (bool, error) {
	if err := CheckKey(key); err != nil {
		return false, err
	}
	if e, ok := tx.(Expecter); ok {
		return e.Expect(key, want)
	}
	v, err := tx.Get(key)
	if errors.Is(err, ErrNotFound) {
		return want == nil, nil
	}
	if err != nil {
		return false, err
	}
	return want != nil && bytes.Equal(v, want), nil
}

// Expecter is implemented by the transactions of a backend that checks
// Expect at commit. Callers use the function Expect, which checks the key
// first; backends implement the method.
type Expecter interface {
	Expect(key, want []byte) (bool, error)
}

// RevisionExpecter is implemented by the transactions of a backend whose
// keys carry the revision of the transaction that last wrote them (etcd's
// mod revision, the Revision of the watch event that delivered the write).
// ExpectRevision answers whether key was last written at rev (false for a
// missing key), with Expect's contract: on an Update's first attempt it
// may answer true without reading and check the comparison inside the
// commit (a failed comparison voids the attempt; the next one reads). It
// says what Expect with the value written at rev says, or less (a key
// rewritten with the same value no longer matches), and costs the commit
// a comparison of a revision instead of the value. Backends without
// revisions per key (Badger) do not implement it: use Expect there.
type RevisionExpecter interface {
	ExpectRevision(key []byte, rev uint64) (bool, error)
}

// RevisionChecker is implemented by a backend whose Update transactions
// are RevisionExpecters that check ExpectRevision inside the commit on an
// Update's first attempt (etcd): there a value kept from a watch, with its
// event's Revision, can stand in for a read. Callers use ChecksRevisions.
type RevisionChecker interface {
	ChecksRevisionsAtCommit() bool
}

// ChecksRevisions reports whether s checks ExpectRevision at the commit
// (RevisionChecker). On a backend that does not (Badger reads locally, and
// a read costs it less than a comparison), keeping values to expect them
// costs memory and saves nothing.
func ChecksRevisions(s Store) bool {
	c, ok := s.(RevisionChecker)
	return ok && c.ChecksRevisionsAtCommit()
}

// ErrStopScan ends a Scan early without an error.
var ErrStopScan = fault.New(fault.Internal, "store: stop scan")

// Txn is a read-write transaction. Reads see the transaction's own writes.
type Txn interface {
	ReadTxn
	Put(key, value []byte) error
	Delete(key []byte) error
}

// EventType says whether a key was written or deleted.
type EventType int

const (
	EventPut EventType = iota + 1
	EventDelete
)

func (t EventType) String() string {
	switch t {
	case EventPut:
		return "put"
	case EventDelete:
		return "delete"
	default:
		return "unknown"
	}
}

// Event is one change seen by a watch.
type Event struct {
	Type     EventType
	Key      []byte
	Value    []byte // nil for deletes
	Revision uint64 // the revision of the transaction that made the change
	// Trace is the span context of the Update that made the change when
	// its caller was traced and the change was committed by this process
	// (zero otherwise, and always for changes seen from another replica):
	// what a watcher links the spans of its own work to.
	Trace trace.SpanContext
}

// WatchEnd is why a backend's watch ended, for its Watcher's Err: the
// backend records it with End before it closes the watch's events, so that
// a consumer that sees them closed reads the reason.
type WatchEnd struct{ err atomic.Pointer[error] }

// Err returns why the watch ended; nil while it runs.
func (e *WatchEnd) Err() error {
	if err := e.err.Load(); err != nil {
		return *err
	}
	return nil
}

// End records why the watch ended; the backend closes its events after.
func (e *WatchEnd) End(err error) { e.err.Store(&err) }

// Watcher delivers events until its context ends or the store closes.
type Watcher interface {
	// Events delivers batches of events, one batch per committed
	// transaction (Updates committed together count as one), in commit
	// order. It is closed when the watch ends.
	Events() <-chan []Event
	// Err reports why the watch ended (nil while it is running, the
	// context's error, ErrClosed, or ErrWatchLagged).
	Err() error
}

// ErrWatchLagged ends a watch whose consumer fell too far behind; the
// consumer should re-establish the watch and rescan.
var ErrWatchLagged = fault.New(fault.Internal, "store: watcher fell behind")
