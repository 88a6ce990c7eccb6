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
	Register("server/etcd-follower", serverEtcdFollower)
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
	var stops []func()
	stopRenewalServers := func() {
		for _, stop := range stops {
			stop()
		}
		stops = nil
	}
	defer stopRenewalServers()
	for i, b := range backends {
		srv, stop, err := b.start(ctx)
		if err != nil {
			return fmt.Errorf("%s: %w", b.name, err)
		}
		stops = append(stops, stop)
		servers[i] = srv
		if holders[i], err = leaseHolders(ctx, srv, leaseStreams(1024)); err != nil {
			return fmt.Errorf("%s: %w", b.name, err)
		}
	}
	// Each concurrency is measured twice on each store, in the order
	// Badger, etcd, etcd, Badger: a load on the machine that grows or
	// falls through the four measurements weighs on both stores alike,
	// where one pass (Badger, then etcd) charged all of it to one store.
	// The first pass reports the details (commits, CPU); the ratio is of
	// the summed rates, and each pass's own ratio is reported beside it.
	for _, n := range []int{64, 1024} {
		rates := map[string][2]float64{}
		cpu := map[string]time.Duration{}
		leases := make([][]*benchLease, len(backends))
		for i, b := range backends {
			if leases[i], err = offerLeases(ctx, servers[i], holders[i][:leaseStreams(n)], n); err != nil {
				return fmt.Errorf("%s, %d leases: %w", b.name, n, err)
			}
		}
		for pass := range 2 {
			for k := range backends {
				i := k
				if pass == 1 {
					i = len(backends) - 1 - k
				}
				b := backends[i]
				var m leaseMeasurement
				if pass == 0 {
					m, err = measureStreamWithCommits(ctx, r, servers[i], fmt.Sprintf("server/%s/renew-stream/leases=%d", b.name, n), leases[i], 1)
					cpu[b.name] = m.cpuWithStore
				} else {
					m, err = measureStreamRenew(ctx, r.Duration, leases[i], 1)
				}
				if err != nil {
					return fmt.Errorf("%s, %d leases, pass %d: %w", b.name, n, pass+1, err)
				}
				pair := rates[b.name]
				pair[pass] = m.rate
				rates[b.name] = pair
			}
		}
		if e, bg := rates["etcd"], rates["badger"]; e[0] > 0 {
			name := fmt.Sprintf("server/etcd-vs-badger/renew-stream/leases=%d", n)
			r.Add(name, (e[0]+e[1])/(bg[0]+bg[1]), "x")
			r.Add(name+"/first-pass", e[0]/bg[0], "x")
			r.Add(name+"/second-pass", e[1]/bg[1], "x")
			if cpu["etcd"] > 0 && cpu["badger"] > 0 {
				// Badger's CPU per renewal over etcd's, its members
				// included (the first pass's): on a quiet node, where the
				// member shares the cores, the rate ratio follows it.
				r.Add(name+"/per-cpu", float64(cpu["badger"])/float64(cpu["etcd"]), "x")
			}
		}
	}

	// Terminations: a fresh server each, with the renewal servers stopped,
	// so that the leases above do not weigh on it (left running, their
	// holders' connections and lease coordinators, one of them on the same
	// etcd member, would share the machine with the termination).
	stopRenewalServers()
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

