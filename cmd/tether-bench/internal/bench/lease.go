package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/etcdlocal"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	"github.com/tetherhq/tether/internal/store/etcdstore"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

func init() {
	Register("lease/renew", leaseRenew)
}

// leaseConcurrency is how many leases renew at once in each measurement.
var leaseConcurrency = []int{1, 8, 64, 1024}

// leaseStreams is how many Channel streams carry the streaming renewals:
// one per holder agent, each multiplexing its leases, as an agent process
// running many jobs would.
func leaseStreams(leases int) int { return min(leases, 8) }

// leaseRenew measures durable lease renewals through the real server on
// loopback — unary Renew calls and renewals multiplexed on Channel streams
// — and, in the same run, the same workload built the way a user would on
// etcd: one compare-and-swap transaction per renew (If mod_revision
// unchanged Then Put), on a local etcd-server with fsync on. Every renew is
// answered only once durable on both systems. The unary, stream and etcd
// figures are closed loops per lease: the next renew is sent when the
// answer to the previous one arrived. The pipelined stream keeps
// pipelineWindow renews per lease in flight, which the stream allows
// (each renew is judged on its own sequence) and a compare-and-swap does
// not (it needs the revision the previous write returned). The unary
// renews compared with etcd are served by the real binary in a process of
// its own, as etcd's are; the in-process server's are reported beside them.
func leaseRenew(ctx context.Context, r *Report) error {
	srv, err := startServer(ctx, r, disableRateLimit)
	if err != nil {
		return err
	}
	defer srv.Stop()
	maxLeases := slices.Max(leaseConcurrency)
	holders, err := leaseHolders(ctx, srv, leaseStreams(maxLeases))
	if err != nil {
		return err
	}
	// The unary figures compared with etcd come from the real binary in a
	// process of its own, as etcd runs in its own: in this process the
	// server would share the scheduler, heap and collector with up to 1,024
	// client goroutines, a handicap etcd does not have. The in-process
	// figures are kept beside them (unary-in-process).
	proc, err := startProcessServer(ctx, r, "--rate-limit", "0")
	if err != nil {
		return fmt.Errorf("tether serve: %w", err)
	}
	defer proc.stop()
	procHolders, err := leaseHolders(ctx, proc, leaseStreams(maxLeases))
	if err != nil {
		return err
	}
	// etcd runs beside, and each concurrency is measured on both systems
	// back to back, so the ratio compares figures taken under the same
	// conditions (this machine's load varies between minutes).
	etcd, err := startEtcd(ctx, r)
	switch {
	case errors.Is(err, etcdlocal.ErrNoBinary):
		fmt.Fprintln(os.Stderr, "  lease/renew: etcd not installed (apt-get install etcd-server): skipping the etcd comparison")
	case err != nil:
		return err
	default:
		defer etcd.stop()
	}
	floors, err := measureLoneRenew(ctx, r, srv, holders[0])
	if err != nil {
		return fmt.Errorf("lone renew: %w", err)
	}
	for _, n := range leaseConcurrency {
		leases, err := offerLeases(ctx, srv, holders, n)
		if err != nil {
			return err
		}
		m, err := measureUnaryRenew(ctx, r.Duration, leases, processCPU, nil, 0, false) // the bench's clients and the server
		if err != nil {
			return fmt.Errorf("unary in process, %d leases: %w", n, err)
		}
		m.report(r, fmt.Sprintf("lease/renew/unary-in-process/leases=%d", n))
		inProcess := m

		leases, err = offerLeases(ctx, srv, holders[:leaseStreams(n)], n)
		if err != nil {
			return err
		}
		stream, err := measureStreamWithCommits(ctx, r, srv, fmt.Sprintf("lease/renew/stream/leases=%d", n), leases, 1)
		if err != nil {
			return fmt.Errorf("stream, %d leases: %w", n, err)
		}
		if n == 1 {
			// A closed loop on one lease is one message and one commit
			// per renew: what it costs beyond one RPC and one fsync.
			r.Add("lease/renew/stream/leases=1/p50-over-floors", ms(stream.p50)-floors.rpc-floors.fsync, "ms")
		}
		pipelined, err := measureStreamWithCommits(ctx, r, srv, fmt.Sprintf("lease/renew/stream-pipelined/leases=%d", n), leases, pipelineWindow)
		if err != nil {
			return fmt.Errorf("stream pipelined, %d leases: %w", n, err)
		}

		leases, err = offerLeases(ctx, proc, procHolders, n)
		if err != nil {
			return err
		}
		unary, err := measureUnaryRenew(ctx, r.Duration, leases, proc.cpu, proc.serverCPU, proc.pid, false)
		if err != nil {
			return fmt.Errorf("unary, %d leases: %w", n, err)
		}
		unary.report(r, fmt.Sprintf("lease/renew/unary/leases=%d", n))
		// The same calls over HTTP/1.1 (agentsdk.UnaryHTTP1Client), where
		// one server goroutine reads, handles and answers each: at the
		// low concurrencies, where HTTP/2's hand-offs weigh most.
		var unaryHTTP1 leaseMeasurement
		if n <= 8 {
			if unaryHTTP1, err = measureUnaryRenew(ctx, r.Duration, leases, proc.cpu, proc.serverCPU, proc.pid, true); err != nil {
				return fmt.Errorf("unary over HTTP/1.1, %d leases: %w", n, err)
			}
			unaryHTTP1.report(r, fmt.Sprintf("lease/renew/unary-http1/leases=%d", n))
		}

		if etcd == nil {
			continue
		}
		m, err = measureEtcdRenew(ctx, r.Duration, etcd, n)
		if err != nil {
			return fmt.Errorf("etcd, %d leases: %w", n, err)
		}
		m.report(r, fmt.Sprintf("lease/renew/etcd-txn/leases=%d", n))
		// A second pass in the reverse order (etcd, then Tether over
		// HTTP/1.1 and HTTP/2): a load on the machine that grows or falls
		// through the measurements weighs on both systems alike, where
		// one pass charged all of it to whichever came last. The ratios
		// below are of the two passes together; the figures reported
		// above are the first pass's.
		r.Add(fmt.Sprintf("lease/renew/unary-vs-etcd/leases=%d/first-pass", n), unary.rate/m.rate, "x")
		etcd2, err := measureEtcdRenew(ctx, r.Duration, etcd, n)
		if err != nil {
			return fmt.Errorf("etcd, %d leases, second pass: %w", n, err)
		}
		m = bothPasses(m, etcd2)
		if unaryHTTP1.rate > 0 {
			second, err := measureUnaryRenew(ctx, r.Duration, leases, proc.cpu, proc.serverCPU, proc.pid, true)
			if err != nil {
				return fmt.Errorf("unary over HTTP/1.1, %d leases, second pass: %w", n, err)
			}
			unaryHTTP1 = bothPasses(unaryHTTP1, second)
		}
		second, err := measureUnaryRenew(ctx, r.Duration, leases, proc.cpu, proc.serverCPU, proc.pid, false)
		if err != nil {
			return fmt.Errorf("unary, %d leases, second pass: %w", n, err)
		}
		unary = bothPasses(unary, second)
		r.Add(fmt.Sprintf("lease/renew/unary-vs-etcd/leases=%d", n), unary.rate/m.rate, "x")
		if unary.cpu > 0 && m.cpu > 0 {
			// Renews per CPU-second, client and server counted on both
			// sides (each server in a process of its own): the ratio a
			// loaded machine does not skew.
			r.Add(fmt.Sprintf("lease/renew/unary-vs-etcd-per-cpu/leases=%d", n), float64(m.cpu)/float64(unary.cpu), "x")
		}
		if unary.serverCPU > 0 && m.serverCPU > 0 {
			// The servers alone: the clients' stacks (Connect over
			// net/http, gRPC) differ, and count in the ratio above.
			r.Add(fmt.Sprintf("lease/renew/unary-vs-etcd-per-server-cpu/leases=%d", n), float64(m.serverCPU)/float64(unary.serverCPU), "x")
		}
		if unaryHTTP1.rate > 0 {
			r.Add(fmt.Sprintf("lease/renew/unary-http1-vs-etcd/leases=%d", n), unaryHTTP1.rate/m.rate, "x")
			if unaryHTTP1.serverCPU > 0 && m.serverCPU > 0 {
				r.Add(fmt.Sprintf("lease/renew/unary-http1-vs-etcd-per-server-cpu/leases=%d", n), float64(m.serverCPU)/float64(unaryHTTP1.serverCPU), "x")
			}
		}
		r.Add(fmt.Sprintf("lease/renew/unary-in-process-vs-etcd/leases=%d", n), inProcess.rate/m.rate, "x")
		r.Add(fmt.Sprintf("lease/renew/stream-vs-etcd/leases=%d", n), stream.rate/m.rate, "x")
		r.Add(fmt.Sprintf("lease/renew/stream-pipelined-vs-etcd/leases=%d", n), pipelined.rate/m.rate, "x")
	}
	return nil
}

