package controlplane_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/etcdtest"
	"github.com/tetherhq/tether/internal/store/etcdstore"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The forty-fourth hostile pass on the replicas: a rogue that can choose
// which replica it talks to.

// TestRogue44IRevokedToolServerTokenIsRefusedByAReplicaWhoseFeedLags: a
// bearer token (an operator's, a tool server's) revoked with `tether
// token revoke` is refused on the next call by the replica that took the
// revocation, which adds the tombstone to its own set before answering;
// another replica learned of it only from its revocation feed's store
// watch, and until then served the revoked token: a rogue tool server
// whose token was revoked on one replica went on working through another
// whose feed was behind (here B, its feed's watch held down across the
// revocation, as one that fell behind and is rescanning). The revocation
// is durable in the token's record, which every replica reads with a
// linearizable read: a replica now reads it for such a token its set does
// not hold, and refuses the token as soon as the revocation was
// acknowledged, wherever it was taken.
func TestRogue44IRevokedToolServerTokenIsRefusedByAReplicaWhoseFeedLags(t *testing.T) {
	cluster := etcdtest.Start(t)
	prefix := etcdtest.Prefix(t)
	stA := etcdtest.OpenStore(t, cluster, func(o *etcdstore.EtcdOptions) { o.Prefix = prefix })
	a := testserver.Start(t, testserver.WithEtcdStore(stA, "replica-a"))
	stB := etcdtest.OpenStore(t, cluster, func(o *etcdstore.EtcdOptions) { o.Prefix = prefix })
	lagB := &laggingStore{Store: stB}
	b := testserver.Start(t, testserver.WithEtcdStore(stB, "replica-b"), func(cfg *controlplane.Config) { cfg.Store = lagB })

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a guard against a hang, not a timing
	defer cancel()
	adminA := a.AdminClients()
	gate, err := adminA.Auth.CreateToken(ctx, connect.NewRequest(&tetherv1.CreateTokenRequest{ToolServer: "rogue-gate", Ttl: durationpb.New(controlplane.MaxOperatorTokenTTL)}))
	if err != nil {
		t.Fatal(err)
	}
	// A launcher's operator token, leaked: it registers root agents.
	launcher, err := adminA.Auth.CreateToken(ctx, connect.NewRequest(&tetherv1.CreateTokenRequest{Subject: "launcher", Role: tetherv1.Role_ROLE_OPERATOR, Ttl: durationpb.New(controlplane.MaxOperatorTokenTTL)}))
	if err != nil {
		t.Fatal(err)
	}
	gateOnB, launcherOnB := b.Clients(gate.Msg.Token), b.Clients(launcher.Msg.Token)
	if err := whoAmI(gateOnB); err != nil {
		t.Fatalf("the tool server's first call through B: %v", err)
	}
	register(t, launcherOnB, "before")

	// B's feed hears nothing of the store from here on; its reads and
	// writes go on.
	release := sync.OnceFunc(lagB.hold("grantstore.(*Service).followFeed"))
	defer release()
	if n := lagB.lag("grantstore.(*Service).followFeed"); n != 1 {
		t.Fatalf("lagged %d store watches of B's revocation feed, want its one", n)
	}
	for _, id := range []string{gate.Msg.TokenId, launcher.Msg.TokenId} {
		if _, err := adminA.Auth.RevokeToken(ctx, connect.NewRequest(&tetherv1.RevokeTokenRequest{TokenId: id, Reason: "gone rogue"})); err != nil {
			t.Fatal(err)
		}
	}
	wantLimit(t, "the revoked tool server's call through A", whoAmI(a.Clients(gate.Msg.Token)), connect.CodeUnauthenticated, "revoked")

	const calls = 5
	served := 0
	for i := range calls {
		err := whoAmI(gateOnB)
		if err == nil {
			served++
		} else if connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Errorf("the revoked tool server's call %d through B: %v, want unauthenticated", i, err)
		}
	}
	registered := 0
	for i := range calls {
		_, err := launcherOnB.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: fmt.Sprintf("after-%d", i)}))
		if err == nil {
			registered++
		} else if connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Errorf("the revoked launcher's registration %d through B: %v, want unauthenticated", i, err)
		}
	}
	if served > 0 || registered > 0 {
		t.Fatalf("B served %d of %d calls of a tool-server token and registered %d of %d root agents for an operator token, both revoked and acknowledged by A, want 0 and 0: its feed was behind the store", served, calls, registered, calls)
	}

	// Once B's feed follows again, the tokens stay refused.
	release()
	testserver.WaitFor(t, 30*time.Second, "B's feed to follow again", func() bool { return lagB.opened("grantstore.(*Service).followFeed") >= 2 })
	wantLimit(t, "the revoked tool server's call through B after its feed caught up", whoAmI(gateOnB), connect.CodeUnauthenticated, "revoked")
}
