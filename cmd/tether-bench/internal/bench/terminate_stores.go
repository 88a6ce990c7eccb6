package bench

import (
	"context"
	"fmt"
	"os"
	"runtime/pprof"
	"strconv"
	"time"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/internal/etcdlocal"
	"github.com/tetherhq/tether/internal/store/etcdstore"
)

func init() {
	Register("supervisor/terminate-stores", supervisorTerminateEtcd)
}

// supervisorTerminateEtcd measures the termination alone on etcd beside
// Badger, in the same run, at 1,000 and 10,000 agents (abort mode, a tool
// call in flight on one agent in ten, as supervisor/terminate measures it),
// and counts the etcd requests the termination took: the commits
// (Updates), the commit requests (merged commits share one) and the read
// requests (a prefetch of many reads is one), and
// the CPU time it took (the process's and the etcd member's). A fresh
// server and keyspace each, on one local etcd member.
func supervisorTerminateEtcd(ctx context.Context, r *Report) error {
	return withLocalEtcd(ctx, r, "supervisor/terminate-stores", "tether-bench-etcd-terminate-*", func(cluster *etcdlocal.Cluster) error {
		return terminateOnStores(ctx, r, cluster)
	})
}

func terminateOnStores(ctx context.Context, r *Report, cluster *etcdlocal.Cluster) error {
	for _, agents := range []int{1000, 10000} {
		times, cpus := map[string]time.Duration{}, map[string]time.Duration{}
		for _, backend := range []string{"badger", "etcd"} {
			var srv *benchServer
			var st *etcdstore.Etcd
			var err error
			var phases terminationPhases
			stopServer := func() {}
			if backend == "badger" {
				srv, err = startServer(ctx, r, disableRateLimit, phases.hook)
				if err == nil {
					stopServer = srv.Stop
				}
			} else {
				srv, st, stopServer, err = startEtcdServerStore(ctx, r, cluster, phases.hook)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", backend, err)
			}
			root, err := buildSubtree(ctx, srv, agents)
			if err != nil {
				stopServer()
				return fmt.Errorf("%s: %w", backend, err)
			}
			calls, stopGate, answered, err := callsInFlightCounted(ctx, srv, root, agents/10)
			if err != nil {
				stopServer()
				return fmt.Errorf("%s: %w", backend, err)
			}
			phases.countAcks(answered)
			var before etcdstore.EtcdStats
			if st != nil {
				before = st.Stats()
				phases.count(func() phaseCounts {
					s := st.Stats()
					return phaseCounts{reads: s.ReadRequests, commits: s.CommitRequests, ranges: s.Ranges, compares: s.Compares, writes: s.Writes}
				})
			}
			cpuBefore, cpuOK := processCPU()
			etcdBefore, _ := srv.etcdCPU()
			stopProfile := profileTermination(backend, agents)
			phases.begin()
			elapsed, nodes, err := timeTermination(ctx, srv, root)
			stopProfile()
			cpuAfter, _ := processCPU()
			etcdAfter, _ := srv.etcdCPU()
			var after etcdstore.EtcdStats
			if st != nil {
				after = st.Stats()
			}
			acked := stopGate()
			stopServer()
			if err != nil {
				return fmt.Errorf("%s: %w", backend, err)
			}
			if nodes != agents {
				return fmt.Errorf("%s: the record of a %d-agent subtree lists %d nodes", backend, agents, nodes)
			}
			if acked != calls {
				return fmt.Errorf("%s: %d calls in flight, %d cancel acks", backend, calls, acked)
			}
			name := fmt.Sprintf("supervisor/terminate-stores/%s/terminate-abort/agents=%d", backend, agents)
			r.Add(name, float64(elapsed.Microseconds())/1000, "ms")
			// Where the time went, step by step (terminationPhases).
			split := phases.split()
			for _, phase := range phaseNames {
				c, ok := split[phase]
				if !ok {
					continue
				}
				r.Add(fmt.Sprintf("supervisor/terminate-stores/%s/phase-%s/agents=%d", backend, phase, agents), float64(c.d.Microseconds())/1000, "ms")
				// The gate's acknowledgements answered in the phase:
				// on etcd each is a read and a commit of the phase's
				// (merged with others' when they arrive together), made
				// by the gate, not by the termination. An answer on its
				// way at the phase's end counts in the next.
				r.Add(fmt.Sprintf("supervisor/terminate-stores/%s/phase-%s-acks/agents=%d", backend, phase, agents), float64(c.acks), "acks")
				if st != nil {
					// Its round trips: read requests (a prefetch of
					// many ranges is one) and commit requests (merged
					// commits share one).
					r.Add(fmt.Sprintf("supervisor/terminate-stores/etcd/phase-%s-read-requests/agents=%d", phase, agents), float64(c.reads), "requests")
					r.Add(fmt.Sprintf("supervisor/terminate-stores/etcd/phase-%s-commit-requests/agents=%d", phase, agents), float64(c.commits), "requests")
					// Their volume: what the member read, compared
					// and wrote in the phase.
					r.Add(fmt.Sprintf("supervisor/terminate-stores/etcd/phase-%s-ranges/agents=%d", phase, agents), float64(c.ranges), "ranges")
					r.Add(fmt.Sprintf("supervisor/terminate-stores/etcd/phase-%s-compares/agents=%d", phase, agents), float64(c.compares), "compares")
					r.Add(fmt.Sprintf("supervisor/terminate-stores/etcd/phase-%s-writes/agents=%d", phase, agents), float64(c.writes), "writes")
				}
			}
			if st != nil {
				// Every commit the process made meanwhile (the gate's
				// cancel acks and the termination's own), and its reads.
				r.Add(fmt.Sprintf("supervisor/terminate-stores/etcd/commits/agents=%d", agents), float64(after.Updates-before.Updates), "commits")
				r.Add(fmt.Sprintf("supervisor/terminate-stores/etcd/attempts/agents=%d", agents), float64(after.Attempts-before.Attempts), "attempts")
				// Attempts answered a conflict without a commit request:
				// queued behind a commit that wrote what they read.
				r.Add(fmt.Sprintf("supervisor/terminate-stores/etcd/doomed/agents=%d", agents), float64(after.Doomed-before.Doomed), "attempts")
				r.Add(fmt.Sprintf("supervisor/terminate-stores/etcd/read-requests/agents=%d", agents), float64(after.ReadRequests-before.ReadRequests), "requests")
				// Commit requests: Updates whose commits went merged
				// (etcd's group commit) share one.
				r.Add(fmt.Sprintf("supervisor/terminate-stores/etcd/commit-requests/agents=%d", agents), float64(after.CommitRequests-before.CommitRequests), "requests")
				// The volume: ranges asked for and keys returned by the
				// reads, comparisons and writes carried by the commits.
				r.Add(fmt.Sprintf("supervisor/terminate-stores/etcd/ranges/agents=%d", agents), float64(after.Ranges-before.Ranges), "ranges")
				r.Add(fmt.Sprintf("supervisor/terminate-stores/etcd/keys-read/agents=%d", agents), float64(after.KeysRead-before.KeysRead), "keys")
				r.Add(fmt.Sprintf("supervisor/terminate-stores/etcd/compares/agents=%d", agents), float64(after.Compares-before.Compares), "compares")
				r.Add(fmt.Sprintf("supervisor/terminate-stores/etcd/writes/agents=%d", agents), float64(after.Writes-before.Writes), "writes")
				r.Add(fmt.Sprintf("supervisor/terminate-stores/etcd/watch-events/agents=%d", agents), float64(after.WatchEvents-before.WatchEvents), "events")
			}
			times[backend] = elapsed
			if cpuOK {
				// The CPU time of the process (server, gate and client)
				// and of the etcd member over the same interval: on a
				// shared machine it moves less with the load than the
				// wall-clock time does.
				cpu := cpuAfter - cpuBefore + etcdAfter - etcdBefore
				if backend == "etcd" {
					// Each side apart: the member's share is what the
					// keys read, compared and written cost etcd.
					r.Add(fmt.Sprintf("supervisor/terminate-stores/etcd/terminate-abort-cpu-member/agents=%d", agents), float64((etcdAfter-etcdBefore).Microseconds())/1000, "ms")
				}
				r.Add(fmt.Sprintf("supervisor/terminate-stores/%s/terminate-abort-cpu/agents=%d", backend, agents), float64(cpu.Microseconds())/1000, "ms")
				cpus[backend] = cpu
			}
		}
		r.Add(fmt.Sprintf("supervisor/terminate-stores/etcd-vs-badger/agents=%d", agents), float64(times["etcd"])/float64(times["badger"]), "x")
		if cpus["etcd"] > 0 && cpus["badger"] > 0 {
			r.Add(fmt.Sprintf("supervisor/terminate-stores/etcd-vs-badger-cpu/agents=%d", agents), float64(cpus["etcd"])/float64(cpus["badger"]), "x")
		}
	}
	return nil
}

