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
// another replica learns of it from its revocation feed's store watch. A
// replica whose feed watch had fallen behind (ended ErrWatchLagged: a
// compaction, its etcd member cut off, a full buffer) and was rescanning
// answered from its set as it stood, and served the revoked token until
// the rescan: a rogue tool server whose token was revoked on one replica,
// or a leaked launcher token, went on working through the other (here B,
// its feed's watch lagged and held down across the revocation). While its
// feed rescans a replica now reads the token's record too, which the
// revocation marked with its tombstone: the calls are refused at once.
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
	// B's feed has seen its watch end and asks for a new one (held).
	testserver.WaitFor(t, 30*time.Second, "B's feed to ask for a new watch", func() bool { return lagB.holding("grantstore.(*Service).followFeed") >= 1 })
	for _, id := range []string{gate.Msg.TokenId, launcher.Msg.TokenId} {
		if _, err := adminA.Auth.RevokeToken(ctx, connect.NewRequest(&tetherv1.RevokeTokenRequest{TokenId: id, Reason: "gone rogue"})); err != nil {
			t.Fatal(err)
		}
	}
	wantLimit(t, "the revoked tool server's call through A", whoAmI(a.Clients(gate.Msg.Token)), connect.CodeUnauthenticated, "revoked")

	const calls = 5
	served, registered := 0, 0
	for i := range calls {
		if err := whoAmI(gateOnB); err == nil {
			served++
		} else if connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Errorf("the revoked tool server's call %d through B: %v, want unauthenticated", i, err)
		}
		if _, err := launcherOnB.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: fmt.Sprintf("after-%d", i)})); err == nil {
			registered++
		} else if connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Errorf("the revoked launcher's registration %d through B: %v, want unauthenticated", i, err)
		}
	}
	if served > 0 || registered > 0 {
		t.Fatalf("B served %d of %d calls of a tool-server token and registered %d of %d root agents for an operator token, both revoked and acknowledged by A, want 0 and 0: its feed was behind the store", served, calls, registered, calls)
	}

	// Refused while B's feed is held, and once it follows again.
	waiting := make(chan error, 1)
	go func() { waiting <- whoAmI(gateOnB) }()
	release()
	wantLimit(t, "the revoked tool server's call through B across its rescan", <-waiting, connect.CodeUnauthenticated, "revoked")
	wantLimit(t, "the revoked launcher's registration through B after its rescan", func() error {
		_, err := launcherOnB.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "after-rescan"}))
		return err
	}(), connect.CodeUnauthenticated, "revoked")
}
