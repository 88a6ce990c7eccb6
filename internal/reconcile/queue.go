package reconcile

import (
	"container/heap"
	"sync"
	"time"
)

// queue holds the keys waiting to be reconciled: a key added while it
// waits is not duplicated, and a key added while it is being reconciled
// runs once more afterwards. Each key has at most one wake-up time ("look
// again at t"), kept in a heap; the clock that decides when one is due is
// the loop's.
//
// The ready keys wait in lanes, one per group (Config.Group), each in the
// order added, and the lanes take turns: a group with many keys ready at
// once (a rogue's terminations whose deadlines pass together) has one
// served, then every other group's next, before its second.
type queue struct {
	mu       sync.Mutex
	group    func(key string) string
	lanes    map[string][]string // group → its ready keys, oldest first
	turns    []string            // the groups with ready keys, next first
	queued   map[string]bool
	active   map[string]bool
	dirty    map[string]bool
	wakes    map[string]time.Time // the key's current wake-up; heap entries that differ are stale
	timers   Wakes
	failures map[string]int // consecutive failed reconciles, for the backoff
	signal   chan struct{}
}

func newQueue(group func(string) string) *queue {
	return &queue{
		group: group, lanes: map[string][]string{},
		queued: map[string]bool{}, active: map[string]bool{}, dirty: map[string]bool{},
		wakes: map[string]time.Time{}, failures: map[string]int{}, signal: make(chan struct{}, 1),
	}
}

func (q *queue) add(key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.addLocked(key)
}

func (q *queue) addLocked(key string) {
	if q.active[key] {
		q.dirty[key] = true
		return
	}
	if !q.queued[key] {
		q.queued[key] = true
		var g string
		if q.group != nil {
			g = q.group(key)
		}
		lane, waiting := q.lanes[g]
		if !waiting {
			q.turns = append(q.turns, g)
		}
		q.lanes[g] = append(lane, key)
	}
	q.notify()
}

func (q *queue) notify() {
	select {
	case q.signal <- struct{}{}:
	default:
	}
}

// wakeAt sets key's wake-up to t, replacing the one it had; a zero t
// clears it (the key waits for a change).
func (q *queue) wakeAt(key string, t time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if t.IsZero() {
		delete(q.wakes, key)
		return
	}
	if at, ok := q.wakes[key]; ok && at.Equal(t) {
		return
	}
	q.wakes[key] = t
	heap.Push(&q.timers, Wake{Key: key, At: t})
	q.notify()
}

// promote moves the keys whose wake-up is due to the ready list and
// returns the next wake-up (zero: none).
func (q *queue) promote(now time.Time) time.Time {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.timers) > 0 {
		w := q.timers[0]
		if at, ok := q.wakes[w.Key]; !ok || !at.Equal(w.At) {
			heap.Pop(&q.timers) // stale: replaced or cleared since
			continue
		}
		if w.At.After(now) {
			return w.At
		}
		heap.Pop(&q.timers)
		delete(q.wakes, w.Key)
		q.addLocked(w.Key)
	}
	return time.Time{}
}

// take returns a ready key, or "" when none is ready.
func (q *queue) take() string {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.turns) == 0 {
		return ""
	}
	g := q.turns[0]
	q.turns[0] = ""
	q.turns = q.turns[1:]
	lane := q.lanes[g]
	k := lane[0]
	lane[0] = ""
	if lane = lane[1:]; len(lane) > 0 {
		q.lanes[g] = lane
		q.turns = append(q.turns, g) // its next key after every other group's
	} else {
		delete(q.lanes, g)
	}
	delete(q.queued, k)
	q.active[k] = true
	return k
}

// done marks key finished; if it was added meanwhile, it is queued again.
func (q *queue) done(key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.active, key)
	if q.dirty[key] {
		delete(q.dirty, key)
		q.addLocked(key)
	}
}

// failed counts a failed reconcile of key and returns how many failed in a
// row; succeeded resets the count.
func (q *queue) failed(key string) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.failures[key]++
	return q.failures[key]
}

func (q *queue) succeeded(key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.failures, key)
}

// Wake is a key's wake-up time.
type Wake struct {
	Key string
	At  time.Time
}

// Wakes is a min-heap of wake-ups for container/heap, the earliest first:
// the queue's timers, and any timed set that wakes keys (the metrics'
// census expires entries with it). Its holder drops the entries that went
// stale (replaced or cleared since they were pushed) as it pops them.
type Wakes []Wake

func (h Wakes) Len() int           { return len(h) }
func (h Wakes) Less(i, j int) bool { return h[i].At.Before(h[j].At) }
func (h Wakes) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *Wakes) Push(x any)        { *h = append(*h, x.(Wake)) }
func (h *Wakes) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
