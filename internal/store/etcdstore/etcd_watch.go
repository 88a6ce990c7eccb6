package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/tetherhq/tether/internal/store"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// etcdWatcher implements Watcher: one Watch, fed by the process's etcd
// watch of its prefix (prefixWatch). Its events are handed over without
// blocking: a consumer that falls WatchBuffer batches behind is ended with
// ErrWatchLagged, as on Badger, without ending the other Watches of its
// prefix or letting the etcd client buffer without bound.
type etcdWatcher struct {
	events chan []store.Event
	// after is the revision the Watch read: it delivers only later ones.
	after int64
	// stopContext detaches the context callback once the watch has ended
	// for another reason.
	stopContext func() bool

	store.WatchEnd
}

func (w *etcdWatcher) Events() <-chan []store.Event { return w.events }

// prefixWatch is the one etcd watch the process keeps of a prefix while
// some Watch of it runs: every component of a server that follows the
// nodes (session signals, stop rules, census, reconcilers) would otherwise
// have etcd send, and the process decode, each change once per component.
// Its goroutine turns each etcd revision into one batch and fans it out to
// the Watches; it ends them all when the etcd watch ends.
type prefixWatch struct {
	key    string // the prefix, as Etcd.prefixWatches keys it; "" for a private one
	cancel context.CancelFunc

	mu       sync.Mutex
	watchers map[*etcdWatcher]struct{}
	ended    bool // no Watch may join: the etcd watch is ending
}

// Watch watches the keys under prefix; an empty prefix watches every key.
// It first reads the current revision R (linearizably), then delivers
// every change after R that the process's etcd watch of prefix delivers
// from then on: every change committed after Watch returns is delivered,
// and none committed before the read is. The Watches of one prefix share
// one etcd watch.
//
// The etcd watch requires the member it is served by to have a leader: a
// member cut off from the quorum ends it (and its Watches, with
// ErrWatchLagged) instead of leaving it silent. So does a compaction past
// what the watch has delivered, or any other end of the etcd watch; the
// consumer re-establishes its watch and rescans, as it does after falling
// behind.
func (s *Etcd) Watch(ctx context.Context, prefix []byte) (store.Watcher, error) {
	if err := store.CheckPrefix(prefix); err != nil {
		return nil, err
	}
	if err := s.enter(ctx); err != nil {
		return nil, err
	}
	// Registered while counted as active, so that Close, which waits for
	// the active operations before it ends the watches, sees it.
	defer s.active.Done()

	opCtx, done := s.operationContext(ctx)
	resp, err := s.client.Get(opCtx, s.keys.revisionProbe(), clientv3.WithCountOnly())
	if err != nil {
		err = s.readError(opCtx, err)
		done()
		return nil, err
	}
	done()
	read := resp.Header.Revision
	w := s.newWatcher(read)
	key := string(prefix)
	s.mu.Lock()
	defer s.mu.Unlock()
	if pw := s.prefixWatches[key]; pw != nil && pw.join(ctx, w) {
		// Started at or before read+1 by an earlier Watch, or after it by
		// a concurrent one whose read came later: either way every
		// change after Watch returns reaches w.
		return w, nil
	}
	pw := s.startPrefixWatch(prefix, key, read+1)
	s.prefixWatches[key] = pw
	pw.join(ctx, w)
	return w, nil
}

// Watches returns how many Watches are open (PrefixWatches the etcd
// watches they share).
func (s *Etcd) Watches() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for pw := range s.allWatches {
		pw.mu.Lock()
		n += len(pw.watchers)
		pw.mu.Unlock()
	}
	return n
}

// PrefixWatches returns how many etcd watches the store holds open: one
// per prefix that some Watch follows.
func (s *Etcd) PrefixWatches() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.allWatches)
}

func (s *Etcd) newWatcher(after int64) *etcdWatcher {
	return &etcdWatcher{
		events: make(chan []store.Event, s.opts.WatchBuffer),
		after:  after,
	}
}

// startPrefixWatch starts the etcd watch of prefix from revision start
// (s.mu held; the caller has entered the store). key is "" for a watch
// no later Watch may join.
func (s *Etcd) startPrefixWatch(prefix []byte, key string, start int64) *prefixWatch {
	watchCtx, cancel := context.WithCancel(clientv3.WithRequireLeader(s.lifetime))
	pw := &prefixWatch{key: key, cancel: cancel, watchers: make(map[*etcdWatcher]struct{})}
	sp := s.keys.span(prefix, store.ScanLowerBound(prefix, nil))
	ch := s.client.Watch(watchCtx, sp.from, clientv3.WithRange(sp.to), clientv3.WithRev(start))
	s.allWatches[pw] = struct{}{}
	s.watchRoutines.Add(1)
	go func() {
		defer s.watchRoutines.Done()
		err := s.follow(pw, ch)
		cancel()
		for range ch {
			// The client closes ch once watchCtx has ended.
		}
		switch {
		case s.lifetime.Err() != nil:
			err = store.ErrClosed
		case err == nil:
			err = fmt.Errorf("%w: etcd ended the watch", store.ErrWatchLagged)
		}
		s.retire(pw)
		pw.mu.Lock()
		pw.ended = true
		watchers := pw.watchers
		pw.watchers = nil
		pw.mu.Unlock()
		for w := range watchers {
			w.end(err)
		}
	}()
	return pw
}