// bothPasses combines two measurements of one system of the same length:
// the mean rate, and the CPU and switches per renew weighted by each
// pass's renews. Percentiles are the first pass's.
func bothPasses(a, b leaseMeasurement) leaseMeasurement {
	out := a
	out.rate = (a.rate + b.rate) / 2
	if total := a.rate + b.rate; total > 0 {
		weigh := func(x, y float64) float64 { return (x*a.rate + y*b.rate) / total }
		out.cpu = time.Duration(weigh(float64(a.cpu), float64(b.cpu)))
		out.serverCPU = time.Duration(weigh(float64(a.serverCPU), float64(b.serverCPU)))
		out.serverSwitches = weigh(a.serverSwitches, b.serverSwitches)
	}
	return out
}

// loneFloors are the medians of measureLoneRenew's floors, in ms.
type loneFloors struct{ rpc, commit, fsync float64 }

// measureLoneRenew takes a lone unary renew apart: in one closed loop it
// alternates a renew, the RPC floor (an authenticated unary read on the
// holder's connection, which writes nothing), the commit floor (one
// durable store Update of one small key: one group commit, one Badger
// transaction, one sync) and the fsync floor (a small write to a
// preallocated file and an fdatasync, what etcd's WAL does per batch), so
// the medians are taken under the same load of the machine and its disk.
// A renew is one RPC plus one commit; what it costs beyond those two
// floors is the coordinator's judging and its goroutine hand-offs, and
// what the commit costs beyond the fsync is Badger's.
func measureLoneRenew(ctx context.Context, r *Report, srv *benchServer, holder leaseHolder) (loneFloors, error) {
	leases, err := offerLeases(ctx, srv, []leaseHolder{holder}, 1)
	if err != nil {
		return loneFloors{}, err
	}
	l := leases[0]
	wal, err := os.CreateTemp(r.Dir, "tether-bench-fsync-*")
	if err != nil {
		return loneFloors{}, err
	}
	defer os.Remove(wal.Name())
	defer wal.Close()
	const walSize = 64 << 20
	if err := wal.Truncate(walSize); err != nil {
		return loneFloors{}, err
	}
	if err := wal.Sync(); err != nil {
		return loneFloors{}, err
	}
	record := make([]byte, 256)
	var renew, rpc, commit, fsync []time.Duration
	key := []byte("bench/lone-commit")
	deadline := time.Now().Add(r.Duration)
	for i := 0; time.Now().Before(deadline); i++ {
		start := time.Now()
		resp, err := l.holder.conn.Lease.Renew(ctx, connect.NewRequest(l.renewRequest()))
		if err == nil {
			err = checkRenewed(resp.Msg.Decision)
		}
		if err != nil {
			return loneFloors{}, err
		}
		renew = append(renew, time.Since(start))
		start = time.Now()
		if _, err := l.holder.conn.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: l.holder.nodeID})); err != nil {
			return loneFloors{}, err
		}
		rpc = append(rpc, time.Since(start))
		start = time.Now()
		if err := srv.Store().Update(ctx, func(tx store.Txn) error { return tx.Put(key, []byte(strconv.Itoa(i))) }); err != nil {
			return loneFloors{}, err
		}
		commit = append(commit, time.Since(start))
		start = time.Now()
		if _, err := wal.WriteAt(record, int64(i*len(record))%walSize); err != nil {
			return loneFloors{}, err
		}
		if err := datasync(wal); err != nil {
			return loneFloors{}, err
		}
		fsync = append(fsync, time.Since(start))
	}
	p50 := func(d []time.Duration) float64 {
		slices.Sort(d)
		return ms(d[len(d)/2])
	}
	renewP50 := p50(renew)
	f := loneFloors{rpc: p50(rpc), commit: p50(commit), fsync: p50(fsync)}
	r.Add("lease/renew/lone-unary/p50", renewP50, "ms")
	r.Add("lease/renew/lone-floor-rpc/p50", f.rpc, "ms")
	r.Add("lease/renew/lone-floor-commit/p50", f.commit, "ms")
	r.Add("lease/renew/lone-floor-fsync/p50", f.fsync, "ms")
	r.Add("lease/renew/lone-unary-over-floors/p50", renewP50-f.rpc-f.commit, "ms")
	r.Add("lease/renew/lone-commit-over-fsync/p50", f.commit-f.fsync, "ms")
	return f, nil
}

