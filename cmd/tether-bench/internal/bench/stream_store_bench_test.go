package bench

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/etcdlocal"
)

// BenchmarkStreamRenewOnStore takes server/etcd-vs-badger's stream renew
// at 64 leases apart, one store at a time (Badger on disk, a local etcd
// member): closed-loop Channel renewals for three-second rounds, reporting
// the medians of the rate and of the CPU per renewal, this process's
// (clients and server) and, on etcd, the member's. CPU per renewal is what
// a change to the renew path's own work moves on a shared machine; A/B it
// against the base in the same minutes, with -cpuprofile for the shares:
//
//	go test -run '^$' -bench 'StreamRenewOnStore/etcd' -benchtime 1x ./cmd/tether-bench/internal/bench/
func BenchmarkStreamRenewOnStore(b *testing.B) {
	const leasesN, rounds = 64, 3
	for _, store := range []string{"badger", "etcd"} {
		b.Run(store, func(b *testing.B) {
			ctx := context.Background()
			r := &Report{Dir: b.TempDir(), Duration: 3 * time.Second}
			var srv *benchServer
			if store == "etcd" {
				cluster, stop, err := startLocalEtcd(ctx, r, "tether-bench-stream-store-*")
				if errors.Is(err, etcdlocal.ErrNoBinary) {
					b.Skip("etcd is not installed")
				}
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(stop)
				s, stopServer, err := startEtcdServer(ctx, r, cluster)
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(stopServer)
				srv = s
			} else {
				s, err := startServer(ctx, r, disableRateLimit)
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(s.Stop)
				srv = s
			}
			holders, err := leaseHolders(ctx, srv, leaseStreams(leasesN))
			if err != nil {
				b.Fatal(err)
			}
			leases, err := offerLeases(ctx, srv, holders, leasesN)
			if err != nil {
				b.Fatal(err)
			}
			figures := map[string][]float64{}
			for b.Loop() {
				for round := range rounds {
					rr := &Report{Dir: r.Dir, Duration: r.Duration}
					if _, err := measureStreamWithCommits(ctx, rr, srv, "s", leases, 1); err != nil {
						b.Fatalf("round %d: %v", round+1, err)
					}
					for _, x := range rr.Results() {
						figures[x.Name] = append(figures[x.Name], x.Value)
					}
				}
			}
			for name, unit := range map[string]string{"s": "renews/s", "s/cpu-us-per-renew": "cpu-µs/renew",
				"s/etcd-cpu-us-per-renew": "member-cpu-µs/renew", "s/renews-per-commit": "renews/commit"} {
				if v := figures[name]; len(v) > 0 {
					slices.Sort(v)
					b.ReportMetric(v[len(v)/2], unit)
				}
			}
			b.ReportMetric(float64(leasesN), "leases")
		})
	}
}
