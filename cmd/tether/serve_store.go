package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/leader"
	"github.com/tetherhq/tether/internal/store/etcdstore"
)

// storeFlags choose the store `tether serve` runs on: the embedded Badger
// store in the data directory (one replica), or an etcd cluster shared by
// several replicas, which elect one leader for the components that must
// run once per cluster.
type storeFlags struct {
	kind         string
	endpoints    []string
	etcdPrefix   string
	replicaID    string
	advertiseURL string
	electionTTL  time.Duration
	peerCAFile   string
}

func (f *storeFlags) register(flags *pflag.FlagSet) {
	flags.StringVar(&f.kind, "store", "badger", "store backend: badger (embedded, in the data directory) or etcd (several replicas; see docs/etcd.md)")
	flags.StringSliceVar(&f.endpoints, "etcd-endpoints", nil, "etcd client URLs, comma-separated (with --store etcd), e.g. http://10.0.0.1:2379,http://10.0.0.2:2379")
	flags.StringVar(&f.etcdPrefix, "etcd-prefix", "/tether/", "etcd key prefix of this control plane's keys (with --store etcd)")
	flags.StringVar(&f.replicaID, "replica-id", "", "this replica's name in the leader election, unique per replica (with --store etcd); default host/pid")
	flags.StringVar(&f.advertiseURL, "advertise-url", "", "URL the other replicas reach this one at, published in the leader election so that they can forward job-lease calls to it while it leads (with --store etcd); default from --listen, with the host name when listening on all interfaces")
	flags.DurationVar(&f.electionTTL, "election-ttl", 10*time.Second, "how long the replicas wait for a leader that died without resigning before electing another (with --store etcd; etcd's minimum is about 2s)")
	flags.StringVar(&f.peerCAFile, "peer-ca-file", "", "PEM CA bundle that verifies the leader's certificate when job-lease calls are forwarded to an https:// address (with --store etcd); default the system roots")
}

// apply opens the chosen store into cfg. The returned function closes what
// it opened, after the server has stopped (the server does not close a
// store it was given). With Badger it does nothing: controlplane.New opens
// the store in the data directory itself. scheme and addr are what the
// server listens on, the default of --advertise-url.
func (f *storeFlags) apply(ctx context.Context, cfg *controlplane.Config, log *slog.Logger, scheme string, addr net.Addr) (closeStore func() error, err error) {
	switch f.kind {
	case "badger":
		if len(f.endpoints) > 0 {
			return nil, fmt.Errorf("--etcd-endpoints needs --store etcd")
		}
		if f.advertiseURL != "" || f.peerCAFile != "" {
			return nil, fmt.Errorf("--advertise-url and --peer-ca-file need --store etcd")
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
	advertise, err := advertiseURL(f.advertiseURL, scheme, addr)
	if err != nil {
		return nil, err
	}
	if f.peerCAFile != "" {
		pem, err := os.ReadFile(f.peerCAFile)
		if err != nil {
			return nil, fmt.Errorf("--peer-ca-file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--peer-ca-file %s: no PEM certificate in it", f.peerCAFile)
		}
		cfg.PeerTLS = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	s, err := etcdstore.OpenEtcd(ctx, etcdstore.EtcdOptions{Endpoints: f.endpoints, Prefix: f.etcdPrefix, Logger: log})
	if err != nil {
		return nil, err
	}
	identity := f.replicaID
	if identity == "" {
		host, _ := os.Hostname()
		identity = fmt.Sprintf("%s/%d", host, os.Getpid())
	}
	cfg.Store = s
	cfg.Elector = &leader.Etcd{Client: s.Client(), Prefix: s.MetadataPrefix("leader"), Identity: identity, Address: advertise, TTL: f.electionTTL, Log: log}
	log.Info("replica on etcd", "replica_id", identity, "advertise_url", advertise, "etcd_prefix", f.etcdPrefix)
	return s.Close, nil
}

// advertiseURL is the URL this replica publishes: flag when set (checked),
// else scheme://addr, with the host name in place of an unspecified
// address (0.0.0.0, ::) that nobody could dial.
func advertiseURL(flag, scheme string, addr net.Addr) (string, error) {
	if flag != "" {
		u, err := url.Parse(flag)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
			return "", fmt.Errorf("--advertise-url %q: want a base URL such as http://10.0.0.7:7420", flag)
		}
		return strings.TrimRight(flag, "/"), nil
	}
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return "", fmt.Errorf("advertise address from %s: %w", addr, err)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		if host, err = os.Hostname(); err != nil {
			return "", fmt.Errorf("--advertise-url is unset and the host name is unknown: %w", err)
		}
	}
	return scheme + "://" + net.JoinHostPort(host, port), nil
}