// badgerStats reads the store's group-commit counters (zero on another
// backend).
func badgerStats(srv *benchServer) badgerstore.BadgerStats {
	if b, ok := srv.Store().(*badgerstore.Badger); ok {
		return b.Stats()
	}
	return badgerstore.BadgerStats{}
}

// etcdStats reads the etcd store's counters (zero on another backend).
func etcdStats(srv *benchServer) etcdstore.EtcdStats {
	if e, ok := srv.Store().(*etcdstore.Etcd); ok {
		return e.Stats()
	}
	return etcdstore.EtcdStats{}
}

// pipelineWindow is how many renewals of one lease the pipelined stream
// measurement keeps in flight.
const pipelineWindow = 8

// measureStreamWithCommits measures streamed renewals with window renewals
// in flight per lease and reports, beside rate and latency, how many
// renewals shared a coordinator commit and a store sync, and how long a
// commit took.
func measureStreamWithCommits(ctx context.Context, r *Report, srv *benchServer, name string, leases []*benchLease, window int) (leaseMeasurement, error) {
	before, storeBefore, etcdBefore := srv.Leases().Stats(), badgerStats(srv), etcdStats(srv)
	cpuBefore, cpuOK := processCPU()
	etcdCPUBefore, etcdCPUOK := srv.etcdCPU()
	m, err := measureStreamRenew(ctx, r.Duration, leases, window)
	if err != nil {
		return m, err
	}
	cpuAfter, _ := processCPU()
	etcdCPUAfter, _ := srv.etcdCPU()
	after, storeAfter, etcdAfter := srv.Leases().Stats(), badgerStats(srv), etcdStats(srv)
	m.report(r, name)
	commits := float64(max(1, after.Commits-before.Commits))
	r.Add(name+"/renews-per-commit", float64(after.Judged-before.Judged)/commits, "renews")
	r.Add(name+"/commit-ms", (after.CommitTime-before.CommitTime).Seconds()*1000/commits, "ms")
	if syncs := storeAfter.Batches - storeBefore.Batches; syncs > 0 {
		r.Add(name+"/renews-per-sync", float64(after.Judged-before.Judged)/float64(syncs), "renews")
	}
	// CPU per renewal, which the machine's other load changes far less
	// than the rate: this process (clients and server, warm-up included)
	// and, on etcd, the members. On an idle machine the rate cannot exceed
	// the cores divided by their sum.
	if judged := float64(after.Judged - before.Judged); judged > 0 && cpuOK {
		r.Add(name+"/cpu-us-per-renew", float64((cpuAfter-cpuBefore).Microseconds())/judged, "µs")
		m.cpuWithStore = cpuAfter - cpuBefore
		if etcdCPUOK {
			r.Add(name+"/etcd-cpu-us-per-renew", float64((etcdCPUAfter-etcdCPUBefore).Microseconds())/judged, "µs")
			m.cpuWithStore += etcdCPUAfter - etcdCPUBefore
		}
		m.cpuWithStore = time.Duration(float64(m.cpuWithStore) / judged)
	}
	if updates := etcdAfter.Updates - etcdBefore.Updates; updates > 0 {
		// Every store Update of the run, the coordinator's among them: the
		// read round trips an Update makes before its commit.
		r.Add(name+"/etcd-reads-per-update", float64(etcdAfter.ReadRequests-etcdBefore.ReadRequests)/float64(updates), "reads")
	}
	return m, nil
}

