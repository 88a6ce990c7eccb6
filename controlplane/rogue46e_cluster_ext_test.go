package controlplane_test

import (
	"context"
	"testing"
	"time"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/etcdtest"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/etcdstore"
)

// replicaPair starts replicas A and B of one control plane on one etcd
// cluster (one prefix), each with opts. wrapB, if not nil, wraps the store
// B's components use (its etcd store, which B is started with).
func replicaPair(t *testing.T, wrapB func(store.Store) store.Store, opts ...testserver.Option) (a, b *testserver.Server) {
	t.Helper()
	cluster := etcdtest.Start(t)
	prefix := etcdtest.Prefix(t)
	stA := etcdtest.OpenStore(t, cluster, func(o *etcdstore.EtcdOptions) { o.Prefix = prefix })
	a = testserver.Start(t, append([]testserver.Option{testserver.WithEtcdStore(stA, "replica-a")}, opts...)...)
	stB := etcdtest.OpenStore(t, cluster, func(o *etcdstore.EtcdOptions) { o.Prefix = prefix })
	optsB := append([]testserver.Option{testserver.WithEtcdStore(stB, "replica-b")}, opts...)
	if wrapB != nil {
		wrapped := wrapB(stB)
		optsB = append(optsB, func(cfg *controlplane.Config) { cfg.Store = wrapped })
	}
	b = testserver.Start(t, optsB...)
	return a, b
}

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
	var lagB *laggingStore
	a, b := replicaPair(t, func(stB store.Store) store.Store { lagB = &laggingStore{Store: stB}; return lagB })

	revokeWhileTheFeedRescans(t, a, b, lagB)
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
	a, b := replicaPair(t, nil, testserver.WithClock(clk))

	// A guard against a stream that stays open hanging the test; nothing
	// waits for it to pass.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, _, fresh, held := refreshThenRevoke(t, ctx, clk, a, b)
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
