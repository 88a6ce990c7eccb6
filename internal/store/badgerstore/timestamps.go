package badgerstore

import (
	"slices"
	"sync"

	badger "github.com/dgraph-io/badger/v4"
)

// Badger runs in managed mode (badger.OpenManaged): the store, not
// Badger, gives every transaction its timestamp. In Badger's own mode each
// write transaction goes through its oracle, whose read and commit
// watermarks are goroutines fed over channels: a lone commit woke three of
// them, each on the machine's other processor while the committer ran on,
// which was most of what a lone lease renew cost beyond etcd's (see
// docs/capacity.md, "The lone unary renew, profiled"). The store needs
// none of that machinery: the committer is the only writer, so it can
// number its commits itself, and a reader can take the last committed
// number without waiting for anything, because the committer publishes a
// number only once Badger's Commit has returned and every write of that
// commit is in the memtable.
//
// What Badger's oracle did that the store must now do itself is tell
// compaction which versions nobody can read any more: Badger keeps every
// version above its discard timestamp and, of those at or below it, only
// the newest (none if that is a deletion). A reader at timestamp r reads
// the newest version at or below r, which compaction keeps as long as the
// discard timestamp is at most r. So the clock tracks the timestamps of
// the reads still open and keeps the discard timestamp at the oldest of
// them, or at the last commit when none is open. Left at zero, compaction
// would keep every version of every key forever; set past an open read, a
// later Get in that read could find a key missing.
//
// clock is that bookkeeping: the last committed timestamp, the open reads
// counted per timestamp, and the discard timestamp given to Badger. Reads
// take the last committed timestamp under the same lock that advances it,
// so a discard timestamp computed under that lock never passes a read that
// has begun.
type clock struct {
	db *badger.DB

	mu sync.Mutex
	// last is the timestamp of the last commit that returned: every
	// version at or below it is complete in Badger.
	last uint64
	// open counts the reads still open per timestamp, oldest first.
	// Reads begin at last, which never decreases, so a new one joins the
	// newest entry or appends one; entries that drop to zero are removed
	// once they reach the front.
	open []openReads
	// discard is the discard timestamp last given to Badger. Only the
	// committer changes it, so it only grows.
	discard uint64
}

type openReads struct {
	ts uint64
	n  int
}

// newClock starts the clock after the last version on disk (Badger's
// MaxVersion after replaying its logs), with nothing open. A version that
// a crash left incomplete was not replayed, so it is not counted, and its
// timestamp may be given again.
func newClock(db *badger.DB) *clock {
	c := &clock{db: db, last: db.MaxVersion()}
	c.discard = c.last
	db.SetDiscardTs(c.discard)
	return c
}

// beginRead registers a read at the last committed timestamp and returns
// that timestamp; the caller must pass it to endRead once the read's
// Badger transaction is discarded.
func (c *clock) beginRead() uint64 {
	c.mu.Lock()
	ts := c.last
	if n := len(c.open); n > 0 && c.open[n-1].ts == ts {
		c.open[n-1].n++
	} else {
		c.open = append(c.open, openReads{ts: ts, n: 1})
	}
	c.mu.Unlock()
	return ts
}

// endRead ends a read begun at ts.
func (c *clock) endRead(ts uint64) {
	c.mu.Lock()
	i, found := slices.BinarySearchFunc(c.open, ts, func(o openReads, ts uint64) int {
		switch {
		case o.ts < ts:
			return -1
		case o.ts > ts:
			return 1
		}
		return 0
	})
	if !found || c.open[i].n == 0 {
		c.mu.Unlock()
		panic("badgerstore: a read ended that was not open")
	}
	c.open[i].n--
	drop := 0
	for drop < len(c.open) && c.open[drop].n == 0 {
		drop++
	}
	if drop == len(c.open) {
		c.open = c.open[:0] // reuse the storage
	} else if drop > 0 {
		c.open = c.open[drop:]
	}
	c.mu.Unlock()
}

// view opens a Badger read-only transaction at the last committed
// timestamp; done discards it and ends the read.
func (c *clock) view() (txn *badger.Txn, done func()) {
	ts := c.beginRead()
	txn = c.db.NewTransactionAt(ts, false)
	return txn, func() {
		txn.Discard()
		c.endRead(ts)
	}
}

// committed records that the commit at ts returned (only the committer
// calls it, with growing timestamps) and moves Badger's discard timestamp
// up to the oldest open read, or to ts when none is open. Reads that end
// between commits move it at the next commit: until then compaction keeps
// a few versions more than it must, which is always safe.
func (c *clock) committed(ts uint64) {
	c.mu.Lock()
	c.last = ts
	discard := ts
	if len(c.open) > 0 {
		discard = c.open[0].ts
	}
	advance := discard > c.discard
	if advance {
		c.discard = discard
	}
	c.mu.Unlock()
	if advance {
		c.db.SetDiscardTs(discard)
	}
}

// lastCommitted is the timestamp reads begin at now.
func (c *clock) lastCommitted() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

// discardTs is the discard timestamp given to Badger (for tests).
func (c *clock) discardTs() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.discard
}