// disableRateLimit turns off per-caller rate limiting: the benchmark
// measures capacity, not policy.
func disableRateLimit(cfg *controlplane.Config) { cfg.RateLimit = 0 }

// leaseMeasurement is a throughput and its latency percentiles, and the
// CPU time a renew cost (zero when not measured).
type leaseMeasurement struct {
	rate     float64
	p50, p99 time.Duration
	cpu      time.Duration
	// serverCPU is the share of cpu the server process spent, when the
	// server runs in a process of its own (tether serve, etcd): the rest
	// is the clients', whose stacks differ between the two systems.
	serverCPU time.Duration
	// serverSwitches is the server process's context switches per renew
	// (all its threads), when it runs in a process of its own.
	serverSwitches float64
	// cpuWithStore is the CPU per renewal of this process and, on etcd,
	// of the members too (measureStreamWithCommits; warm-up included, per
	// judged renewal): what the renewals cost the machine, whichever
	// process spent it.
	cpuWithStore time.Duration
}

func (m leaseMeasurement) report(r *Report, name string) {
	r.Add(name, m.rate, "renews/s")
	r.Add(name+"/p50", float64(m.p50.Microseconds())/1000, "ms")
	r.Add(name+"/p99", float64(m.p99.Microseconds())/1000, "ms")
	if m.cpu > 0 {
		r.Add(name+"/cpu-per-renew", float64(m.cpu.Nanoseconds())/1000, "µs")
	}
	if m.serverCPU > 0 {
		r.Add(name+"/server-cpu-per-renew", float64(m.serverCPU.Nanoseconds())/1000, "µs")
	}
	if m.serverSwitches > 0 {
		r.Add(name+"/server-switches-per-renew", m.serverSwitches, "switches")
	}
}

