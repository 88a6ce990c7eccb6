package testserver

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/leader"
	"github.com/tetherhq/tether/internal/etcdlocal"
	"github.com/tetherhq/tether/internal/etcdtest"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	"github.com/tetherhq/tether/internal/store/etcdstore"
)

// StoreEnv selects the store Start and StartIn run control planes on:
// unset or "badger", Badger in the data directory; "etcd", an etcd member
// started for the test (internal/etcdtest), so that the end-to-end suites
// run unchanged on both backends:
//
//	TETHER_TEST_STORE=etcd go test ./controlplane/...
const StoreEnv = "TETHER_TEST_STORE"

// WithEtcdStore runs the control plane on s, electing its leader among the
// servers that share s's etcd prefix; replicaID names this one, and its
// address (http://<cfg.Listen>, which Start sets) is where the others
// forward job-lease calls while it leads. The server does not close s.
func WithEtcdStore(s *etcdstore.Etcd, replicaID string) Option {
	return func(cfg *controlplane.Config) {
		cfg.Store = s
		cfg.Elector = &leader.Etcd{Client: s.Client(), Prefix: s.MetadataPrefix("leader"), Identity: replicaID, Address: "http://" + cfg.Listen, Log: cfg.Logger}
	}
}

// WithElectionTTL sets the session TTL of the leader election set by an
// earlier WithEtcdStore: how long the other replicas wait for a leader
// that died without resigning.
func WithElectionTTL(ttl time.Duration) Option {
	return func(cfg *controlplane.Config) {
		if e, ok := cfg.Elector.(*leader.Etcd); ok {
			e.TTL = ttl
		}
	}
}

// etcdByDataDir remembers the etcd keyspace of each data directory, so
// that a server restarted on the same directory (StartIn twice in one
// test) finds its state again, as it would in Badger.
var etcdByDataDir sync.Map // data dir → etcdSpace

type etcdSpace struct {
	cluster *etcdlocal.Cluster
	prefix  string
}

// storeFromEnv returns the option StoreEnv asks for, nil for Badger.
func storeFromEnv(t testing.TB, dataDir string) Option {
	t.Helper()
	switch kind := os.Getenv(StoreEnv); kind {
	case "", "badger":
		return nil
	case "etcd":
	default:
		t.Fatalf("%s=%q: want badger or etcd", StoreEnv, kind)
	}
	space, ok := etcdByDataDir.Load(dataDir)
	if !ok {
		space = etcdSpace{cluster: etcdtest.Start(t), prefix: etcdtest.Prefix(t)}
		etcdByDataDir.Store(dataDir, space)
		t.Cleanup(func() { etcdByDataDir.Delete(dataDir) })
	}
	sp := space.(etcdSpace)
	s := etcdtest.OpenStore(t, sp.cluster, func(o *etcdstore.EtcdOptions) { o.Prefix = sp.prefix })
	return WithEtcdStore(s, dataDir)
}

// OpenStoreOf opens the store the servers started on dataDir (StartIn)
// ran on, whichever StoreEnv chose — Badger in dataDir, or the etcd
// keyspace of dataDir — for a test to read or change it between a
// server's stop and the next start. The caller closes it (Close is safe
// to call again); no server may run on dataDir meanwhile.
func OpenStoreOf(t testing.TB, dataDir string) store.Store {
	t.Helper()
	if os.Getenv(StoreEnv) != "etcd" {
		st, err := badgerstore.OpenBadger(filepath.Join(dataDir, "store"), badgerstore.BadgerOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	space, ok := etcdByDataDir.Load(dataDir)
	if !ok {
		t.Fatalf("no etcd keyspace for %s: start a server on it first (StartIn)", dataDir)
	}
	sp := space.(etcdSpace)
	return etcdtest.OpenStore(t, sp.cluster, func(o *etcdstore.EtcdOptions) { o.Prefix = sp.prefix })
}
