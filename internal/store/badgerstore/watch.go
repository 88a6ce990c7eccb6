package badgerstore

import (
	"bytes"
	"context"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/tetherhq/tether/internal/store"
)

// watchHub fans committed events out to prefix watchers. The committer
// publishes with non-blocking sends only: a watcher whose buffer is full is
// ended with ErrWatchLagged rather than allowed to slow every writer down.
type watchHub struct {
	mu       sync.Mutex
	watchers map[*watcher]struct{}
	closed   bool
	buffer   int
	// visible counts the watchers from WatchVisible, so that a batch
	// looks for them only when there are some.
	visible atomic.Int64
	// inFlight: a batch is between committing and settled (the committer
	// is serial: at most one is). fresh are the WatchVisible watchers
	// added meanwhile: that batch was not marked for them, so each counts
	// it unseen until it settles.
	inFlight bool
	fresh    []*watcher
}

func newWatchHub(buffer int) *watchHub {
	return &watchHub{watchers: make(map[*watcher]struct{}), buffer: buffer}
}

// watcher implements Watcher. Its channel is closed, and err set, exactly
// once, under the hub's lock.
type watcher struct {
	prefix []byte
	events chan []store.Event
	// stopContext detaches the context callback once the watch has ended
	// for another reason.
	stopContext func() bool
	// visible: a WatchVisible watcher, whose unseen counts the batches with
	// a change under its prefix that are committing or committed and not
	// yet delivered.
	visible bool
	unseen  atomic.Int64
	// fresh is 1 while the watcher, added during a commit, does not know
	// which keys that commit changes (every key may be unseen); pending
	// is the keys under its prefix that the batch in flight changes (nil
	// when there is none), for UnseenKey.
	fresh   atomic.Int64
	pending atomic.Pointer[map[string]struct{}]

	store.WatchEnd
}

func (w *watcher) Events() <-chan []store.Event { return w.events }

// add registers a watch on prefix that ends when ctx does.
func (h *watchHub) add(ctx context.Context, prefix []byte, visible bool) (*watcher, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	w := &watcher{prefix: bytes.Clone(prefix), events: make(chan []store.Event, h.buffer), visible: visible}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, store.ErrClosed
	}
	h.watchers[w] = struct{}{}
	if visible {
		h.visible.Add(1)
		if h.inFlight {
			w.unseen.Store(1)
			w.fresh.Store(1)
			h.fresh = append(h.fresh, w)
		}
	}
	// Registered under the lock so that endLocked always sees it; the
	// callback runs on its own goroutine, so it cannot deadlock on h.mu.
	w.stopContext = context.AfterFunc(ctx, func() { h.end(w, ctx.Err()) })
	h.mu.Unlock()
	return w, nil
}

func (h *watchHub) end(w *watcher, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.endLocked(w, err)
}

func (h *watchHub) endLocked(w *watcher, err error) {
	if _, ok := h.watchers[w]; !ok {
		return
	}
	delete(h.watchers, w)
	if w.visible {
		h.visible.Add(-1)
	}
	w.End(err)
	close(w.events)
	w.stopContext()
}

// committing marks, before updates are committed, the WatchVisible
// watchers with a change among them as having one unseen, and returns them
// for seen once the events are published.
func (h *watchHub) committing(updates []*appliedUpdate) []*watcher {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.inFlight = true
	if h.visible.Load() == 0 {
		return nil
	}
	var out []*watcher
	for w := range h.watchers {
		if !w.visible {
			continue
		}
		if keys := changes(updates, w.prefix); keys != nil {
			// The keys before the count: a reader that sees the count
			// unseen may look at the keys (UnseenKey).
			w.pending.Store(&keys)
			w.unseen.Add(1)
			out = append(out, w)
		}
	}
	return out
}

// changes returns the keys under prefix that updates change, nil when
// there is none.
func changes(updates []*appliedUpdate, prefix []byte) map[string]struct{} {
	var keys map[string]struct{}
	for _, u := range updates {
		for _, ev := range u.events {
			if bytes.HasPrefix(ev.Key, prefix) {
				if keys == nil {
					keys = make(map[string]struct{})
				}
				keys[string(ev.Key)] = struct{}{}
			}
		}
	}
	return keys
}

// unseenKey reports whether a change of key may be visible to readers and
// not yet in w's buffer: it is changed by the batch in flight, or w was
// added during a commit whose keys it does not know.
func (w *watcher) unseenKey(key string) bool {
	if w.fresh.Load() > 0 {
		return true
	}
	if p := w.pending.Load(); p != nil {
		_, ok := (*p)[key]
		return ok
	}
	return false
}

// settled undoes committing once the batch's events were published (or
// its commit failed), for the watchers it marked and those added since.
func (h *watchHub) settled(marked []*watcher) {
	for _, w := range marked {
		w.unseen.Add(-1)
		w.pending.Store(nil)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.inFlight = false
	for _, w := range h.fresh {
		w.unseen.Add(-1)
		w.fresh.Add(-1)
	}
	h.fresh = nil
}

// publish delivers the events of committed updates, in commit order, one
// batch per update, to every watcher whose prefix matches. Event slices are
// shared between watchers and must not be modified by them.
func (h *watchHub) publish(updates []*appliedUpdate) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := range h.watchers {
		for _, u := range updates {
			events := matching(u.events, w.prefix)
			if len(events) == 0 {
				continue
			}
			select {
			case w.events <- events:
			default:
				h.endLocked(w, store.ErrWatchLagged)
			}
			if _, alive := h.watchers[w]; !alive {
				break
			}
		}
	}
}

// matching returns the events whose key has prefix, as a part of events
// (capped, so a watcher's append cannot write into it): an Update's
// events are in key order (appliedUpdate.events), so those under one
// prefix are contiguous. It copies nothing: it used to copy the events of
// a watch on part of the keys that an Update also wrote outside it, once
// per watcher and Update — a tenth of what a large termination allocated
// (each chunk writes a thousand nodes beside their index, calls and
// record, and six watchers follow the nodes).
func matching(events []store.Event, prefix []byte) []store.Event {
	first, _ := slices.BinarySearchFunc(events, prefix, func(ev store.Event, prefix []byte) int {
		return bytes.Compare(ev.Key, prefix)
	})
	end := first
	for end < len(events) && bytes.HasPrefix(events[end].Key, prefix) {
		end++
	}
	if first == end {
		return nil
	}
	return events[first:end:end]
}

// close ends every watch with ErrClosed and refuses new ones.
func (h *watchHub) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for w := range h.watchers {
		h.endLocked(w, store.ErrClosed)
	}
}
