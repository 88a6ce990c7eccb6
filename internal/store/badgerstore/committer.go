package badgerstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/tetherhq/tether/internal/store"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	badger "github.com/dgraph-io/badger/v4"
	"go.opentelemetry.io/otel/trace"
)

// revisionKey holds the last committed revision, big-endian, in the
// reserved namespace so that no caller can read, write or scan it.
var revisionKey = []byte{store.ReservedKeyByte, 'r', 'e', 'v'}

// revisionCost is what the revision entry adds to a Badger transaction.
var revisionCost = mutationCost(mutation{key: revisionKey, value: make([]byte, 8)})

// afterCommit, set by tests before a store is opened, runs on the
// committer between a batch's commit and the publication of its events:
// the moment a reader can see writes whose watchers have not had them.
var afterCommit func()

// committer is the single writer of a Badger store. It turns the Updates
// that are waiting when it becomes free into one group commit: it runs
// their functions one after another, commits all their writes with one
// synced Badger transaction, and only then answers their callers.
//
// A group commit runs on whichever goroutine holds lead: an Update that
// finds nobody committing commits the queue itself, on its caller's
// goroutine, so that a lone Update costs no hand-off to the committer's
// goroutine and back (two goroutine wake-ups, each of which may wake an
// idle processor's thread); an Update that finds a commit running wakes
// the committer's goroutine, which takes what waits as soon as the leader
// is done. Either way one group commit runs at a time, in queue order.
type committer struct {
	// lead is held by the goroutine committing. It guards the fields
	// below that only the committing goroutine uses.
	lead     sync.Mutex
	spare    []*request
	outcomes []outcome
	db       *badger.DB
	queue    *requestQueue
	hub      *watchHub
	log      *slog.Logger
	maxBatch int
	limits   txnLimits
	stats    *badgerCounters
	// observers see each group commit (metrics).
	observers store.CommitObservers
	// revision is the last durable revision. Only the goroutine holding
	// lead uses it.
	revision uint64
	// clock numbers Badger's commits and opens the batches' snapshots
	// (timestamps.go); ts is the last timestamp a commit was given, which
	// a failed commit uses up too, as some of its writes may have reached
	// the memtable.
	clock *clock
	ts    uint64
	// recent remembers the committed values the Updates last read or
	// wrote (recent.go).
	recent *recentValues
	done   chan struct{}
}

// outcome is what a taken request will be answered once the batch is
// committed.
type outcome struct {
	req *request
	err error
	// dependsOn is how many of the batch's applied updates this request
	// read or wrote; it succeeds only if all of them became durable.
	dependsOn int
}

// run is the committer's goroutine: woken by the queue's ready token, it
// commits what waits, group after group, once lead is free, until the
// queue is closed and empty.
func (c *committer) run() {
	defer close(c.done)
	for range c.queue.ready {
		c.lead.Lock()
		closed := false
		for !closed {
			var taken int
			if taken, closed = c.commitQueued(); taken == 0 {
				break
			}
		}
		c.lead.Unlock()
		if closed {
			return
		}
	}
}

// submit commits one group of what is queued on the caller's goroutine
// when nobody is committing; otherwise, and when more waits afterwards, it
// wakes the committer's goroutine, which commits the rest once the leader
// is done. A caller so commits at most one group, its own request's.
func (c *committer) submit() {
	if !c.lead.TryLock() {
		c.queue.signal()
		return
	}
	defer func() {
		if p := recover(); p != nil {
			// A panic of the commit itself (an update function's is an
			// error: store.RunUpdate) stops the process, as it did on the
			// committer's goroutine: recovered by a caller up the stack (an
			// HTTP handler's), it would leave lead held and every later
			// Update waiting for ever.
			stack := debug.Stack()
			go func() { panic(fmt.Sprintf("store: group commit panicked: %v\n%s", p, stack)) }()
			select {}
		}
	}()
	_, closed := c.commitQueued()
	c.lead.Unlock()
	if closed || c.queue.len() > 0 {
		c.queue.signal()
	}
}

// commitQueued runs one group commit of what is queued, if anything, and
// returns how many requests it took and whether the queue is closed. lead
// is held.
func (c *committer) commitQueued() (taken int, closed bool) {
	reqs, closed := c.queue.take(c.maxBatch, c.spare)
	if taken = len(reqs); taken > 0 {
		c.outcomes = c.runBatch(reqs, c.outcomes[:0])
		clear(c.outcomes)
		clear(reqs)
	}
	c.spare = reqs
	return taken, closed
}