// recorder collects latencies once the warm-up is over.
type recorder struct {
	measuring atomic.Bool
	count     atomic.Int64
	mu        sync.Mutex
	samples   []time.Duration
	// cpu, when set, is the CPU time used so far by everything that serves
	// and sends the renews (client and server): the recorder reports it
	// per renew, a figure that does not depend on the machine's load.
	cpu func() (time.Duration, bool)
	// serverCPU, when set, is the part of cpu spent by the server's own
	// process, read at the same moments.
	serverCPU func() (time.Duration, bool)
	// serverPID, when set, is the server's process, whose context
	// switches are counted at the same moments.
	serverPID int
}

func (rec *recorder) add(local *[]time.Duration, d time.Duration) {
	if !rec.measuring.Load() {
		return
	}
	rec.count.Add(1)
	*local = append(*local, d)
}

func (rec *recorder) merge(local []time.Duration) {
	rec.mu.Lock()
	rec.samples = append(rec.samples, local...)
	rec.mu.Unlock()
}

// run warms up, measures for d and stops the workload by cancelling its
// context; wait must return once every worker merged its samples.
func (rec *recorder) run(ctx context.Context, d time.Duration, cancel context.CancelFunc, wait func() error) (leaseMeasurement, error) {
	warmup := min(d/4, time.Second)
	sleep := func(d time.Duration) error { return clock.Sleep(ctx, clock.Real{}, d) }
	if err := sleep(warmup); err != nil {
		cancel()
		_ = wait()
		return leaseMeasurement{}, err
	}
	var cpuStart, serverStart time.Duration
	cpuOK, serverOK := rec.cpu != nil, rec.serverCPU != nil
	if cpuOK {
		cpuStart, cpuOK = rec.cpu()
	}
	if serverOK {
		serverStart, serverOK = rec.serverCPU()
	}
	switchesStart, switchesOK := childSwitches(rec.serverPID)
	rec.measuring.Store(true)
	start := time.Now()
	serr := sleep(d)
	rec.measuring.Store(false)
	elapsed := time.Since(start)
	var cpu, serverCPU time.Duration
	var switches float64
	if switchesOK {
		end, ok := childSwitches(rec.serverPID)
		if n := rec.count.Load(); ok && n > 0 {
			switches = float64(end-switchesStart) / float64(n)
		}
	}
	if cpuOK {
		cpuEnd, ok := rec.cpu()
		if n := rec.count.Load(); ok && n > 0 {
			cpu = (cpuEnd - cpuStart) / time.Duration(n)
		}
	}
	if serverOK {
		serverEnd, ok := rec.serverCPU()
		if n := rec.count.Load(); ok && n > 0 {
			serverCPU = (serverEnd - serverStart) / time.Duration(n)
		}
	}
	cancel()
	if err := wait(); err != nil {
		return leaseMeasurement{}, err
	}
	if serr != nil {
		return leaseMeasurement{}, serr
	}
	slices.Sort(rec.samples)
	if len(rec.samples) == 0 {
		return leaseMeasurement{}, errors.New("no renewal completed")
	}
	pct := func(p float64) time.Duration {
		return rec.samples[min(len(rec.samples)-1, int(p*float64(len(rec.samples))))]
	}
	return leaseMeasurement{rate: float64(rec.count.Load()) / elapsed.Seconds(), p50: pct(0.50), p99: pct(0.99), cpu: cpu, serverCPU: serverCPU, serverSwitches: switches}, nil
}

