package bench

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/internal/etcdlocal"
	"github.com/tetherhq/tether/internal/store"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The lone-renew benchmarks take one unary Renew apart: the renew itself,
// the RPC floor (an authenticated unary read on the same connection, with
// no store write) and the durability floor (one durable Update of one
// small key, one group commit with one sync) on the same server and disk.
// Profile with, for example:
//
//	go test -run '^$' -bench 'Lone' -cpuprofile cpu.out ./cmd/tether-bench/internal/bench/
func loneLease(b *testing.B) (*benchServer, *benchLease) {
	b.Helper()
	ctx := context.Background()
	srv, err := startServer(ctx, &Report{Dir: b.TempDir()}, disableRateLimit)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(srv.Stop)
	holders, err := leaseHolders(ctx, srv, 1)
	if err != nil {
		b.Fatal(err)
	}
	leases, err := offerLeases(ctx, srv, holders, 1)
	if err != nil {
		b.Fatal(err)
	}
	return srv, leases[0]
}

func BenchmarkRenewUnaryLone(b *testing.B) {
	srv, l := loneLease(b)
	ctx := context.Background()
	p := newP50(b)
	before := badgerStats(srv)
	defer func() {
		after := badgerStats(srv)
		b.ReportMetric(float64(after.Batches-before.Batches)/float64(b.N), "syncs/op")
	}()
	for b.Loop() {
		done := p.time()
		resp, err := l.holder.conn.Lease.Renew(ctx, connect.NewRequest(l.renewRequest()))
		if err == nil {
			err = checkRenewed(resp.Msg.Decision)
		}
		if err != nil {
			b.Fatal(err)
		}
		done()
	}
	p.report()
}

func BenchmarkRPCFloorLone(b *testing.B) {
	_, l := loneLease(b)
	ctx := context.Background()
	p := newP50(b)
	for b.Loop() {
		done := p.time()
		if _, err := l.holder.conn.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: l.holder.nodeID})); err != nil {
			b.Fatal(err)
		}
		done()
	}
	p.report()
}

func BenchmarkDurableCommitLone(b *testing.B) {
	srv, _ := loneLease(b)
	ctx := context.Background()
	st := srv.Store()
	i := 0
	p := newP50(b)
	for b.Loop() {
		done := p.time()
		i++
		if err := st.Update(ctx, func(tx store.Txn) error {
			return tx.Put([]byte("bench/lone"), []byte(strconv.Itoa(i)))
		}); err != nil {
			b.Fatal(err)
		}
		done()
	}
	p.report()
}

// BenchmarkLoneRenewVsFloors runs the lease/renew scenario's lone-renew
// measurement (a renew and the RPC, commit and fsync floors interleaved)
// for the benchmark time and reports its medians.
func BenchmarkLoneRenewVsFloors(b *testing.B) {
	srv, l := loneLease(b)
	r := &Report{Duration: 3 * time.Second}
	for b.Loop() {
		if _, err := measureLoneRenew(context.Background(), r, srv, *l.holder); err != nil {
			b.Fatal(err)
		}
	}
	for _, res := range r.Results() {
		b.ReportMetric(res.Value*1000, strings.TrimPrefix(res.Name, "lease/renew/")+"-µs")
	}
}

// p50 reports the median time per operation beside the mean, which on a
// shared machine a few stalled fsyncs pull far up.
type p50 struct {
	b     *testing.B
	unit  string
	times []time.Duration
}

func newP50(b *testing.B) *p50 { return &p50{b: b, unit: "p50-µs"} }

func (p *p50) report() {
	if len(p.times) > 0 {
		slices.Sort(p.times)
		p.b.ReportMetric(float64(p.times[len(p.times)/2].Microseconds()), p.unit)
	}
}

func (p *p50) time() func() {
	start := time.Now()
	return func() { p.times = append(p.times, time.Since(start)) }
}

