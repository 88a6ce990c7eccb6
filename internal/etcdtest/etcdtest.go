// Package etcdtest starts real etcd servers for tests: a single member by
// default, a three-member cluster under `make test-cluster`, each on free
// loopback ports with a temporary data directory, healthy when Start
// returns and stopped at the test's cleanup (internal/etcdlocal does the
// work).
//
// Without an etcd binary a test is skipped, with a message saying so —
// unless TETHER_REQUIRE_ETCD is set (CI sets it), when it fails: a machine
// that should run the etcd tests never passes by silently skipping them.
package etcdtest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/etcdlocal"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/etcdstore"
)

const (
	// RequireEnv, when set to anything, turns a missing etcd binary from a
	// skip into a failure.
	RequireEnv = "TETHER_REQUIRE_ETCD"
	// MembersEnv sets how many members Start starts; default 1.
	MembersEnv = "TETHER_ETCD_MEMBERS"
)

// Start starts the etcd a test runs against: one member, or as many as
// TETHER_ETCD_MEMBERS says (`make test-cluster` sets 3), with the flags the
// store needs (etcdlocal.StoreFlags).
func Start(t testing.TB) *etcdlocal.Cluster {
	t.Helper()
	members := 1
	if v := os.Getenv(MembersEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number of members", MembersEnv, v)
		}
		members = n
	}
	return start(t, etcdlocal.Config{Members: members})
}

// StartCluster starts a cluster of members members, whatever the
// environment says.
func StartCluster(t testing.TB, members int) *etcdlocal.Cluster {
	t.Helper()
	return start(t, etcdlocal.Config{Members: members})
}

// StartWithFlags starts one member with flags instead of the store's
// (an empty slice: etcd's defaults).
func StartWithFlags(t testing.TB, flags []string) *etcdlocal.Cluster {
	t.Helper()
	if flags == nil {
		flags = []string{}
	}
	return start(t, etcdlocal.Config{Members: 1, Flags: flags})
}

// RequireBinary returns the etcd binary's path, or skips t (fails it when
// TETHER_REQUIRE_ETCD is set) if there is none.
func RequireBinary(t testing.TB) string {
	t.Helper()
	path, err := etcdlocal.Binary()
	if err != nil {
		if os.Getenv(RequireEnv) == "" {
			t.Skipf("%v; skipping this etcd test (set %s=1 to fail instead)", err, RequireEnv)
		}
		t.Fatalf("%v, and %s is set: the etcd tests must run here", err, RequireEnv)
	}
	return path
}

func start(t testing.TB, cfg etcdlocal.Config) *etcdlocal.Cluster {
	t.Helper()
	RequireBinary(t)
	cfg.Dir = t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := etcdlocal.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("start etcd: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("stop etcd: %v", err)
		}
	})
	return c
}

var prefixes atomic.Uint64

// Prefix returns an etcd key prefix no other store of this test binary
// uses, so that tests can share one etcd.
func Prefix(t testing.TB) string {
	name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
	return fmt.Sprintf("/test/%s/%d/", name, prefixes.Add(1))
}

// OpenStore opens a store on c under a fresh Prefix, logging warnings to
// the test's output, and closes it at cleanup. mutate adjusts the options
// before opening.
func OpenStore(t testing.TB, c *etcdlocal.Cluster, mutate ...func(*etcdstore.EtcdOptions)) *etcdstore.Etcd {
	t.Helper()
	opts := etcdstore.EtcdOptions{
		Endpoints: c.Endpoints(),
		Prefix:    Prefix(t),
		Logger:    slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	for _, m := range mutate {
		m(&opts)
	}
	s, err := etcdstore.OpenEtcd(t.Context(), opts)
	if err != nil {
		t.Fatalf("OpenEtcd: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil && !errors.Is(err, store.ErrClosed) {
			t.Errorf("close etcd store: %v", err)
		}
	})
	return s
}
