package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/pflag"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/leader"
	"github.com/tetherhq/tether/controlplane/store"
)

// storeFlags choose the store `tether serve` runs on: the embedded Badger
// store in the data directory (one replica), or an etcd cluster shared by
// several replicas, which elect one leader for the components that must
// run once per cluster.
type storeFlags struct {
	kind       string
	endpoints  []string
	etcdPrefix string
	replicaID  string
}

func (f *storeFlags) register(flags *pflag.FlagSet) {
	flags.StringVar(&f.kind, "store", "badger", "store backend: badger (embedded, in the data directory) or etcd (several replicas; see docs/etcd.md)")
	flags.StringSliceVar(&f.endpoints, "etcd-endpoints", nil, "etcd client URLs, comma-separated (with --store etcd), e.g. http://10.0.0.1:2379,http://10.0.0.2:2379")
	flags.StringVar(&f.etcdPrefix, "etcd-prefix", "/tether/", "etcd key prefix of this control plane's keys (with --store etcd)")
	flags.StringVar(&f.replicaID, "replica-id", "", "this replica's name in the leader election (with --store etcd); default host/pid")
}

// apply opens the chosen store into cfg. The returned function closes what
// it opened, after the server has stopped (the server does not close a
// store it was given). With Badger it does nothing: controlplane.New opens
// the store in the data directory itself.
func (f *storeFlags) apply(ctx context.Context, cfg *controlplane.Config, log *slog.Logger) (closeStore func() error, err error) {
	switch f.kind {
	case "badger":
		if len(f.endpoints) > 0 {
			return nil, fmt.Errorf("--etcd-endpoints needs --store etcd")
		}
		return func() error { return nil }, nil
	case "etcd":
	default:
		return nil, fmt.Errorf("--store %q: want badger or etcd", f.kind)
	}
	if len(f.endpoints) == 0 {
		return nil, fmt.Errorf("--store etcd needs --etcd-endpoints")
	}
	for _, e := range f.endpoints {
		if !strings.HasPrefix(e, "http://") && !strings.HasPrefix(e, "https://") {
			return nil, fmt.Errorf("--etcd-endpoints %q: want a URL such as http://127.0.0.1:2379", e)
		}
	}
	// The data directory still holds admin.token and the records.
	if cfg.DataDir != "" {
		if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
			return nil, fmt.Errorf("data dir: %w", err)
		}
	}
	s, err := store.OpenEtcd(ctx, store.EtcdOptions{Endpoints: f.endpoints, Prefix: f.etcdPrefix, Logger: log})
	if err != nil {
		return nil, err
	}
	identity := f.replicaID
	if identity == "" {
		host, _ := os.Hostname()
		identity = fmt.Sprintf("%s/%d", host, os.Getpid())
	}
	cfg.Store = s
	cfg.Elector = &leader.Etcd{Client: s.Client(), Prefix: s.MetadataPrefix("leader"), Identity: identity, Log: log}
	return s.Close, nil
}
