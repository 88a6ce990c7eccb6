package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/leader"
	"github.com/tetherhq/tether/internal/etcdlocal"
	"github.com/tetherhq/tether/internal/store/etcdstore"
)

func init() {
	Register("server/etcd-vs-badger", serverEtcdVsBadger)
}

// serverEtcdVsBadger measures the whole control plane on etcd beside the
// same on the embedded Badger store, in the same run, through the real
// server on loopback: durable lease renewals on Channel streams (64 and
// 1,024 leases, closed loop per lease, as lease/renew measures them) and
// the time to terminate a 1,000-agent subtree in abort mode, a tool call in
// flight on one agent in ten (as supervisor/terminate measures it). etcd is a local single member
// started here with the flags the store needs, its data on the bench
// directory's disk; the control plane is one replica, which leads.
func serverEtcdVsBadger(ctx context.Context, r *Report) error {
	cluster, stop, err := startLocalEtcd(ctx, r, "tether-bench-etcd-server-*")
	switch {
	case errors.Is(err, etcdlocal.ErrNoBinary):
		fmt.Fprintln(os.Stderr, "  server/etcd-vs-badger: etcd not installed (apt-get install etcd-server): measuring Badger alone")
		cluster = nil
	case err != nil:
		return err
	default:
		defer stop()
	}
	type backend struct {
		name  string
		start func(context.Context) (*benchServer, func(), error)
	}
	backends := []backend{{"badger", func(ctx context.Context) (*benchServer, func(), error) {
		srv, err := startServer(ctx, r, disableRateLimit)
		if err != nil {
			return nil, nil, err
		}
		return srv, srv.Stop, nil
	}}}
	if cluster != nil {
		backends = append(backends, backend{"etcd", func(ctx context.Context) (*benchServer, func(), error) {
			return startEtcdServer(ctx, r, cluster)
		}})
	}

	// Renewals: both servers run side by side and each concurrency is
	// measured on both back to back, so the ratio compares figures taken
	// under the same conditions.
	servers := make([]*benchServer, len(backends))
	holders := make([][]leaseHolder, len(backends))
	for i, b := range backends {
		srv, stop, err := b.start(ctx)
		if err != nil {
			return fmt.Errorf("%s: %w", b.name, err)
		}
		defer stop()
		servers[i] = srv
		if holders[i], err = leaseHolders(ctx, srv, leaseStreams(1024)); err != nil {
			return fmt.Errorf("%s: %w", b.name, err)
		}
	}
	for _, n := range []int{64, 1024} {
		rates := map[string]float64{}
		for i, b := range backends {
			leases, err := offerLeases(ctx, servers[i], holders[i][:leaseStreams(n)], n)
			if err != nil {
				return fmt.Errorf("%s, %d leases: %w", b.name, n, err)
			}
			m, err := measureStreamRenew(ctx, r.Duration, leases, 1)
			if err != nil {
				return fmt.Errorf("%s, %d leases: %w", b.name, n, err)
			}
			m.report(r, fmt.Sprintf("server/%s/renew-stream/leases=%d", b.name, n))
			rates[b.name] = m.rate
		}
		if rates["etcd"] > 0 {
			r.Add(fmt.Sprintf("server/etcd-vs-badger/renew-stream/leases=%d", n), rates["etcd"]/rates["badger"], "x")
		}
	}

	// Terminations: a fresh server each, so that the leases above do not
	// weigh on it.
	const agents = 1000
	times := map[string]time.Duration{}
	for _, b := range backends {
		srv, stop, err := b.start(ctx)
		if err != nil {
			return fmt.Errorf("%s: %w", b.name, err)
		}
		root, err := buildSubtree(ctx, srv, agents)
		if err != nil {
			stop()
			return fmt.Errorf("%s: %w", b.name, err)
		}
		calls, stopGate, err := callsInFlight(ctx, srv, root, agents/10)
		if err != nil {
			stop()
			return fmt.Errorf("%s: %w", b.name, err)
		}
		elapsed, nodes, err := timeTermination(ctx, srv, root)
		acked := stopGate()
		stop()
		if err != nil {
			return fmt.Errorf("%s: %w", b.name, err)
		}
		if nodes != agents {
			return fmt.Errorf("%s: the record of a %d-agent subtree lists %d nodes", b.name, agents, nodes)
		}
		if acked != calls {
			return fmt.Errorf("%s: %d calls in flight, %d cancel acks", b.name, calls, acked)
		}
		r.Add(fmt.Sprintf("server/%s/terminate-abort/agents=%d", b.name, agents), float64(elapsed.Microseconds())/1000, "ms")
		times[b.name] = elapsed
	}
	if times["etcd"] > 0 {
		r.Add(fmt.Sprintf("server/etcd-vs-badger/terminate-abort/agents=%d", agents), float64(times["etcd"])/float64(times["badger"]), "x")
	}
	return nil
}

var etcdServers int

// startEtcdServer runs a control plane on a fresh keyspace of cluster: one
// replica, which wins the election at once.
func startEtcdServer(ctx context.Context, r *Report, cluster *etcdlocal.Cluster) (*benchServer, func(), error) {
	etcdServers++
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	st, err := etcdstore.OpenEtcd(ctx, etcdstore.EtcdOptions{
		Endpoints: cluster.Endpoints(),
		Prefix:    fmt.Sprintf("/bench/server-%d/", etcdServers),
		Logger:    quiet,
	})
	if err != nil {
		return nil, nil, err
	}
	srv, err := startServer(ctx, r, disableRateLimit, func(cfg *controlplane.Config) {
		cfg.Store = st
		cfg.Elector = &leader.Etcd{Client: st.Client(), Prefix: st.MetadataPrefix("leader"), Identity: "bench", Log: quiet}
	})
	if err != nil {
		st.Close()
		return nil, nil, err
	}
	return srv, func() { srv.Stop(); st.Close() }, nil
}
