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
	return s.watchFrom(ctx, prefix, revision), nil
}
