package supervisor

import (
	"context"
	"errors"
	"sync"

	"github.com/tetherhq/tether/internal/store"
)

// terminationWatches follows every termination with one store watch for
// all the streams that watch terminations (Supervisor.Watch), and hands
// each its own termination's changes. A store watch per stream made every
// commit of the server pay for each open stream (the store hands a
// commit's events to every watch in turn), and an agent may open as many
// as its lineage's share of streams on a termination it requested. Here a
// commit costs one watch, and a termination's change is handed only to the
// streams that watch it. The zero value is ready; the store watch runs
// while some stream watches.
type terminationWatches struct {
	mu   sync.Mutex
	run  *watchRun // nil while nobody watches
	subs map[string]map[*terminationSub]struct{}
}

// watchRun is one store watch of the terminations: ready is closed once
// it is established (cancel then stops it) or failed to be (err).
type watchRun struct {
	ready  chan struct{}
	cancel context.CancelFunc
	err    error
}

// maxQueuedChanges bounds the changes a watching stream has not taken
// yet; past it the stream reads its termination again instead (the latest
// state, which is what a watch promises), so a stream too slow to send
// holds no more than this in memory.
const maxQueuedChanges = 16

// terminationSub is one stream's subscription to a termination: its
// stored values in commit order, or a request to read it again (reread)
// when more were queued than maxQueuedChanges or the store watch had to
// be established again, or the error that ended the store watch.
type terminationSub struct {
	id     string
	notify chan struct{} // one pending wake-up

	mu     sync.Mutex
	queued [][]byte
	reread bool
	err    error
}

// subscribe registers a stream's interest in termination id once a store
// watch of the terminations is established, starting one if none runs: a
// change committed from then on reaches the subscription, so a read after
// subscribe misses nothing. It waits for the watch no longer than ctx.
func (w *terminationWatches) subscribe(ctx context.Context, st store.Store, id string) (*terminationSub, error) {
	for {
		w.mu.Lock()
		run := w.run
		if run == nil {
			run = &watchRun{ready: make(chan struct{})}
			w.run = run
			go w.start(st, run)
		}
		select {
		case <-run.ready:
			if run.err != nil {
				w.mu.Unlock()
				return nil, run.err
			}
			sub := &terminationSub{id: id, notify: make(chan struct{}, 1)}
			if w.subs == nil {
				w.subs = map[string]map[*terminationSub]struct{}{}
			}
			m := w.subs[id]
			if m == nil {
				m = map[*terminationSub]struct{}{}
				w.subs[id] = m
			}
			m[sub] = struct{}{}
			w.mu.Unlock()
			return sub, nil
		default:
		}
		w.mu.Unlock()
		select {
		case <-run.ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// start establishes run's store watch, outside the lock (on etcd it reads
// the cluster's revision first), then follows it.
func (w *terminationWatches) start(st store.Store, run *watchRun) {
	ctx, cancel := context.WithCancel(context.Background())
	sw, err := st.Watch(ctx, []byte(prefixTermination))
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		cancel()
		run.err = err
		w.run = nil
		close(run.ready)
		return
	}
	run.cancel = cancel
	close(run.ready)
	go w.follow(ctx, st, run, sw)
}

// unsubscribe ends a subscription; the store watch stops with the last.
func (w *terminationWatches) unsubscribe(sub *terminationSub) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if m := w.subs[sub.id]; m != nil {
		delete(m, sub)
		if len(m) == 0 {
			delete(w.subs, sub.id)
		}
	}
	if len(w.subs) == 0 && w.run != nil && w.run.cancel != nil {
		// A run still being established is left to the next subscriber
		// (or stays, one watch, until one comes and goes).
		w.run.cancel()
		w.run = nil
	}
}

// follow hands the store watch's changes to the subscriptions until run
// is stopped. A watch that falls behind is established again and every
// subscription reads its termination again; one that fails otherwise (the
// store closed) ends every subscription with its error.
func (w *terminationWatches) follow(ctx context.Context, st store.Store, run *watchRun, sw store.Watcher) {
	for {
		for batch := range sw.Events() {
			w.deliver(run, batch)
		}
		if ctx.Err() != nil {
			return // nobody watches any more
		}
		err := sw.Err()
		if errors.Is(err, store.ErrWatchLagged) {
			if sw, err = st.Watch(ctx, []byte(prefixTermination)); err == nil {
				w.each(run, func(sub *terminationSub) { sub.queued, sub.reread = nil, true })
				continue
			}
		}
		if err == nil {
			err = store.ErrClosed
		}
		// The subscriptions are ended and dropped under one hold of the
		// lock: a subscribe between the two found the run still live and
		// its subscription was dropped unwoken, its Watch waiting until
		// its context ended rather than failing (and a drain follower's
		// retry never ran).
		w.mu.Lock()
		if w.run == run {
			w.eachLocked(func(sub *terminationSub) { sub.err = err })
			run.cancel()
			w.run, w.subs = nil, nil
		}
		w.mu.Unlock()
		return
	}
}

// deliver hands a batch's changed terminations to their subscriptions.
func (w *terminationWatches) deliver(run *watchRun, batch []store.Event) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.run != run {
		return
	}
	for _, ev := range batch {
		if ev.Type != store.EventPut || len(ev.Key) <= len(prefixTermination) {
			continue
		}
		for sub := range w.subs[string(ev.Key[len(prefixTermination):])] {
			sub.mu.Lock()
			switch {
			case sub.reread:
			case len(sub.queued) >= maxQueuedChanges:
				sub.queued, sub.reread = nil, true
			default:
				sub.queued = append(sub.queued, ev.Value) // shared, never modified
			}
			sub.mu.Unlock()
			sub.wake()
		}
	}
}

// each applies f to every subscription of run, under its lock, and wakes
// it.
func (w *terminationWatches) each(run *watchRun, f func(*terminationSub)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.run != run {
		return
	}
	w.eachLocked(f)
}

// eachLocked applies f to every subscription, under its lock, and wakes
// it; w.mu is held.
func (w *terminationWatches) eachLocked(f func(*terminationSub)) {
	for _, m := range w.subs {
		for sub := range m {
			sub.mu.Lock()
			f(sub)
			sub.mu.Unlock()
			sub.wake()
		}
	}
}

func (sub *terminationSub) wake() {
	select {
	case sub.notify <- struct{}{}:
	default:
	}
}

// next waits for the subscription's next changes: the stored values in
// commit order, or reread when the stream must read its termination again.
func (sub *terminationSub) next(ctx context.Context) (values [][]byte, reread bool, err error) {
	select {
	case <-ctx.Done():
		return nil, false, ctx.Err()
	case <-sub.notify:
	}
	sub.mu.Lock()
	defer sub.mu.Unlock()
	values, reread, err = sub.queued, sub.reread, sub.err
	sub.queued, sub.reread = nil, false
	return values, reread, err
}
