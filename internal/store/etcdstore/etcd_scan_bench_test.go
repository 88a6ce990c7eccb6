package etcdstore_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/tetherhq/tether/internal/etcdtest"
	"github.com/tetherhq/tether/internal/store"
)

// BenchmarkEtcdScanPage measures one page of a Scan (the first 512 keys)
// of a prefix holding n keys: what a resumable walk of a large prefix,
// such as the grant marker's, pays per page. A page that costs the same
// whatever n is keeps such a walk linear.
//
//	go test -run '^$' -bench EtcdScanPage ./internal/store/etcdstore/
func BenchmarkEtcdScanPage(b *testing.B) {
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
			for b.Loop() {
				seen := 0
				err := st.View(ctx, func(tx store.ReadTxn) error {
					return tx.Scan([]byte("big/"), nil, func(_, _ []byte) error {
						if seen++; seen == 512 {
							return store.ErrStopScan
						}
						return nil
					})
				})
				if err != nil || seen != 512 {
					b.Fatalf("scanned %d keys: %v", seen, err)
				}
			}
		})
	}
}
