package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tetherhq/tether/internal/etcdlocal"
)

// BenchmarkEtcdTxnShape measures what one fenced transaction costs a local
// etcd member's CPU (read from /proc), by its shape: how many keys it
// writes and how large they are, one comparison each, as the lease
// coordinator's commits are (a term comparison and the batch's puts). The
// shapes alternate, three rounds of a second each, and each reports the
// median of its rounds. It is the model behind the etcd stream renew's
// ratio to Badger's (docs/capacity.md, "The renew paths on a quiet
// machine"): a fixed cost per transaction, and a cost per key and per
// kilobyte written.
//
//	go test -run '^$' -bench 'EtcdTxnShape' -benchtime 1x ./cmd/tether-bench/internal/bench/
func BenchmarkEtcdTxnShape(b *testing.B) {
	ctx := context.Background()
	r := &Report{Dir: b.TempDir()}
	etcd, err := startEtcd(ctx, r)
	if errors.Is(err, etcdlocal.ErrNoBinary) {
		b.Skip("etcd is not installed")
	}
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(etcd.stop)
	if _, ok := childCPU(etcd.pid); !ok {
		b.Skip("the member's CPU cannot be read here")
	}
	shapes := []struct {
		name        string
		keys, bytes int
	}{
		{"1x100B", 1, 100}, {"9x1KB", 9, 1000}, {"1x9KB", 1, 9000}, {"90x100B", 90, 100},
		{"1x90KB", 1, 90000}, {"2x45KB", 2, 45000}, {"175x500B", 175, 500},
	}
	const rounds = 3
	cpu := make([][]float64, len(shapes))
	latency := make([][]float64, len(shapes))
	seq := 0
	for b.Loop() {
		for range rounds {
			for i, s := range shapes {
				value := strings.Repeat("x", s.bytes)
				before, _ := childCPU(etcd.pid)
				start := time.Now()
				n := 0
				for time.Since(start) < time.Second {
					ops := make([]clientv3.Op, s.keys)
					for k := range ops {
						seq++
						// A few rounds' worth of keys, overwritten, as the
						// coordinator's alive and log keys are.
						ops[k] = clientv3.OpPut(fmt.Sprintf("shape/%s/%d", s.name, seq%(s.keys*16)), value)
					}
					if _, err := etcd.client.Txn(ctx).If(clientv3.Compare(clientv3.Version("term"), "=", 0)).Then(ops...).Commit(); err != nil {
						b.Fatalf("%s: %v", s.name, err)
					}
					n++
				}
				elapsed := time.Since(start)
				after, _ := childCPU(etcd.pid)
				cpu[i] = append(cpu[i], float64((after-before).Microseconds())/float64(n))
				latency[i] = append(latency[i], float64(elapsed.Microseconds())/float64(n))
			}
		}
	}
	median := func(v []float64) float64 { slices.Sort(v); return v[len(v)/2] }
	for i, s := range shapes {
		b.ReportMetric(median(cpu[i]), s.name+"-member-cpu-µs/txn")
		b.ReportMetric(median(latency[i]), s.name+"-µs/txn")
	}
}
