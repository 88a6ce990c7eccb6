package etcdstore_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"sync"
	"testing"

	"github.com/tetherhq/tether/internal/etcdtest"
	"github.com/tetherhq/tether/internal/store"
)

// BenchmarkEtcdWaveSharingKeys measures a wave of concurrent Updates of
// one process, each writing keys of its own and one of `shared` keys (as
// a termination's cancel acknowledgements each write their node's records
// and their node's shard of each ancestor's totals): shared = 1 is a hot
// key (one agent's calls: its shard is the same at every ancestor), 64
// about twice the wave (the stop rules' totals have 256 shards, and a
// wave's members meet in one when their nodes' ids hash alike). One op is
// one wave of 32; it reports the commit requests, the comparisons they
// carried, the conflicts and the doomed commits (answered without a
// request) a wave took.
//
//	go test -run '^$' -bench EtcdWaveSharingKeys -benchtime 30x ./internal/store/etcdstore/
func BenchmarkEtcdWaveSharingKeys(b *testing.B) {
	cluster := etcdtest.Start(b)
	for _, shared := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("shared=%d", shared), func(b *testing.B) {
			s := etcdtest.OpenStore(b, cluster)
			ctx := context.Background()
			before := s.Stats()
			b.ResetTimer()
			for i := range b.N {
				var wg sync.WaitGroup
				for g := range 32 {
					wg.Go(func() {
						err := s.Update(ctx, func(tx store.Txn) error {
							// A node's shard is a hash of its id: here of
							// the wave and the member.
							h := fnv.New32a()
							fmt.Fprintf(h, "%d/%d", i, g)
							key := []byte("shard/" + strconv.Itoa(int(h.Sum32())%shared))
							n := 0
							v, err := tx.Get(key)
							if err == nil {
								n, _ = strconv.Atoi(string(v))
							} else if !errors.Is(err, store.ErrNotFound) {
								return err
							}
							if err := tx.Put(key, []byte(strconv.Itoa(n+1))); err != nil {
								return err
							}
							return tx.Put([]byte(fmt.Sprintf("own/%d/%d", i, g)), []byte("x"))
						})
						if err != nil {
							b.Error(err)
						}
					})
				}
				wg.Wait()
			}
			b.StopTimer()
			after := s.Stats()
			ops := float64(b.N)
			b.ReportMetric(float64(after.CommitRequests-before.CommitRequests)/ops, "commits/op")
			b.ReportMetric(float64(after.Conflicts-before.Conflicts)/ops, "conflicts/op")
			b.ReportMetric(float64(after.Doomed-before.Doomed)/ops, "doomed/op")
			b.ReportMetric(float64(after.Compares-before.Compares)/ops, "compares/op")
		})
	}
}
