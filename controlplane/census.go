package controlplane

import (
	"container/heap"
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/reconcile"
	"github.com/tetherhq/tether/internal/store"
)

// censusEntry is what a census keeps of one stored object: its label (a
// state) and, for objects that expire, when.
type censusEntry struct {
	label   string
	expires time.Time
}

// census counts the objects under a store prefix by label, kept current by
// a store watch: one scan when it starts (or after its watch fell behind),
// then one classify per change. A scrape reads the counts under a lock, so
// "agents by state" costs the same at 100k agents as at ten, and the
// memory is one small entry per object. Each replica runs its own.
//
// Objects that expire (grants) move from activeLabel to expiredLabel when
// their time passes, found with a heap at the next read, without a write.
type census struct {
	name     string
	prefix   []byte
	classify func(key, value []byte) (censusEntry, bool)
	// changed, if set, sees each change from a live event (never the
	// initial scan): a termination reaching "terminated" observes its
	// duration. had says whether the key was known before.
	changed func(before censusEntry, had bool, after censusEntry, value []byte)
	// labels are reported even while zero, so a dashboard shows 0, not
	// "no data".
	labels                    []string
	activeLabel, expiredLabel string
	now                       func() time.Time

	mu       sync.Mutex
	loaded   bool
	entries  map[string]censusEntry
	counts   map[string]int
	expiring reconcile.Wakes
}

// counts returns the count of each label, or false before the first scan.
func (c *census) snapshot() (map[string]int, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.loaded {
		return nil, false
	}
	c.expireLocked(c.now())
	out := make(map[string]int, len(c.labels)+len(c.counts))
	for _, l := range c.labels {
		out[l] = 0
	}
	for l, n := range c.counts {
		out[l] = n
	}
	return out, true
}

// run keeps the census until ctx ends: after its watch fell behind it
// scans again at once, after a failure after a backoff on the clock
// (reconcile.Passes). Metrics never stop the server.
func (c *census) run(ctx context.Context, st store.Store, clk clock.Clock, log *slog.Logger) error {
	reconcile.Passes(ctx, "metrics census "+c.name, clk, log, func(ctx context.Context) error { return c.follow(ctx, st) })
	return nil
}

func (c *census) follow(ctx context.Context, st store.Store) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := st.Watch(ctx, c.prefix)
	if err != nil {
		return err
	}
	entries := make(map[string]censusEntry)
	var revision uint64
	err = st.View(ctx, func(tx store.ReadTxn) error {
		clear(entries)
		revision = tx.Revision()
		return tx.Scan(c.prefix, nil, func(k, v []byte) error {
			if e, ok := c.classify(k, v); ok {
				entries[string(k)] = e
			}
			return nil
		})
	})
	if err != nil {
		return err
	}
	c.reset(entries)
	for batch := range w.Events() {
		for _, ev := range batch {
			if ev.Revision > revision {
				c.apply(ev)
			}
		}
	}
	return reconcile.WatchEnded(w)
}

func (c *census) reset(entries map[string]censusEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries = entries
	c.counts = make(map[string]int)
	c.expiring = c.expiring[:0]
	for k, e := range entries {
		c.counts[e.label]++
		c.trackLocked(k, e)
	}
	heap.Init(&c.expiring)
	c.loaded = true
}

func (c *census) apply(ev store.Event) {
	key := string(ev.Key)
	var after censusEntry
	present := false
	if ev.Type == store.EventPut {
		after, present = c.classify(ev.Key, ev.Value)
	}
	c.mu.Lock()
	before, had := c.entries[key]
	if had {
		c.counts[before.label]--
		delete(c.entries, key)
	}
	if present {
		c.entries[key] = after
		c.counts[after.label]++
		if !had || before.label != after.label || !before.expires.Equal(after.expires) {
			c.trackLocked(key, after)
		}
	}
	c.mu.Unlock()
	if present && c.changed != nil {
		c.changed(before, had, after, ev.Value)
	}
}

// trackLocked remembers when an active entry expires.
func (c *census) trackLocked(key string, e censusEntry) {
	if c.activeLabel != "" && e.label == c.activeLabel && !e.expires.IsZero() {
		heap.Push(&c.expiring, reconcile.Wake{Key: key, At: e.expires})
	}
}

// expireLocked relabels the active entries whose time has passed. Heap
// items of entries that changed since are stale and only dropped.
func (c *census) expireLocked(now time.Time) {
	for len(c.expiring) > 0 && !c.expiring[0].At.After(now) {
		x := heap.Pop(&c.expiring).(reconcile.Wake)
		e, ok := c.entries[x.Key]
		if !ok || e.label != c.activeLabel || !e.expires.Equal(x.At) {
			continue
		}
		c.counts[e.label]--
		e.label = c.expiredLabel
		c.entries[x.Key] = e
		c.counts[e.label]++
	}
}
