package controlplane_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/etcdtest"
	"github.com/tetherhq/tether/internal/store/etcdstore"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue46EACredentialRevokedOnOneReplicaEndsItsSilentStreamsOnOneThatRescans:
// the rogue holding a worker's leaked credential chooses its replica: it
// keeps the worker's session and a signals stream open on replica B,
// sending nothing, while B's revocation feed has fallen behind etcd (its
// watch ended: a compaction, its member cut off from the quorum, a full
// buffer) and rescans. The security team revokes the credential by value
// on replica A. B refuses the credential's next call (it reads the
// token's record while its feed rescans, rogue44i), but its streams are
// ended only as B's feed publishes the revocation, and B's rescan
// published nothing: both stayed open on B for as long as the node ran,
// after B's feed had published a later revocation (a canary's, whose
// streams on B ended). The rescan now publishes what it finds past what
// the feed had published: both end unauthenticated.
func TestRogue46EACredentialRevokedOnOneReplicaEndsItsSilentStreamsOnOneThatRescans(t *testing.T) {
	cluster := etcdtest.Start(t)
	prefix := etcdtest.Prefix(t)
	stA := etcdtest.OpenStore(t, cluster, func(o *etcdstore.EtcdOptions) { o.Prefix = prefix })
	a := testserver.Start(t, testserver.WithEtcdStore(stA, "replica-a"))
	stB := etcdtest.OpenStore(t, cluster, func(o *etcdstore.EtcdOptions) { o.Prefix = prefix })
	lagB := &laggingStore{Store: stB}
	b := testserver.Start(t, testserver.WithEtcdStore(stB, "replica-b"), func(cfg *controlplane.Config) { cfg.Store = lagB })

	// A guard against a stream that stays open hanging the test; nothing
	// waits for it to pass.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	adminA := a.AdminClients()
	root := register(t, adminA, "planner")
	parent := a.Clients(root.Credential)
	worker := spawn(t, parent, root.Node.NodeId, "worker")
	canary := spawn(t, parent, root.Node.NodeId, "canary")
	rogueOnB := openSilentStreams(t, ctx, b.Clients(worker.Credential), worker.Node.NodeId)
	witnessOnB := openSilentStreams(t, ctx, b.Clients(canary.Credential), canary.Node.NodeId)

	// B's feed hears nothing of the store from here on; its reads and
	// writes go on.
	release := sync.OnceFunc(lagB.hold("grantstore.(*Service).followFeed"))
	defer release()
	if n := lagB.lag("grantstore.(*Service).followFeed"); n != 1 {
		t.Fatalf("lagged %d store watches of B's revocation feed, want its one", n)
	}
	testserver.WaitFor(t, 30*time.Second, "B's feed to ask for a new watch", func() bool { return lagB.holding("grantstore.(*Service).followFeed") >= 1 })
	if _, err := adminA.Auth.RevokeToken(ctx, connect.NewRequest(&tetherv1.RevokeTokenRequest{Token: worker.Credential, Reason: "leaked in a build log"})); err != nil {
		t.Fatalf("revoking the worker's credential by value on A: %v", err)
	}
	wantLimit(t, "a call with the revoked credential on B while its feed rescans", whoAmI(b.Clients(worker.Credential)), connect.CodeUnauthenticated, "revoked")
	release()

	// B's feed rescans, then follows its new watch, which publishes the
	// canary's revocation: once the canary's streams on B have ended, B's
	// feed is past its rescan.
	if _, err := adminA.Auth.RevokeToken(ctx, connect.NewRequest(&tetherv1.RevokeTokenRequest{Token: canary.Credential, Reason: "a witness"})); err != nil {
		t.Fatal(err)
	}
	if n, sig, ses := witnessOnB.ends(); n != 2 || ctx.Err() != nil {
		t.Fatalf("the canary's streams on B after its revocation on A: signals %v, session %v; want both ended unauthenticated", sig, ses)
	}
	n, sig, ses := rogueOnB.ends()
	t.Logf("the revoked credential's silent streams on B, after its rescan: %d of 2 ended unauthenticated (signals %v, session %v; the guard: %v)", n, sig, ses, ctx.Err())
	if n != 2 || ctx.Err() != nil {
		t.Fatalf("%d of the 2 silent streams on B of a credential revoked on A while B's feed rescanned ended, want 2: B's rescan published nothing", n)
	}
}

// TestRogue46EACredentialRefreshedOnOneReplicaDiesWithItsRevocationOnAnother:
// the rogue holding a worker's leaked credential has replica B refresh
// it (its session there, a third of the credential's life left) and holds
// the fresh one's streams open on B; the security team revokes the leaked
// credential by value on A. The fresh credential was another, which the
// revocation did not reach: B and A served its calls, and its streams on
// B stayed open. It is now of the leaked credential's line (its id): B
// refuses its calls once its feed has the revocation, and ends its
// streams as its feed publishes it; A refuses it at once.
func TestRogue46EACredentialRefreshedOnOneReplicaDiesWithItsRevocationOnAnother(t *testing.T) {
	clk := clock.NewManual(epoch) // both replicas' clock
	cluster := etcdtest.Start(t)
	prefix := etcdtest.Prefix(t)
	stA := etcdtest.OpenStore(t, cluster, func(o *etcdstore.EtcdOptions) { o.Prefix = prefix })
	a := testserver.Start(t, testserver.WithEtcdStore(stA, "replica-a"), testserver.WithClock(clk))
	stB := etcdtest.OpenStore(t, cluster, func(o *etcdstore.EtcdOptions) { o.Prefix = prefix })
	b := testserver.Start(t, testserver.WithEtcdStore(stB, "replica-b"), testserver.WithClock(clk))

	// A guard against a stream that stays open hanging the test; nothing
	// waits for it to pass.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	adminA := a.AdminClients()
	root := register(t, adminA, "planner")
	worker := spawn(t, a.Clients(root.Credential), root.Node.NodeId, "worker")
	node := worker.Node.NodeId
	leaked, err := openSessionIn(t, ctx, b.Clients(worker.Credential), node)
	if err != nil {
		t.Fatalf("the session's first message on B: %v; want opened", err)
	}
	clk.Advance(11 * time.Minute) // of 15: 4 minutes left
	fresh, err := leaked.refreshed()
	if err != nil || fresh == "" {
		t.Fatalf("a heartbeat on B with a third of the credential's life left: %q, %v; want a fresh credential", fresh, err)
	}
	held := openSilentStreams(t, ctx, b.Clients(fresh), node)

	if _, err := adminA.Auth.RevokeToken(ctx, connect.NewRequest(&tetherv1.RevokeTokenRequest{Token: worker.Credential, Reason: "leaked in a build log"})); err != nil {
		t.Fatalf("revoking the leaked credential by value on A: %v", err)
	}
	servedA := whoAmI(a.Clients(fresh)) == nil
	// B ends the fresh credential's streams as its feed publishes the
	// revocation: after that, its calls on B are refused from its set.
	n, sig, ses := held.ends()
	servedB := whoAmI(b.Clients(fresh)) == nil
	t.Logf("after the leaked credential's revocation on A, the credential B refreshed from it before: served on A %v, on B %v; %d of its 2 streams on B ended unauthenticated (signals %v, session %v; the guard: %v)", servedA, servedB, n, sig, ses, ctx.Err())
	if servedA || servedB || n != 2 || ctx.Err() != nil {
		t.Fatalf("a credential refreshed from the leaked one before its revocation: served on A %v, on B %v, %d of its 2 streams on B ended; want refused on both, both ended", servedA, servedB, n)
	}
}