func (c *committer) runBatch(reqs []*request, outcomes []outcome) []outcome {
	start := time.Now()
	var traced []trace.Link // the callers being traced (observe.go)
	b := newBatch(c.clock, c.revision, c.limits, c.recent)
	for _, r := range reqs {
		if err := r.ctx.Err(); err != nil {
			// Not started yet, so it must not write: report the context's
			// error instead, unless the caller already gave up.
			if r.state.CompareAndSwap(requestQueued, requestAbandoned) {
				r.answer(err)
			}
			continue
		}
		if !r.state.CompareAndSwap(requestQueued, requestTaken) {
			continue
		}
		cause := trace.SpanContextFromContext(r.ctx)
		if cause.IsSampled() {
			traced = append(traced, trace.Link{SpanContext: cause})
		}
		t := b.begin()
		err := store.RunUpdate(c.log, r.fn, t)
		t.finished = true
		if err == nil {
			b.apply(t, cause)
		}
		outcomes = append(outcomes, outcome{req: r, err: err, dependsOn: len(b.updates)})
	}
	b.release()

	marked := c.hub.committing(b.updates)
	committed, commitErr := c.commit(b.updates)
	if afterCommit != nil {
		afterCommit()
	}
	if commitErr != nil {
		// What the snapshots will show of a failed commit is not known
		// here: remember nothing.
		c.recent.forget()
	} else {
		c.recent.commitWrites(b.updates)
	}
	if committed > 0 {
		c.revision = b.updates[committed-1].revision
		c.hub.publish(b.updates[:committed])
	}
	c.hub.settled(marked)
	if commitErr != nil {
		c.log.Error("store: group commit failed", "err", commitErr,
			"committed_updates", committed, "failed_updates", len(b.updates)-committed)
		commitErr = fmt.Errorf("store: commit: %w", commitErr)
	}
	if len(b.updates) > 0 {
		c.stats.batches.Add(1)
	}
	for _, o := range outcomes {
		err := o.err
		if o.dependsOn > committed {
			// Its function saw writes that never became durable, so
			// whatever it concluded cannot be trusted either.
			err = commitErr
		}
		if err == nil {
			c.stats.updates.Add(1)
		}
		o.req.answer(err)
	}
	c.observers.Observe(len(outcomes), time.Since(start))
	if traced != nil {
		store.RecordBatchSpan(start, traced, len(outcomes), len(b.updates), c.revision, commitErr)
	}
	return outcomes
}

// commit makes updates durable, in order, in as few Badger transactions as
// they fit in. It returns how many leading updates are durable; on error
// the rest are not applied.
func (c *committer) commit(updates []*appliedUpdate) (int, error) {
	done := 0
	for done < len(updates) {
		n, err := c.commitPrefix(updates[done:])
		done += n
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

// commitPrefix commits the longest prefix of updates that fits in one
// Badger transaction and returns its length. Transactions split only
// between updates, so each Update stays atomic and a crash between two of
// them leaves a prefix of the commit order.
func (c *committer) commitPrefix(updates []*appliedUpdate) (int, error) {
	n := len(updates)
	for {
		// The transaction only writes: its read timestamp is never used.
		txn := c.db.NewTransactionAt(c.ts, true)
		fitted, err := fill(txn, updates[:n])
		if err == nil {
			c.ts++
			err = txn.CommitAt(c.ts, nil)
			if err != nil {
				return 0, err
			}
			// Every write of the commit is in the memtable: reads may
			// begin at it.
			c.clock.committed(c.ts)
			c.stats.transactions.Add(1)
			return n, nil
		}
		txn.Discard()
		if !errors.Is(err, badger.ErrTxnTooBig) {
			return 0, err
		}
		if fitted == 0 {
			// Unreachable while updateTxn.record enforces txnLimits.
			return 0, fmt.Errorf("%w: one update does not fit in a Badger transaction", store.ErrTooLarge)
		}
		n = fitted
	}
}

// fill adds the writes of updates and the revision of the last one to txn.
// On error it reports how many leading updates fitted entirely; whether the
// revision fits beside them is found out by the next attempt.
func fill(txn *badger.Txn, updates []*appliedUpdate) (int, error) {
	for i, u := range updates {
		for _, m := range u.writes {
			var err error
			if m.deleted {
				err = txn.Delete(m.key)
			} else {
				err = txn.Set(m.key, m.value)
			}
			if err != nil {
				return i, err
			}
		}
	}
	last := updates[len(updates)-1].revision
	if err := txn.Set(revisionKey, encodeRevision(last)); err != nil {
		return len(updates) - 1, err
	}
	return len(updates), nil
}

func encodeRevision(rev uint64) []byte {
	return binary.BigEndian.AppendUint64(make([]byte, 0, 8), rev)
}

func decodeRevision(b []byte) (uint64, error) {
	if len(b) != 8 {
		return 0, fmt.Errorf("store: corrupt revision record of %d bytes", len(b))
	}
	return binary.BigEndian.Uint64(b), nil
}

// badgerCounters back BadgerStats.
type badgerCounters struct {
	batches, transactions, updates atomic.Uint64
}

// ObserveCommits makes fn see every group commit from now on (nil stops).
func (s *Badger) ObserveCommits(fn store.CommitObserver) { s.committer.observers.Set(fn) }