// serverEtcdFollower measures job-lease renewals on a three-member etcd
// cluster with two control-plane replicas, through the leader and through
// the follower, which relays every judged message to the leader (Channel
// streams and unary calls alike; docs/etcd.md): the same leases, holders
// and closed loops as server/etcd-vs-badger, back to back, so the ratio
// is the cost of the extra hop. Each replica has its own connection to
// the cluster (the client picks a member), as separate machines would.
func serverEtcdFollower(ctx context.Context, r *Report) error {
	dir, err := os.MkdirTemp(r.Dir, "tether-bench-etcd-follower-*")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cluster, err := etcdlocal.Start(ctx, etcdlocal.Config{Dir: dir, Members: 3})
	switch {
	case errors.Is(err, etcdlocal.ErrNoBinary):
		fmt.Fprintln(os.Stderr, "  server/etcd-follower: etcd not installed (apt-get install etcd-server): skipped")
		return nil
	case err != nil:
		return fmt.Errorf("start a three-member etcd cluster: %w", err)
	}
	defer cluster.Stop()
	etcdServers++
	prefix := fmt.Sprintf("/bench/replicas-%d/", etcdServers)
	lead, stopLead, err := startEtcdReplica(ctx, r, cluster, prefix, "bench-lead")
	if err != nil {
		return err
	}
	defer stopLead()
	// The first replica leads once its coordinator serves; the second
	// starts after, and follows.
	for {
		serving, changed := lead.Leases().Serving()
		if serving {
			break
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	follower, stopFollower, err := startEtcdReplica(ctx, r, cluster, prefix, "bench-follower")
	if err != nil {
		return err
	}
	defer stopFollower()
	if serving, _ := follower.Leases().Serving(); serving {
		return errors.New("the second replica's coordinator serves: it should follow")
	}

	holders, err := leaseHolders(ctx, lead, leaseStreams(1024))
	if err != nil {
		return err
	}
	routes := []struct {
		name    string
		holders []leaseHolder
	}{{"leader", holders}, {"follower", dialedTo(holders, follower.URL)}}
	for _, n := range []int{64, 1024} {
		rates := map[string]float64{}
		for _, route := range routes {
			leases, err := offerLeases(ctx, lead, route.holders[:leaseStreams(n)], n)
			if err != nil {
				return fmt.Errorf("%s, %d leases: %w", route.name, n, err)
			}
			m, err := measureStreamWithCommits(ctx, r, lead, fmt.Sprintf("server/etcd-3/via-%s/renew-stream/leases=%d", route.name, n), leases, 1)
			if err != nil {
				return fmt.Errorf("via the %s, %d leases: %w", route.name, n, err)
			}
			rates[route.name] = m.rate
		}
		r.Add(fmt.Sprintf("server/etcd-3/follower-vs-leader/renew-stream/leases=%d", n), rates["follower"]/rates["leader"], "x")
	}
	const unary = 64
	rates := map[string]float64{}
	for _, route := range routes {
		leases, err := offerLeases(ctx, lead, route.holders, unary)
		if err != nil {
			return err
		}
		m, err := measureUnaryRenew(ctx, r.Duration, leases, processCPU, nil, 0, false)
		if err != nil {
			return fmt.Errorf("unary via the %s: %w", route.name, err)
		}
		m.report(r, fmt.Sprintf("server/etcd-3/via-%s/renew-unary/leases=%d", route.name, unary))
		rates[route.name] = m.rate
	}
	r.Add(fmt.Sprintf("server/etcd-3/follower-vs-leader/renew-unary/leases=%d", unary), rates["follower"]/rates["leader"], "x")
	return nil
}

var etcdServers int

// startEtcdServer runs a control plane on a fresh keyspace of cluster: one
// replica, which wins the election at once.
func startEtcdServer(ctx context.Context, r *Report, cluster *etcdlocal.Cluster) (*benchServer, func(), error) {
	etcdServers++
	return startEtcdReplica(ctx, r, cluster, fmt.Sprintf("/bench/server-%d/", etcdServers), "bench")
}

// startEtcdReplica runs a control-plane replica called identity on the
// keyspace prefix of cluster, with a store (and connection) of its own; it
// publishes its address in the election, so that the others forward to it
// while it leads.
func startEtcdReplica(ctx context.Context, r *Report, cluster *etcdlocal.Cluster, prefix, identity string) (*benchServer, func(), error) {
	srv, _, stop, err := startEtcdReplicaStore(ctx, r, cluster, prefix, identity)
	return srv, stop, err
}

// startEtcdReplicaStore is startEtcdReplica that also returns the
// replica's store.
func startEtcdReplicaStore(ctx context.Context, r *Report, cluster *etcdlocal.Cluster, prefix, identity string, mutate ...func(*controlplane.Config)) (*benchServer, *etcdstore.Etcd, func(), error) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	st, err := etcdstore.OpenEtcd(ctx, etcdstore.EtcdOptions{
		Endpoints: cluster.Endpoints(),
		Prefix:    prefix,
		Logger:    quiet,
	})
	if err != nil {
		return nil, nil, nil, err
	}
	srv, err := startServer(ctx, r, append([]func(*controlplane.Config){disableRateLimit, func(cfg *controlplane.Config) {
		cfg.Store = st
		cfg.Elector = &leader.Etcd{Client: st.Client(), Prefix: st.MetadataPrefix("leader"), Identity: identity, Address: "http://" + cfg.Listen, Log: quiet}
	}}, mutate...)...)
	if err != nil {
		st.Close()
		return nil, nil, nil, err
	}
	for _, m := range cluster.Members {
		srv.etcdPids = append(srv.etcdPids, m.Pid())
	}
	return srv, st, func() { srv.Stop(); st.Close() }, nil
}