// leaseHolder is an agent that holds leases, with its own connection.
type leaseHolder struct {
	nodeID string
	conn   *agentsdk.Conn
	cred   string
	// unaryHTTP1 is the same agent's connection that sends unary calls
	// over HTTP/1.1 (agentsdk.UnaryHTTP1Client); nil where not dialled.
	unaryHTTP1 *agentsdk.Conn
}

// dialedTo returns the holders with connections of their own to the
// server at url (another replica), with the same credentials.
func dialedTo(holders []leaseHolder, url string) []leaseHolder {
	out := make([]leaseHolder, len(holders))
	for i, h := range holders {
		out[i] = leaseHolder{nodeID: h.nodeID, conn: agentsdk.Dial(url, h.cred), cred: h.cred}
	}
	return out
}

// leaseTarget is a server leases are measured on: in this process
// (benchServer) or in its own (processServer).
type leaseTarget interface {
	endpoint() (url string, admin *agentsdk.Conn)
}

func (b *benchServer) endpoint() (string, *agentsdk.Conn) { return b.URL, b.Admin }

func leaseHolders(ctx context.Context, srv leaseTarget, n int) ([]leaseHolder, error) {
	url, admin := srv.endpoint()
	root, err := admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "bench-coordinator"}))
	if err != nil {
		return nil, err
	}
	parent := agentsdk.Dial(url, root.Msg.Credential)
	var out []leaseHolder
	for i := range n {
		child, err := parent.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: root.Msg.Node.NodeId, Name: "worker-" + strconv.Itoa(i)}))
		if err != nil {
			return nil, err
		}
		// Each holder gets its own HTTP/2 connection, as separate agent
		// processes would have.
		out = append(out, leaseHolder{nodeID: child.Msg.Node.NodeId, conn: agentsdk.Dial(url, child.Msg.Credential), cred: child.Msg.Credential,
			unaryHTTP1: agentsdk.Dial(url, child.Msg.Credential, agentsdk.WithHTTPClient(agentsdk.UnaryHTTP1Client(url, nil, 0)))})
	}
	return out, nil
}

// benchLease is one active lease and the holder renewing it.
type benchLease struct {
	holder *leaseHolder
	lease  *tetherv1.Lease
	seq    uint64
}

var leaseJobs atomic.Int64

// offerLeases offers n fresh jobs round-robin to holders and ACKs them.
func offerLeases(ctx context.Context, srv leaseTarget, holders []leaseHolder, n int) ([]*benchLease, error) {
	_, admin := srv.endpoint()
	out := make([]*benchLease, n)
	errs := make(chan error, n)
	sem := make(chan struct{}, 64)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			h := &holders[i%len(holders)]
			job := fmt.Sprintf("bench-job-%d", leaseJobs.Add(1))
			offer, err := admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: h.nodeID, LeaseDuration: durationpb.New(10 * time.Minute)}))
			if err != nil {
				errs <- err
				return
			}
			l := offer.Msg.Lease
			ack, err := h.conn.Lease.Ack(ctx, connect.NewRequest(&tetherv1.AckRequest{JobId: job, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration}))
			if err != nil {
				errs <- err
				return
			}
			if ack.Msg.Decision.Outcome != tetherv1.Outcome_OUTCOME_ACCEPTED {
				errs <- fmt.Errorf("ack refused: %s", ack.Msg.Decision.Reason)
				return
			}
			out[i] = &benchLease{holder: h, lease: ack.Msg.Lease}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, err
	}
	return out, nil
}

func (b *benchLease) renewRequest() *tetherv1.RenewRequest {
	b.seq++
	return &tetherv1.RenewRequest{JobId: b.lease.JobId, LeaseId: b.lease.LeaseId, LeaseGeneration: b.lease.LeaseGeneration, RenewSequence: b.seq}
}

func checkRenewed(d *tetherv1.Decision) error {
	if d.GetOutcome() != tetherv1.Outcome_OUTCOME_ACCEPTED {
		return fmt.Errorf("renew not accepted: %s %s", d.GetAuditEvent(), d.GetReason())
	}
	return nil
}

