package badgerstore

import (
	"context"
	"github.com/tetherhq/tether/internal/store"
	"sync"
	"sync/atomic"
)

// Request states. A request moves from queued to exactly one of the others,
// by compare-and-swap, so the caller and the committer agree on whether its
// writes can still happen.
const (
	requestQueued    int32 = iota
	requestTaken           // the committer owns it: it will run and be answered
	requestAbandoned       // its context ended first: it will never run
)

// request is one Update waiting for the committer.
type request struct {
	ctx   context.Context
	fn    func(store.Txn) error
	state atomic.Int32
	// err is written by the committer before done is closed.
	err  error
	done chan struct{}
}

func (r *request) answer(err error) {
	r.err = err
	close(r.done)
}

// requestQueue hands Update requests to the committer. It is a slice behind
// a mutex rather than a channel so that the committer can take everything
// that is waiting in one step, and so that closing it can never race with a
// send.
type requestQueue struct {
	mu     sync.Mutex
	items  []*request
	closed bool
	// ready holds a token whenever items may be non-empty or the queue was
	// closed; the committer waits on it instead of polling.
	ready chan struct{}
}

func newRequestQueue() *requestQueue {
	return &requestQueue{ready: make(chan struct{}, 1)}
}

// push enqueues r, or returns ErrClosed once the queue is closed. It does
// not wake the committer: the caller then commits the queue itself or
// signals (committer.submit).
func (q *requestQueue) push(r *request) error {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return store.ErrClosed
	}
	q.items = append(q.items, r)
	q.mu.Unlock()
	return nil
}

func (q *requestQueue) signal() {
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// take returns up to max of the queued requests, oldest first, reusing
// spare as storage, without waiting: none (an empty slice) when none is
// queued, and closed once the queue is closed. Only the committer's
// leader may call it (committer.lead).
func (q *requestQueue) take(max int, spare []*request) (reqs []*request, closed bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := len(q.items)
	switch {
	case n == 0:
		return spare[:0], q.closed
	case n <= max:
		// Swap buffers: the common case allocates nothing.
		out := q.items
		q.items = spare[:0]
		return out, q.closed
	}
	out := append(spare[:0], q.items[:max]...)
	rest := copy(q.items, q.items[max:])
	clear(q.items[rest:])
	q.items = q.items[:rest]
	return out, false
}

// close makes further pushes fail; requests already queued are still taken.
func (q *requestQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.signal()
}

// len is the number of requests waiting for the committer.
func (q *requestQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items)
}
