package controlplane_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/etcdtest"
	"github.com/tetherhq/tether/internal/store/etcdstore"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestFlakeAFollowerThatTakesOverDuringItsReadShowsWhatTheClockDecided:
// on etcd a follower reads a lease from the store and, when the clock has
// passed one of its deadlines, sends the read to the leader. Whether it
// serves itself was asked after the read: a follower whose coordinator
// began serving in between (it took over the leadership) answered what it
// had read before its recovery decided the deadline — a quiet holder's
// lease ACTIVE past its expiry; the coordinator's recovery answers it
// EXPIRED, or ACTIVE with the restart's grace (PlanRestart). Here another candidate (one that serves
// nothing) holds the election while the leader stops and the clock passes
// the expiry; the follower's read is held, once it has read the store,
// until the follower leads and serves.
func TestFlakeAFollowerThatTakesOverDuringItsReadShowsWhatTheClockDecided(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the etcd replica tests; make test and CI run them.")
	}
	clk := clock.NewManual(epoch)
	cluster := etcdtest.Start(t)
	prefix := etcdtest.Prefix(t)
	open := func() *etcdstore.Etcd {
		return etcdtest.OpenStore(t, cluster, func(o *etcdstore.EtcdOptions) { o.Prefix = prefix })
	}
	ctx := context.Background()

	first := testserver.Start(t, testserver.WithEtcdStore(open(), "replica-first"), testserver.WithClock(clk))
	testserver.WaitFor(t, replicaWait, "the first replica to lead and serve the leases", func() bool {
		serving, _ := first.Leases().Serving()
		return serving
	})
	admin := first.AdminClients()
	root := register(t, admin, "planner")
	w1 := spawn(t, first.Clients(root.Credential), root.Node.NodeId, "w1")
	offer, err := admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "flake28-quiet", HolderIdentity: w1.Node.NodeId,
		LeaseDuration: durationpb.New(30 * time.Second)}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := first.Clients(w1.Credential).Lease.Ack(ctx, connect.NewRequest(ack(offer.Msg.Lease).GetAck())); err != nil {
		t.Fatal(err)
	}

	// A candidate that serves nothing campaigns next, then the follower.
	blocker := electionOf(t, cluster, prefix)
	blocker.Identity = "blocker"
	leading, release := make(chan struct{}), make(chan struct{})
	blockerCtx, stopBlocker := context.WithCancel(ctx)
	blocked := make(chan error, 1)
	go func() {
		blocked <- blocker.Lead(blockerCtx, func(ctx context.Context) error {
			close(leading)
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil
		})
	}()
	t.Cleanup(func() { stopBlocker(); <-blocked })
	testserver.WaitFor(t, replicaWait, "the blocker to campaign", func() bool {
		resp, err := blocker.Client.Get(ctx, blocker.Prefix+"/", clientv3.WithPrefix())
		return err == nil && len(resp.Kvs) == 2
	})
	follower := testserver.Start(t, testserver.WithEtcdStore(open(), "replica-follower"), testserver.WithClock(clk))

	first.Stop() // the blocker leads; nobody serves the leases
	select {
	case <-leading:
	case <-time.After(replicaWait):
		t.Fatal("the blocker never led")
	}
	clk.Advance(31 * time.Second) // past the expiry, while nobody serves

	held := make(chan struct{}, 1)
	t.Cleanup(controlplane.HoldLeaseReadsUntilServingAndTell(held))
	type answer struct {
		l   *tetherv1.Lease
		err error
	}
	answers := make(chan answer, 1)
	go func() {
		resp, err := follower.AdminClients().Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: "flake28-quiet"}))
		answers <- answer{resp.Msg.GetLease(), err}
	}()
	select {
	case <-held:
	case <-time.After(replicaWait):
		t.Fatal("the follower's read never read the store")
	}
	if serving, _ := follower.Leases().Serving(); serving {
		t.Fatal("the follower served before the blocker let go: the read did not race its start")
	}
	close(release) // the follower leads, recovers, serves
	var got answer
	select {
	case got = <-answers:
	case <-time.After(replicaWait):
		t.Fatal("the follower's read never answered")
	}
	if got.err != nil {
		t.Fatal(got.err)
	}
	if got.l.State == tetherv1.LeaseState_LEASE_STATE_ACTIVE && !clk.Now().Before(got.l.ExpiresAt.AsTime()) {
		t.Fatalf("the quiet holder's lease 1s past its expiry reads %s, expires %s, now %s; want what the follower's coordinator decided once it led (EXPIRED, or ACTIVE with the restart's grace)",
			got.l.State, got.l.ExpiresAt.AsTime().Format(time.RFC3339), clk.Now().Format(time.RFC3339))
	}
}