// measureUnaryRenew renews each lease in a closed loop of unary calls;
// cpu counts the CPU time of the clients and the server. http1 sends them
// through the holders' unaryHTTP1 connections.
func measureUnaryRenew(ctx context.Context, d time.Duration, leases []*benchLease, cpu, serverCPU func() (time.Duration, bool), serverPID int, http1 bool) (leaseMeasurement, error) {
	w := newWorkers(ctx)
	rec := &recorder{cpu: cpu, serverCPU: serverCPU, serverPID: serverPID}
	for _, l := range leases {
		w.wg.Go(func() {
			var local []time.Duration
			defer func() { rec.merge(local) }()
			for w.ctx.Err() == nil {
				start := time.Now()
				conn := l.holder.conn
				if http1 {
					conn = l.holder.unaryHTTP1
				}
				resp, err := conn.Lease.Renew(w.ctx, connect.NewRequest(l.renewRequest()))
				if err == nil {
					err = checkRenewed(resp.Msg.Decision)
				}
				if err != nil {
					w.fail(err)
					return
				}
				rec.add(&local, time.Since(start))
			}
		})
	}
	return rec.run(ctx, d, w.cancel, w.wait)
}

// workers are the closed loops of one measurement: the first error a
// worker reports stops them all and is the measurement's error.
type workers struct {
	ctx    context.Context // ends with the measurement or the first failure
	cancel context.CancelFunc
	wg     sync.WaitGroup
	first  atomic.Value
}

func newWorkers(ctx context.Context) *workers {
	w := &workers{}
	w.ctx, w.cancel = context.WithCancel(ctx)
	return w
}

// fail stops every worker with err, unless the measurement already ended
// (then the workers' errors are only the end's echo).
func (w *workers) fail(err error) {
	if w.ctx.Err() == nil {
		w.first.CompareAndSwap(nil, err)
		w.cancel()
	}
}

// wait waits for every worker and returns the first error one reported.
func (w *workers) wait() error {
	w.wg.Wait()
	if err, ok := w.first.Load().(error); ok {
		return err
	}
	return nil
}

// measureStreamRenew renews each lease in a closed loop over its holder's
// Channel stream: a stream carries many leases at once, the renewals that
// are ready together travel in one stream message (ChannelRequest.batch),
// and answers come back in any order, matched by correlation id. Every
// renewal is still its own message, judged and made durable on its own.
// Each lease has at most window renewals in flight: with window 1 the next
// renewal waits for the answer to the previous one (as with a
// compare-and-swap on etcd, which needs the previous revision); with more,
// a holder sends renewal n+1 before renewal n is answered, which the
// stream allows because each renewal is judged on its own sequence.
func measureStreamRenew(ctx context.Context, d time.Duration, leases []*benchLease, window int) (leaseMeasurement, error) {
	w := newWorkers(ctx)
	rec := &recorder{cpu: processCPU} // the bench's clients and the server
	byHolder := map[*leaseHolder][]int{}
	for i, l := range leases {
		byHolder[l.holder] = append(byHolder[l.holder], i)
	}
	for h, idx := range byHolder {
		w.wg.Go(func() {
			stream := h.conn.Lease.Channel(w.ctx)
			stop := context.AfterFunc(w.ctx, func() { _ = stream.CloseResponse() })
			defer stop()
			// A renewal's correlation id is its slot: lease i, sequence s
			// uses slot i*window + s%window, free again once answered.
			sentAt := make([]time.Time, len(leases)*window)
			send := func(ready []int) error {
				now := time.Now()
				msgs := make([]*tetherv1.ChannelRequest, len(ready))
				for k, i := range ready {
					req := leases[i].renewRequest()
					slot := i*window + int(req.RenewSequence%uint64(window))
					sentAt[slot] = now
					msgs[k] = &tetherv1.ChannelRequest{CorrelationId: uint64(slot), Message: &tetherv1.ChannelRequest_Renew{Renew: req}}
				}
				first := msgs[0]
				first.Batch = msgs[1:]
				return stream.Send(first)
			}
			var local []time.Duration
			defer func() {
				rec.merge(local)
				_ = stream.CloseRequest()
				_ = stream.CloseResponse()
			}()
			var ready []int
			for range window {
				ready = append(ready, idx...)
			}
			if err := send(ready); err != nil {
				w.fail(err)
				return
			}
			for w.ctx.Err() == nil {
				resp, err := stream.Receive()
				if err != nil {
					w.fail(err)
					return
				}
				answers := append([]*tetherv1.ChannelResponse{resp}, resp.Batch...)
				ready = ready[:0]
				for _, a := range answers {
					slot := int(a.CorrelationId)
					if a.Error != "" {
						w.fail(errors.New(a.Error))
						return
					}
					if err := checkRenewed(a.Decision); err != nil {
						w.fail(err)
						return
					}
					rec.add(&local, time.Since(sentAt[slot]))
					ready = append(ready, slot/window)
				}
				if err := send(ready); err != nil {
					w.fail(err)
					return
				}
			}
		})
	}
	return rec.run(ctx, d, w.cancel, w.wait)
}