// BenchmarkRenewUnary64 renews 64 leases of 8 holders over unary calls from
// 64 goroutines at once: what a unary renew costs under concurrency (the
// lease/renew scenario's middle row), in CPU per renew (client and server,
// this process) beside the wall-clock ns/op.
func BenchmarkRenewUnary64(b *testing.B) {
	const n = 64
	ctx := context.Background()
	srv, err := startServer(ctx, &Report{Dir: b.TempDir()}, disableRateLimit)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(srv.Stop)
	holders, err := leaseHolders(ctx, srv, leaseStreams(n))
	if err != nil {
		b.Fatal(err)
	}
	leases, err := offerLeases(ctx, srv, holders, n)
	if err != nil {
		b.Fatal(err)
	}
	var next atomic.Int64
	cpuStart, _ := processCPU()
	b.SetParallelism((n + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(next.Add(1) - 1)
		if i >= n {
			return // one goroutine per lease: a lease's renewals are sequential
		}
		l := leases[i]
		for pb.Next() {
			resp, err := l.holder.conn.Lease.Renew(ctx, connect.NewRequest(l.renewRequest()))
			if err == nil {
				err = checkRenewed(resp.Msg.Decision)
			}
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	cpuEnd, _ := processCPU()
	b.ReportMetric(float64((cpuEnd-cpuStart).Microseconds())/float64(b.N), "cpu-µs/op")
}

// BenchmarkUnaryVsEtcd takes lease/renew's unary-vs-etcd figures at 1, 8
// and 64 leases apart: the real `tether serve` in a process of its own and
// etcd's fenced compare-and-swap, measured back to back for a second each,
// several rounds per benchmark iteration, reporting the medians of the
// per-round ratios (rate, and renews per CPU-second) and of the CPU per
// renew. Interleaving each round keeps a shared machine's swings out of
// the ratios, which is what an A/B of the unary path needs:
//
//	go test -run '^$' -bench 'UnaryVsEtcd' -benchtime 1x ./cmd/tether-bench/internal/bench/
func BenchmarkUnaryVsEtcd(b *testing.B) {
	ctx := context.Background()
	r := &Report{Dir: b.TempDir()}
	proc, err := startProcessServer(ctx, r, "--rate-limit", "0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(proc.stop)
	etcd, err := startEtcd(ctx, r)
	if errors.Is(err, etcdlocal.ErrNoBinary) {
		b.Skip("etcd is not installed")
	}
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(etcd.stop)
	holders, err := leaseHolders(ctx, proc, leaseStreams(64))
	if err != nil {
		b.Fatal(err)
	}
	const rounds = 5
	for _, n := range []int{1, 8, 64} {
		b.Run("leases="+strconv.Itoa(n), func(b *testing.B) {
			leases, err := offerLeases(ctx, proc, holders, n)
			if err != nil {
				b.Fatal(err)
			}
			var rate, perCPU, cpu, etcdCPU, serverCPU, etcdServerCPU, switches, etcdSwitches []float64
			var rate1, serverCPU1, switches1 []float64
			for b.Loop() {
				for round := range rounds {
					// Each failure names its round and system: a lost
					// message should not leave which one failed a guess.
					u, err := measureUnaryRenew(ctx, time.Second, leases, proc.cpu, proc.serverCPU, proc.pid, false)
					if err != nil {
						b.Fatalf("round %d, %d leases, unary over HTTP/2: %v", round+1, n, err)
					}
					u1, err := measureUnaryRenew(ctx, time.Second, leases, proc.cpu, proc.serverCPU, proc.pid, true)
					if err != nil {
						b.Fatalf("round %d, %d leases, unary over HTTP/1.1: %v", round+1, n, err)
					}
					e, err := measureEtcdRenew(ctx, time.Second, etcd, n)
					if err != nil {
						b.Fatalf("round %d, %d leases, etcd: %v", round+1, n, err)
					}
					serverCPU = append(serverCPU, float64(u.serverCPU.Microseconds()))
					etcdServerCPU = append(etcdServerCPU, float64(e.serverCPU.Microseconds()))
					switches = append(switches, u.serverSwitches)
					rate1 = append(rate1, u1.rate/e.rate)
					serverCPU1 = append(serverCPU1, float64(u1.serverCPU.Microseconds()))
					switches1 = append(switches1, u1.serverSwitches)
					etcdSwitches = append(etcdSwitches, e.serverSwitches)
					rate = append(rate, u.rate/e.rate)
					perCPU = append(perCPU, float64(e.cpu)/float64(u.cpu))
					cpu = append(cpu, float64(u.cpu.Microseconds()))
					etcdCPU = append(etcdCPU, float64(e.cpu.Microseconds()))
				}
			}
			median := func(v []float64) float64 { slices.Sort(v); return v[len(v)/2] }
			b.ReportMetric(median(rate), "vs-etcd")
			b.ReportMetric(median(perCPU), "vs-etcd-per-cpu")
			b.ReportMetric(median(cpu), "cpu-µs/renew")
			b.ReportMetric(median(etcdCPU), "etcd-cpu-µs/renew")
			b.ReportMetric(median(serverCPU), "server-cpu-µs/renew")
			b.ReportMetric(median(etcdServerCPU), "etcd-server-cpu-µs/renew")
			b.ReportMetric(median(switches), "server-switches/renew")
			b.ReportMetric(median(etcdSwitches), "etcd-server-switches/renew")
			b.ReportMetric(median(rate1), "http1-vs-etcd")
			b.ReportMetric(median(serverCPU1), "http1-server-cpu-µs/renew")
			b.ReportMetric(median(switches1), "http1-server-switches/renew")
		})
	}
}

// BenchmarkRPCFloorProcess measures the RPC floor on the real `tether
// serve` in a process of its own: agents reading their own nodes
// (GetNode, authenticated and authorised, no write) from 1, 8 and 64
// clients, each on its own connection, and reports the server process's
// CPU per call (read from /proc, so the clients' CPU is not in it) and the
// median round trip, medians of several one-second rounds. It is what a
// change to the server's request path (HTTP/2, Connect, the interceptors,
// authentication) should move; A/B it against the base in the same
// minutes:
//
//	go test -run '^$' -bench 'RPCFloorProcess' -benchtime 1x ./cmd/tether-bench/internal/bench/
func BenchmarkRPCFloorProcess(b *testing.B) {
	ctx := context.Background()
	r := &Report{Dir: b.TempDir()}
	proc, err := startProcessServer(ctx, r, "--rate-limit", "0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(proc.stop)
	holders, err := leaseHolders(ctx, proc, 64)
	if err != nil {
		b.Fatal(err)
	}
	const rounds = 5
	for _, n := range []int{1, 8, 64} {
		b.Run("clients="+strconv.Itoa(n), func(b *testing.B) {
			var cpu, rate, p50s []float64
			for b.Loop() {
				for range rounds {
					var calls atomic.Int64
					times := make([][]time.Duration, n)
					op := func(ctx context.Context, w int) error {
						h := &holders[w]
						start := time.Now()
						resp, err := h.conn.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: h.nodeID}))
						if err != nil {
							return err
						}
						if resp.Msg.Node.GetNodeId() != h.nodeID {
							return errors.New("GetNode returned another node")
						}
						times[w] = append(times[w], time.Since(start))
						calls.Add(1)
						return nil
					}
					before, ok1 := proc.serverCPU()
					calls.Store(0)
					r, err := Throughput(ctx, n, time.Second, op)
					if err != nil {
						b.Fatal(err)
					}
					after, ok2 := proc.serverCPU()
					if ok1 && ok2 && calls.Load() > 0 {
						cpu = append(cpu, float64((after-before).Microseconds())/float64(calls.Load()))
					}
					rate = append(rate, r)
					var all []time.Duration
					for _, t := range times {
						all = append(all, t...)
					}
					slices.Sort(all)
					if len(all) > 0 {
						p50s = append(p50s, float64(all[len(all)/2].Microseconds()))
					}
				}
			}
			median := func(v []float64) float64 {
				if len(v) == 0 {
					return 0
				}
				slices.Sort(v)
				return v[len(v)/2]
			}
			b.ReportMetric(median(cpu), "server-cpu-µs/call")
			b.ReportMetric(median(rate), "calls/s")
			b.ReportMetric(median(p50s), "p50-µs")
		})
	}
}