// startEtcdServerStore is startEtcdServer that also returns the server's
// store, for its request counters.
func startEtcdServerStore(ctx context.Context, r *Report, cluster *etcdlocal.Cluster, mutate ...func(*controlplane.Config)) (*benchServer, *etcdstore.Etcd, func(), error) {
	etcdServers++
	return startEtcdReplicaStore(ctx, r, cluster, fmt.Sprintf("/bench/server-%d/", etcdServers), "bench", mutate...)
}

// profileTermination profiles the termination alone when
// TETHER_BENCH_TERMINATION_PROFILE names a file: the etcd termination of
// 1,000 agents (TETHER_BENCH_TERMINATION_PROFILE_AGENTS for another size,
// TETHER_BENCH_TERMINATION_PROFILE_BACKEND for Badger's). It returns the
// function that stops the profile.
func profileTermination(backend string, agents int) func() {
	path := os.Getenv("TETHER_BENCH_TERMINATION_PROFILE")
	want, wantBackend := "1000", "etcd"
	if v := os.Getenv("TETHER_BENCH_TERMINATION_PROFILE_AGENTS"); v != "" {
		want = v
	}
	if v := os.Getenv("TETHER_BENCH_TERMINATION_PROFILE_BACKEND"); v != "" {
		wantBackend = v
	}
	if path == "" || backend != wantBackend || strconv.Itoa(agents) != want {
		return func() {}
	}
	f, err := os.Create(path)
	if err != nil {
		return func() {}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return func() {}
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}
}