type etcdServer struct {
	client   *clientv3.Client
	endpoint string
	pid      int
	stop     func()
}

// cpu is the CPU time of the etcd server and of this process (the bench's
// etcd clients) together.
func (s *etcdServer) cpu() (time.Duration, bool) {
	server, ok1 := childCPU(s.pid)
	clients, ok2 := processCPU()
	return server + clients, ok1 && ok2
}

// clients returns n clients, each with its own connection, as n agent
// processes would have; the first is the server's own.
func (s *etcdServer) clients(n int) ([]*clientv3.Client, func(), error) {
	out := []*clientv3.Client{s.client}
	closeAll := func() {
		for _, c := range out[1:] {
			c.Close()
		}
	}
	for len(out) < n {
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{s.endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		out = append(out, c)
	}
	return out, closeAll, nil
}

// startEtcd runs a local etcd member (startLocalEtcd) with default
// durability (the WAL is fsynced before a write is acknowledged) and a
// client of it. Its backend quota is raised: the renew loops write a
// revision per renewal.
func startEtcd(ctx context.Context, r *Report) (*etcdServer, error) {
	cluster, stop, err := startLocalEtcd(ctx, r, "tether-bench-etcd-*", "--quota-backend-bytes="+strconv.Itoa(8<<30))
	if err != nil {
		return nil, err
	}
	endpoint := cluster.Endpoints()[0]
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		stop()
		return nil, err
	}
	return &etcdServer{client: c, endpoint: endpoint, pid: cluster.Members[0].Pid(), stop: func() { c.Close(); stop() }}, nil
}

var etcdRound atomic.Int64

// measureEtcdRenew is the user-built equivalent: each lease is a key whose
// value records holder, generation, renew sequence and expiry; a renew is a
// transaction that writes the new value only if the key's mod_revision is
// the one this holder last wrote (fencing), else reads the current value.
// The leases are spread over as many clients (connections) as the
// streaming measurement has holders.
func measureEtcdRenew(ctx context.Context, d time.Duration, etcd *etcdServer, n int) (leaseMeasurement, error) {
	clients, closeClients, err := etcd.clients(leaseStreams(n))
	if err != nil {
		return leaseMeasurement{}, err
	}
	defer closeClients()
	c := clients[0]
	round := etcdRound.Add(1)
	keys := make([]string, n)
	revs := make([]int64, n)
	for i := range n {
		keys[i] = fmt.Sprintf("/leases/round-%d/job-%d", round, i)
		resp, err := c.Put(ctx, keys[i], etcdValue(i, 0))
		if err != nil {
			return leaseMeasurement{}, err
		}
		revs[i] = resp.Header.Revision
	}
	w := newWorkers(ctx)
	rec := &recorder{cpu: etcd.cpu, serverCPU: func() (time.Duration, bool) { return childCPU(etcd.pid) }, serverPID: etcd.pid}
	for i := range n {
		w.wg.Go(func() {
			var local []time.Duration
			defer func() { rec.merge(local) }()
			for seq := uint64(1); w.ctx.Err() == nil; seq++ {
				start := time.Now()
				resp, err := clients[i%len(clients)].Txn(w.ctx).
					If(clientv3.Compare(clientv3.ModRevision(keys[i]), "=", revs[i])).
					Then(clientv3.OpPut(keys[i], etcdValue(i, seq))).
					Else(clientv3.OpGet(keys[i])).
					Commit()
				if err == nil && !resp.Succeeded {
					err = fmt.Errorf("renew of %s lost its fence", keys[i])
				}
				if err != nil {
					w.fail(err)
					return
				}
				revs[i] = resp.Header.Revision
				rec.add(&local, time.Since(start))
			}
		})
	}
	return rec.run(ctx, d, w.cancel, w.wait)
}

func etcdValue(i int, seq uint64) string {
	return fmt.Sprintf(`{"job_id":"job-%d","lease_id":"l_%020d","lease_generation":1,"holder_identity":"n_bench%015d","renew_sequence":%d,"lease_duration":"600s","expires_at":"%s"}`,
		i, i, i, seq, time.Now().Add(10*time.Minute).UTC().Format(time.RFC3339Nano))
}
