package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"

	"github.com/tetherhq/tether/internal/etcdlocal"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/etcdstore"
)

func init() {
	Register("store/etcd-durable-commit", storeEtcdDurableCommit)
}

// storeEtcdDurableCommit measures the store's durable Update throughput on
// a single local etcd member (started here, with the flags the store needs,
// its data on r.Dir) beside the Badger store's group commit measured in
// the same run: blind writes of one key per writer, and at 64 writers a
// read-modify-write of that key (an Update that reads the key, so its
// commit compares the key's revision: the shape of a fenced lease renew).
func storeEtcdDurableCommit(ctx context.Context, r *Report) error {
	cluster, stop, err := startLocalEtcd(ctx, r, "tether-bench-etcd-*")
	if err != nil {
		return err
	}
	defer stop()

	for _, writers := range []int{1, 64, 1024} {
		rate, err := measureEtcdUpdates(ctx, r, cluster, fmt.Sprintf("/bench/blind-%d/", writers), writers, false)
		if err != nil {
			return fmt.Errorf("etcd, %d writers: %w", writers, err)
		}
		r.Add(fmt.Sprintf("store/etcd/writers=%d", writers), rate, "ops/s")
		badgerRate, _, err := measureGroupCommit(ctx, r, writers)
		if err != nil {
			return fmt.Errorf("badger group commit, %d writers: %w", writers, err)
		}
		r.Add(fmt.Sprintf("store/etcd/writers=%d/badger-group-commit", writers), badgerRate, "ops/s")
		r.Add(fmt.Sprintf("store/etcd-vs-group-commit/writers=%d", writers), rate/badgerRate, "x")
	}
	rate, err := measureEtcdUpdates(ctx, r, cluster, "/bench/rmw-64/", 64, true)
	if err != nil {
		return fmt.Errorf("etcd read-modify-write, 64 writers: %w", err)
	}
	r.Add("store/etcd/read-modify-write/writers=64", rate, "ops/s")
	return nil
}

// startLocalEtcd starts a single local etcd member, with the flags the store
// needs, its data in a new directory under r.Dir named after pattern; stop
// stops it and removes the directory. Without an etcd binary the error
// wraps etcdlocal.ErrNoBinary.
func startLocalEtcd(ctx context.Context, r *Report, pattern string, flags ...string) (cluster *etcdlocal.Cluster, stop func(), err error) {
	dir, err := os.MkdirTemp(r.Dir, pattern)
	if err != nil {
		return nil, nil, err
	}
	cluster, err = etcdlocal.Start(ctx, etcdlocal.Config{Dir: dir, Flags: append(slices.Clone(etcdlocal.StoreFlags), flags...)})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, nil, fmt.Errorf("start etcd: %w", err)
	}
	return cluster, func() {
		cluster.Stop()
		_ = os.RemoveAll(dir)
	}, nil
}

// withLocalEtcd runs fn with a single local etcd member (startLocalEtcd),
// and stops it after; without an etcd binary it says that scenario is
// skipped and returns nil.
func withLocalEtcd(ctx context.Context, r *Report, scenario, pattern string, fn func(*etcdlocal.Cluster) error) error {
	cluster, stop, err := startLocalEtcd(ctx, r, pattern)
	if errors.Is(err, etcdlocal.ErrNoBinary) {
		fmt.Fprintf(os.Stderr, "  %s: etcd not installed (apt-get install etcd-server): skipped\n", scenario)
		return nil
	}
	if err != nil {
		return err
	}
	defer stop()
	return fn(cluster)
}

// withEtcdServer runs fn with a control plane on a single local etcd
// member (withLocalEtcd, startEtcdServer), and stops both after.
func withEtcdServer(ctx context.Context, r *Report, scenario, pattern string, fn func(*etcdlocal.Cluster, *benchServer) error) error {
	return withLocalEtcd(ctx, r, scenario, pattern, func(cluster *etcdlocal.Cluster) error {
		srv, stop, err := startEtcdServer(ctx, r, cluster)
		if err != nil {
			return err
		}
		defer stop()
		return fn(cluster, srv)
	})
}

// measureEtcdUpdates runs Updates of one key per writer on a fresh store
// under prefix; with read, each Update reads its key before writing it.
func measureEtcdUpdates(ctx context.Context, r *Report, cluster *etcdlocal.Cluster, prefix string, writers int, read bool) (float64, error) {
	s, err := etcdstore.OpenEtcd(ctx, etcdstore.EtcdOptions{
		Endpoints: cluster.Endpoints(),
		Prefix:    prefix,
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		return 0, err
	}
	keys := writerKeys(writers)
	rate, err := Throughput(ctx, writers, r.Duration, func(ctx context.Context, w int) error {
		return s.Update(ctx, func(tx store.Txn) error {
			if read {
				if _, err := tx.Get(keys[w]); err != nil && !errors.Is(err, store.ErrNotFound) {
					return err
				}
			}
			return tx.Put(keys[w], storeValue)
		})
	})
	if closeErr := s.Close(); err == nil {
		err = closeErr
	}
	return rate, err
}
