package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tetherhq/tether/internal/etcdlocal"
)

// renewSyscalls are the server-side events counted per lone renew:
// the syncs first (what durability costs: one per renew on each system
// makes the comparison fair), then the system calls that carry the
// hand-offs and the I/O.
var renewSyscalls = []string{
	"syscalls:sys_enter_msync", "syscalls:sys_enter_fsync", "syscalls:sys_enter_fdatasync",
	"syscalls:sys_enter_pwrite64", "syscalls:sys_enter_write", "syscalls:sys_enter_read",
	"syscalls:sys_enter_futex", "syscalls:sys_enter_epoll_pwait", "syscalls:sys_enter_nanosleep",
	"raw_syscalls:sys_enter", "context-switches",
}

// BenchmarkRenewSyscalls counts, with `perf stat` attached to each server
// process, the system calls and context switches a lone fenced renew
// costs its server: Tether's unary Renew over HTTP/2 (the path agentsdk's
// Dial and LeaseWorker take), the same over HTTP/1.1
// (agentsdk.UnaryHTTP1Client), and etcd's compare-and-swap. The counts
// say whether both sides sync once per renew (the fairness of the
// comparison) and where the rest of the calls go. It needs perf and the
// right to attach it (root, or perf_event_paranoid ≤ 1):
//
//	go test -run '^$' -bench 'RenewSyscalls' -benchtime 1x ./cmd/tether-bench/internal/bench/
func BenchmarkRenewSyscalls(b *testing.B) {
	if _, err := exec.LookPath("perf"); err != nil {
		b.Skip("perf is not installed")
	}
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
	holders, err := leaseHolders(ctx, proc, 1)
	if err != nil {
		b.Fatal(err)
	}
	leases, err := offerLeases(ctx, proc, holders, 1)
	if err != nil {
		b.Fatal(err)
	}
	l := leases[0]
	const renews = 3000
	tether := func(http1 bool) func() error {
		return func() error {
			conn := l.holder.conn
			if http1 {
				conn = l.holder.unaryHTTP1
			}
			for range renews {
				resp, err := conn.Lease.Renew(ctx, connect.NewRequest(l.renewRequest()))
				if err == nil {
					err = checkRenewed(resp.Msg.Decision)
				}
				if err != nil {
					return err
				}
			}
			return nil
		}
	}
	key := "/leases/syscalls/job-0"
	put, err := etcd.client.Put(ctx, key, etcdValue(0, 0))
	if err != nil {
		b.Fatal(err)
	}
	rev := put.Header.Revision
	etcdRenews := func() error {
		for seq := uint64(1); seq <= renews; seq++ {
			resp, err := etcd.client.Txn(ctx).
				If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).
				Then(clientv3.OpPut(key, etcdValue(0, seq))).
				Else(clientv3.OpGet(key)).
				Commit()
			if err == nil && !resp.Succeeded {
				err = errors.New("the etcd renew lost its fence")
			}
			if err != nil {
				return err
			}
			rev = resp.Header.Revision
		}
		return nil
	}
	for _, c := range []struct {
		name string
		pid  int
		run  func() error
	}{
		{"tether-http2", proc.pid, tether(false)},
		{"tether-http1", proc.pid, tether(true)},
		{"etcd", etcd.pid, etcdRenews},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				// Warm the connection and the server's caches first.
				if err := c.run(); err != nil {
					b.Fatal(err)
				}
				counts, cpu, elapsed, err := perfCount(c.pid, c.run)
				if err != nil {
					b.Fatal(err)
				}
				for _, ev := range renewSyscalls {
					name := ev[strings.LastIndexAny(ev, ":_")+1:]
					if ev == "raw_syscalls:sys_enter" {
						name = "syscalls"
					}
					b.ReportMetric(counts[ev]/renews, name+"/renew")
				}
				b.ReportMetric(float64(cpu.Microseconds())/renews, "server-cpu-µs/renew")
				b.ReportMetric(float64(renews)/elapsed.Seconds(), "renews/s")
			}
		})
	}
}

// perfCount runs fn with `perf stat` counting renewSyscalls in process
// pid (all its threads) and returns the counts, the process's CPU time and
// fn's time. perf counts in intervals (summed here): fn starts once the
// first interval is written, so the counters are open.
func perfCount(pid int, fn func() error) (map[string]float64, time.Duration, time.Duration, error) {
	out, err := os.CreateTemp("", "perf-stat-*")
	if err != nil {
		return nil, 0, 0, err
	}
	defer os.Remove(out.Name())
	out.Close()
	cmd := exec.Command("perf", "stat", "-I", "100", "-x,", "-o", out.Name(), "-e", strings.Join(renewSyscalls, ","), "-p", strconv.Itoa(pid))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return nil, 0, 0, err
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		if data, err := os.ReadFile(out.Name()); err == nil && bytes.Contains(data, []byte("raw_syscalls")) {
			break
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return nil, 0, 0, fmt.Errorf("perf stat did not start: %s", stderr.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	cpuStart, _ := childCPU(pid)
	start := time.Now()
	runErr := fn()
	elapsed := time.Since(start)
	cpuEnd, _ := childCPU(pid)
	_ = cmd.Process.Signal(syscall.SIGINT)
	_ = cmd.Wait()
	if runErr != nil {
		return nil, 0, 0, runErr
	}
	data, err := os.ReadFile(filepath.Clean(out.Name()))
	if err != nil {
		return nil, 0, 0, err
	}
	counts := map[string]float64{}
	for _, line := range strings.Split(string(data), "\n") {
		// An interval's line: time,count,unit,event,…
		f := strings.Split(strings.TrimSpace(line), ",")
		if len(f) < 4 || strings.HasPrefix(line, "#") {
			continue
		}
		v, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			continue
		}
		counts[f[3]] += v
	}
	if len(counts) == 0 {
		return nil, 0, 0, fmt.Errorf("perf stat counted nothing: %s %s", data, stderr.String())
	}
	return counts, cpuEnd - cpuStart, elapsed, nil
}
