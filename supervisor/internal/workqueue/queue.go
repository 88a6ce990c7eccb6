package workqueue

import (
	"container/heap"
	"sync"
	"time"
)

// Queue is a reconciler's queue of keys (termination or rollout ids): a key enqueued
// while it waits is not duplicated, and a key enqueued while it is being
// reconciled runs once more afterwards. Timers ("look again at t") live in
// a heap; the clock that decides when they are due is the caller's.
type Queue struct {
	mu     sync.Mutex
	ready  []string
	queued map[string]bool
	active map[string]bool
	dirty  map[string]bool
	timers timerHeap
	signal chan struct{}
}

// New returns an empty queue.
func New() *Queue {
	return &Queue{queued: map[string]bool{}, active: map[string]bool{}, dirty: map[string]bool{}, signal: make(chan struct{}, 1)}
}

// Add enqueues key.
func (q *Queue) Add(key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.active[key] {
		q.dirty[key] = true
		return
	}
	if !q.queued[key] {
		q.queued[key] = true
		q.ready = append(q.ready, key)
	}
	q.Notify()
}

// Notify wakes the reconciler waiting on Signal (to re-evaluate its timers).
func (q *Queue) Notify() {
	select {
	case q.signal <- struct{}{}:
	default:
	}
}

// AddAt schedules key at t.
func (q *Queue) AddAt(key string, t time.Time) {
	q.mu.Lock()
	heap.Push(&q.timers, timer{key: key, at: t})
	q.mu.Unlock()
	q.Notify()
}

// Promote moves due timers to the ready list and returns the next due time.
func (q *Queue) Promote(now time.Time) time.Time {
	q.mu.Lock()
	var due []string
	for len(q.timers) > 0 && !q.timers[0].at.After(now) {
		due = append(due, heap.Pop(&q.timers).(timer).key)
	}
	next := time.Time{}
	if len(q.timers) > 0 {
		next = q.timers[0].at
	}
	q.mu.Unlock()
	for _, k := range due {
		q.Add(k)
	}
	return next
}

// Take returns a ready key, or "" when none is ready.
func (q *Queue) Take() string {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.ready) == 0 {
		return ""
	}
	k := q.ready[0]
	q.ready = q.ready[1:]
	delete(q.queued, k)
	q.active[k] = true
	return k
}

// Done marks key finished; if it was added meanwhile, it is queued again.
func (q *Queue) Done(key string) {
	q.mu.Lock()
	delete(q.active, key)
	again := q.dirty[key]
	delete(q.dirty, key)
	q.mu.Unlock()
	if again {
		q.Add(key)
	}
}

// Signal receives when a key was added or Notify called.
func (q *Queue) Signal() <-chan struct{} { return q.signal }

type timer struct {
	key string
	at  time.Time
}

type timerHeap []timer

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h timerHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *timerHeap) Push(x any)        { *h = append(*h, x.(timer)) }
func (h *timerHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
