package bench

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/internal/store"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The lone-renew benchmarks take one unary Renew apart: the renew itself,
// the RPC floor (an authenticated unary read on the same connection, with
// no store write) and the durability floor (one durable Update of one
// small key, one group commit with one sync) on the same server and disk.
// Profile with, for example:
//
//	go test -run '^$' -bench 'Lone' -cpuprofile cpu.out ./internal/bench/
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
