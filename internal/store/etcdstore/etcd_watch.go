package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"github.com/tetherhq/tether/internal/store"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// etcdWatcher implements Watcher over one etcd watch. Its goroutine turns
// each etcd revision into one batch and hands it over without blocking: a
// consumer that falls WatchBuffer batches behind is ended with
// ErrWatchLagged, as on Badger, instead of letting the etcd client buffer
// without bound.
type etcdWatcher struct {
	events   chan []store.Event
	finished chan struct{} // closed after events

	store.WatchEnd
}

func (w *etcdWatcher) Events() <-chan []store.Event { return w.events }

// Watch watches the keys under prefix; an empty prefix watches every key.
// It first reads the current revision R (linearizably), then watches from
// R+1: every change committed after Watch returns is delivered, and none
// committed before the read is.
//
// The watch requires the etcd member it is served by to have a leader: a
// member cut off from the quorum ends it (with ErrWatchLagged) instead of
// leaving it silent. So does a compaction past what the watch has
// delivered, or any other end of the etcd watch; the consumer re-establishes
// its watch and rescans, as it does after falling behind.
func (s *Etcd) Watch(ctx context.Context, prefix []byte) (store.Watcher, error) {
	if err := store.CheckPrefix(prefix); err != nil {
		return nil, err
	}
	if err := s.enter(ctx); err != nil {
		return nil, err
	}
	// Registered while counted as active, so that Close, which waits for
	// the active operations before it ends the watchers, sees it.
	defer s.active.Done()

	opCtx, done := s.operationContext(ctx)
	resp, err := s.client.Get(opCtx, s.keys.revisionProbe(), clientv3.WithCountOnly())
	if err != nil {
		err = s.readError(opCtx, err)
		done()
		return nil, err
	}
	done()
	return s.watchFrom(ctx, prefix, resp.Header.Revision+1), nil
}

// Watches returns how many watches are open, each an etcd watch of its
// own.
func (s *Etcd) Watches() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.watchers)
}

// watchFrom starts a watch of prefix from revision start. The caller has
// entered the store.
func (s *Etcd) watchFrom(ctx context.Context, prefix []byte, start int64) *etcdWatcher {
	w := &etcdWatcher{
		events:   make(chan []store.Event, s.opts.WatchBuffer),
		finished: make(chan struct{}),
	}
	watchCtx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	stop := context.AfterFunc(s.lifetime, cancel)
	sp := s.keys.span(prefix, store.ScanLowerBound(prefix, nil))
	ch := s.client.Watch(watchCtx, sp.from, clientv3.WithRange(sp.to), clientv3.WithRev(start))

	s.mu.Lock()
	s.watchers[w] = struct{}{}
	s.mu.Unlock()
	go func() {
		err := s.follow(w, ch)
		stop()
		cancel()
		for range ch {
			// The client closes ch once watchCtx has ended.
		}
		switch {
		case s.lifetime.Err() != nil:
			err = store.ErrClosed
		case ctx.Err() != nil:
			err = ctx.Err()
		case err == nil:
			err = fmt.Errorf("%w: etcd ended the watch", store.ErrWatchLagged)
		}
		s.mu.Lock()
		delete(s.watchers, w)
		s.mu.Unlock()
		w.End(err)
		close(w.events)
		close(w.finished)
	}()
	return w
}

// follow delivers the watch's events until ch closes or fails, or the
// consumer falls behind.
func (s *Etcd) follow(w *etcdWatcher, ch clientv3.WatchChan) error {
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
				if !w.deliver(batch) {
					return errWatchBufferFull
				}
				batch = nil
			}
			batch = append(batch, e)
		}
		if len(batch) > 0 && !w.deliver(batch) {
			return errWatchBufferFull
		}
	}
	return nil
}

var errWatchBufferFull = fmt.Errorf("%w: the consumer left too many transactions unread", store.ErrWatchLagged)

func (w *etcdWatcher) deliver(batch []store.Event) bool {
	select {
	case w.events <- batch:
		return true
	default:
		return false
	}
}
