package grantstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/etcdtest"
	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/tree"
)

// BenchmarkMarkerEtcd measures the background marker on a real etcd: one
// revoked root over a two-level subtree of about n descendants. Each
// iteration builds a fresh subtree (untimed), revokes its root and runs
// MarkPending to completion; the figure to read is ns/descendant, which a
// linear marker keeps flat as n grows.
//
//	go test -run '^$' -bench MarkerEtcd ./capability/grantstore/
func BenchmarkMarkerEtcd(b *testing.B) {
	for _, n := range []int{10_000, 30_000} {
		b.Run(fmt.Sprintf("descendants=%d", n), func(b *testing.B) {
			cluster := etcdtest.Start(b)
			st := etcdtest.OpenStore(b, cluster)
			key, err := capability.NewSigningKey(nil, epoch, epoch)
			if err != nil {
				b.Fatal(err)
			}
			clk := clock.NewManual(epoch)
			tr := &tree.Tree{Store: st, Clock: clk, Limits: tree.DefaultLimits}
			svc, err := New(Config{Store: st, Tree: agentTree{tr}, Clock: clk, Keys: func() capability.KeyRing { return capability.KeyRing{Keys: []capability.SigningKey{key}} }, Log: quiet})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			rootNode, err := tr.RegisterRoot(ctx, "root", nil, "operator:alice")
			if err != nil {
				b.Fatal(err)
			}
			holders := []string{rootNode.NodeID}
			for i := 1; i < 3; i++ {
				child, err := tr.Spawn(ctx, holders[i-1], "child", nil, "operator:alice", nil)
				if err != nil {
					b.Fatal(err)
				}
				holders = append(holders, child.NodeID)
			}
			fanout := 1
			for fanout+fanout*fanout < n {
				fanout++
			}
			for b.Loop() {
				b.StopTimer()
				rootID := benchSubtree(b, st, clk.Now(), holders, fanout)
				if _, err := svc.Revoke(ctx, security, Target{GrantID: rootID}, "bench"); err != nil {
					b.Fatal(err)
				}
				before := st.Stats()
				b.StartTimer()
				marked, err := svc.MarkPending(ctx)
				b.StopTimer()
				if err != nil {
					b.Fatal(err)
				}
				if want := fanout + fanout*fanout; marked != want {
					b.Fatalf("marked %d, want %d", marked, want)
				}
				after := st.Stats()
				b.ReportMetric(float64(after.ReadRequests-before.ReadRequests)/float64(marked)*1000, "reads/kgrant")
				b.StartTimer()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(fanout+fanout*fanout), "ns/descendant")
		})
	}
}

// benchSubtree writes a root grant for holders[0] and fanout grants below
// each grant of the level above, in transactions of a few hundred grants
// (etcd bounds a transaction), and returns the root's id.
func benchSubtree(b *testing.B, st store.Store, now time.Time, holders []string, fanout int) string {
	b.Helper()
	root, err := capability.NewRoot(capability.RootRequest{GrantID: id.New(id.Grant), Issuer: "operator:alice", HolderNodeID: holders[0], Scopes: []string{"tool:*"}, TTL: time.Hour}, now)
	if err != nil {
		b.Fatal(err)
	}
	all := []capability.Grant{root}
	level := []capability.Grant{root}
	for depth := 1; depth < len(holders); depth++ {
		var next []capability.Grant
		for _, parent := range level {
			for range fanout {
				g, err := capability.Delegate(parent, capability.DelegateRequest{
					GrantID: id.New(id.Grant), Issuer: capability.AgentPrincipal(parent.HolderNodeID), HolderNodeID: holders[depth], Scopes: []string{"tool:shell"},
				}, holders[:depth], now)
				if err != nil {
					b.Fatal(err)
				}
				next = append(next, g)
			}
		}
		all = append(all, next...)
		level = next
	}
	for len(all) > 0 {
		part := all[:min(20, len(all))]
		all = all[len(part):]
		err := st.Update(context.Background(), func(tx store.Txn) error {
			for _, g := range part {
				if err := PutNewGrantIn(tx, &tree.Tree{}, g); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	return root.GrantID
}
