package etcdstore

import (
	"context"

	"github.com/tetherhq/tether/internal/store"
)

// EtcdWatchFrom starts a watch at a given revision, which callers of Watch
// cannot: tests use it to watch from a compacted revision.
func EtcdWatchFrom(ctx context.Context, s *Etcd, prefix []byte, revision int64) (store.Watcher, error) {
	if err := s.enter(ctx); err != nil {
		return nil, err
	}
	defer s.active.Done()
	w := s.newWatcher(revision - 1)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.startPrefixWatch(prefix, "", revision).join(ctx, w)
	return w, nil
}

// HoldCommits makes s's group commit behave as if a merged commit were in
// flight: commits queue until release, which sends them as the queue's
// merged commits. Tests use it to put chosen Updates in one batch.
func HoldCommits(s *Etcd) (release func()) {
	s.group.hold()
	return func() { s.flushGroup() }
}

// QueuedCommits is how many commits wait in s's group commit queue.
func QueuedCommits(s *Etcd) int { return s.group.waiting() }

// HoldReads makes s's first reads queue as if a merged one were in
// flight, until release sends them.
func HoldReads(s *Etcd) (release func()) {
	s.reads.hold()
	return func() { s.flushReads() }
}

// QueuedReads is how many first reads wait in s's queue.
func QueuedReads(s *Etcd) int { return s.reads.waiting() }
