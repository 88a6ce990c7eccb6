package controlplane_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/etcdtest"
	"github.com/tetherhq/tether/internal/store/etcdstore"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The twenty-third hostile pass over the bounds a rogue agent can pass,
// or spend for others: against the real server, on Badger and on etcd.

// onEachStore runs test on a server on Badger, and on two replicas
// sharing one etcd keyspace (skipped without etcd unless
// TETHER_REQUIRE_ETCD is set), each with opts.
func onEachStore(t *testing.T, test func(t *testing.T, replicas []*testserver.Server), opts ...testserver.Option) {
	t.Run("badger", func(t *testing.T) {
		test(t, []*testserver.Server{testserver.StartIn(t, t.TempDir(), opts...)})
	})
	t.Run("etcd", func(t *testing.T) {
		cluster := etcdtest.Start(t)
		prefix := etcdtest.Prefix(t)
		var replicas []*testserver.Server
		for i := range 2 {
			st := etcdtest.OpenStore(t, cluster, func(o *etcdstore.EtcdOptions) { o.Prefix = prefix })
			replicas = append(replicas, testserver.Start(t, append([]testserver.Option{testserver.WithEtcdStore(st, fmt.Sprintf("replica-%d", i))}, opts...)...))
		}
		test(t, replicas)
	})
}

// TestRogue24ConcurrentDelegationsCannotPassTheGrantBound: the bound on a
// node's live grants (--grant-max-per-node) was read in the transaction
// that writes the grant, and design §11 said delegations in flight at
// once might each pass it. A rogue fires many Delegate calls to its
// child at once, round after round (on etcd through two replicas, half
// each); the child never holds more live grants than the bound, and
// every refusal beyond it is the bound's. It held before this pass too
// (8 of 48 accepted, every round, on either store): Badger's committer
// runs Updates one after another, and an etcd commit compares the
// revisions of every range its transaction scanned, so a grant another
// commit wrote into the holder's index fails it and it runs again. The
// test keeps it so.
func TestRogue24ConcurrentDelegationsCannotPassTheGrantBound(t *testing.T) {
	const (
		limit  = 8
		burst  = 48
		rounds = 4
	)
	onEachStore(t, func(t *testing.T, replicas []*testserver.Server) {
		admin := replicas[0].AdminClients()
		rogue := register(t, admin, "rogue")
		rc := replicas[0].Clients(rogue.Credential)
		var through []*testserver.Clients
		for _, r := range replicas {
			through = append(through, r.Clients(rogue.Credential))
		}
		root := issueRoot(t, admin, rogue.Node.NodeId, time.Hour, "tool:*")
		sink := spawn(t, rc, rogue.Node.NodeId, "sink")
		for round := range rounds {
			var (
				wg       sync.WaitGroup
				mu       sync.Mutex
				accepted int
				other    []error
			)
			start := make(chan struct{})
			for i := range burst {
				c := through[i%len(through)]
				wg.Go(func() {
					<-start
					_, err := c.Capability.Delegate(context.Background(), connect.NewRequest(&tetherv1.DelegateRequest{
						ParentGrantId: root.grant.GrantId, HolderNodeId: sink.Node.NodeId, Scopes: []string{"tool:http"}, Ttl: durationpb.New(30 * time.Minute)}))
					mu.Lock()
					defer mu.Unlock()
					switch {
					case err == nil:
						accepted++
					case connect.CodeOf(err) == connect.CodeResourceExhausted && strings.Contains(err.Error(), "--grant-max-per-node"):
					default:
						other = append(other, err)
					}
				})
			}
			close(start)
			wg.Wait()
			for _, err := range other {
				t.Errorf("round %d: a delegation failed otherwise than by the bound: %v", round, err)
			}
			live := 0
			for _, g := range allGrants(t, admin, &tetherv1.ListGrantsRequest{HolderNodeId: sink.Node.NodeId}) {
				if g.State == tetherv1.GrantState_GRANT_STATE_ACTIVE {
					live++
				}
			}
			t.Logf("round %d: %d of %d delegations at once accepted; the sink holds %d live grants (bound %d)", round, accepted, burst, live, limit)
			if live > limit {
				t.Fatalf("round %d: %d delegations at once left the sink holding %d live grants, past the bound of %d", round, burst, live, limit)
			}
			if round == 0 && accepted != limit {
				t.Fatalf("round 0: %d of %d delegations to an empty node accepted, want %d (the bound)", accepted, burst, limit)
			}
			// Free the places for the next round.
			if _, err := rc.Capability.Revoke(context.Background(), connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_SubtreeNodeId{SubtreeNodeId: sink.Node.NodeId}, Reason: fmt.Sprintf("round %d", round)})); err != nil {
				t.Fatal(err)
			}
		}
	}, testserver.WithClock(clock.NewManual(epoch)), func(cfg *controlplane.Config) { cfg.GrantMaxPerNode = limit })
}
