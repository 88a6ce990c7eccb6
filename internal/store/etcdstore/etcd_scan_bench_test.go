package etcdstore_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/tetherhq/tether/internal/etcdtest"
	"github.com/tetherhq/tether/internal/store"
)

// BenchmarkEtcdScan measures, over a prefix holding n keys, one page of a
// Scan (its first 512 keys: what each batch of a resumable walk such as
// the grant marker's reads) and a Scan of the whole prefix. On etcd a
// range request costs as much as the keys in its range, however few it
// returns: the page grows with n, and the whole scan must not grow faster
// than n.
//
//	go test -run '^$' -bench EtcdScan ./internal/store/etcdstore/
func BenchmarkEtcdScan(b *testing.B) {
	cluster := etcdtest.Start(b)
	for _, n := range []int{1_000, 10_000, 100_000} {
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			st := etcdtest.OpenStore(b, cluster)
			ctx := context.Background()
			for i := 0; i < n; {
				err := st.Update(ctx, func(tx store.Txn) error {
					for j := i; j < min(i+500, n); j++ {
						if err := tx.Put(fmt.Appendf(nil, "big/%08d", j), nil); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
				i = min(i+500, n)
			}
			b.Run("page", func(b *testing.B) { benchScan(b, st, 512) })
			b.Run("whole", func(b *testing.B) { benchScan(b, st, n) })
		})
	}
}

// benchScan scans the first want keys of the prefix "big/" in one View.
func benchScan(b *testing.B, st store.Store, want int) {
	ctx := context.Background()
	for b.Loop() {
		seen := 0
		err := st.View(ctx, func(tx store.ReadTxn) error {
			return tx.Scan([]byte("big/"), nil, func(_, _ []byte) error {
				if seen++; seen == want {
					return store.ErrStopScan
				}
				return nil
			})
		})
		if err != nil || seen != want {
			b.Fatalf("scanned %d keys: %v", seen, err)
		}
	}
}