// retire forgets pw: later Watches of its prefix start an etcd watch of
// their own.
func (s *Etcd) retire(pw *prefixWatch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if pw.key != "" && s.prefixWatches[pw.key] == pw {
		delete(s.prefixWatches, pw.key)
	}
	delete(s.allWatches, pw)
}

// join adds w to pw's Watches until ctx ends; false if pw is ending.
func (pw *prefixWatch) join(ctx context.Context, w *etcdWatcher) bool {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	if pw.ended {
		return false
	}
	pw.watchers[w] = struct{}{}
	// The callback runs on its own goroutine, so it cannot deadlock on
	// pw.mu.
	w.stopContext = context.AfterFunc(ctx, func() { pw.leave(w, ctx.Err()) })
	return true
}

// leave ends w with err, unless it has ended; the etcd watch ends with
// its last Watch.
func (pw *prefixWatch) leave(w *etcdWatcher, err error) {
	pw.mu.Lock()
	ok, last := pw.removeLocked(w)
	pw.mu.Unlock()
	if !ok {
		return
	}
	w.end(err)
	if last {
		pw.cancel()
	}
}

// removeLocked removes w (pw.mu held): ok if it was there, last if it was
// the last Watch, when no other may join.
func (pw *prefixWatch) removeLocked(w *etcdWatcher) (ok, last bool) {
	if _, ok := pw.watchers[w]; !ok {
		return false, false
	}
	delete(pw.watchers, w)
	if len(pw.watchers) == 0 {
		pw.ended = true
		return true, true
	}
	return true, false
}

// end records err and closes w's events (once: the caller removed w from
// its prefixWatch).
func (w *etcdWatcher) end(err error) {
	if w.stopContext != nil {
		w.stopContext()
	}
	w.End(err)
	close(w.events)
}

// follow delivers the watch's events until ch closes or fails.
func (s *Etcd) follow(pw *prefixWatch, ch clientv3.WatchChan) error {
	for resp := range ch {
		if err := resp.Err(); err != nil {
			if errors.Is(err, rpctypes.ErrCompacted) {
				return fmt.Errorf("%w: etcd compacted revision %d before the watch delivered it", store.ErrWatchLagged, resp.CompactRevision)
			}
			return fmt.Errorf("%w: etcd ended the watch: %v", store.ErrWatchLagged, err)
		}
		// One etcd response holds whole revisions (responses are split
		// only on request, with WithFragment), possibly several: each
		// becomes one batch.
		s.stats.watchEvents.Add(uint64(len(resp.Events)))
		var batches [][]store.Event
		var batch []store.Event
		for _, ev := range resp.Events {
			e := store.Event{
				Type:     store.EventPut,
				Key:      s.keys.callerKey(ev.Kv.Key),
				Value:    ev.Kv.Value,
				Revision: uint64(ev.Kv.ModRevision),
			}
			if ev.Type == mvccpb.DELETE {
				e.Type, e.Value = store.EventDelete, nil
			} else if e.Value == nil {
				e.Value = []byte{}
			}
			if len(batch) > 0 && batch[0].Revision != e.Revision {
				batches = append(batches, batch)
				batch = nil
			}
			batch = append(batch, e)
		}
		if len(batch) > 0 {
			batches = append(batches, batch)
		}
		pw.deliver(batches)
	}
	return nil
}

var errWatchBufferFull = fmt.Errorf("%w: the consumer left too many transactions unread", store.ErrWatchLagged)

// deliver hands batches to every Watch (those after its read), ending the
// ones whose buffer is full. Batches are shared between the Watches, which
// must not modify them.
func (pw *prefixWatch) deliver(batches [][]store.Event) {
	var lagged []*etcdWatcher
	last := false
	pw.mu.Lock()
	for w := range pw.watchers {
		for _, batch := range batches {
			if int64(batch[0].Revision) <= w.after {
				continue
			}
			select {
			case w.events <- batch:
				continue
			default:
			}
			// Removed before the lock is let go, so that no later
			// batch reaches it past the one it missed.
			_, last = pw.removeLocked(w)
			lagged = append(lagged, w)
			break
		}
	}
	pw.mu.Unlock()
	for _, w := range lagged {
		w.end(errWatchBufferFull)
	}
	if last {
		pw.cancel()
	}
}
