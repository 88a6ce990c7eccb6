package controlplane_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/etcdtest"
	"github.com/tetherhq/tether/internal/store/etcdstore"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue45BAnAgentCredentialRevokedOnOneReplicaEndsItsStreamsOnAnother:
// the rogue holding a worker's leaked credential keeps the worker's
// session and a signals stream open on replica B; the security team
// revokes the credential by value on replica A. B learns of it from its
// revocation feed, and ends both streams unauthenticated as its feed
// publishes the revocation, though neither sends anything: before, both
// stayed open on B for as long as the node ran.
func TestRogue45BAnAgentCredentialRevokedOnOneReplicaEndsItsStreamsOnAnother(t *testing.T) {
	cluster := etcdtest.Start(t)
	prefix := etcdtest.Prefix(t)
	stA := etcdtest.OpenStore(t, cluster, func(o *etcdstore.EtcdOptions) { o.Prefix = prefix })
	a := testserver.Start(t, testserver.WithEtcdStore(stA, "replica-a"))
	stB := etcdtest.OpenStore(t, cluster, func(o *etcdstore.EtcdOptions) { o.Prefix = prefix })
	b := testserver.Start(t, testserver.WithEtcdStore(stB, "replica-b"))

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a guard against a hang, not a timing
	defer cancel()
	adminA := a.AdminClients()
	root := register(t, adminA, "planner")
	worker := spawn(t, a.Clients(root.Credential), root.Node.NodeId, "worker")
	node := worker.Node.NodeId
	rogueOnB := b.Clients(worker.Credential)

	opened, err := openSessionIn(t, ctx, rogueOnB, node)
	if err != nil {
		t.Fatalf("the session's first message on B: %v; want opened", err)
	}
	session := opened.stream
	signals, err := rogueOnB.Agent.WatchSignals(ctx, connect.NewRequest(&tetherv1.WatchSignalsRequest{NodeId: node}))
	if err != nil {
		t.Fatal(err)
	}
	defer signals.Close()
	if !signals.Receive() || signals.Msg().GetOpened() == nil {
		t.Fatalf("the signals stream's first message on B: %v, %v; want opened", signals.Msg(), signals.Err())
	}

	if _, err := adminA.Auth.RevokeToken(ctx, connect.NewRequest(&tetherv1.RevokeTokenRequest{Token: worker.Credential, Reason: "leaked in a build log"})); err != nil {
		t.Fatalf("revoking the worker's credential by value on A: %v", err)
	}

	for signals.Receive() {
	}
	var sessionEnd error
	for sessionEnd == nil {
		_, sessionEnd = session.Receive()
	}
	t.Logf("on B after the revocation on A: the signals stream ended with %v, the session with %v (the guard: %v)", signals.Err(), sessionEnd, ctx.Err())
	if connect.CodeOf(signals.Err()) != connect.CodeUnauthenticated || connect.CodeOf(sessionEnd) != connect.CodeUnauthenticated || ctx.Err() != nil {
		t.Fatalf("the streams the revoked credential opened on B: signals %v, session %v; want both ended unauthenticated", signals.Err(), sessionEnd)
	}
	if _, err := rogueOnB.Auth.WhoAmI(ctx, connect.NewRequest(&tetherv1.WhoAmIRequest{})); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("a call with the revoked credential on B: %v, want unauthenticated", err)
	}
}
