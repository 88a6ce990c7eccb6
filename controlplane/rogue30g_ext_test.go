package controlplane_test

import (
	"context"
	"testing"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/etcdtest"
	"github.com/tetherhq/tether/internal/store/etcdstore"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// On etcd every call reads its agent's node, with the call's context: a
// rogue that resets its calls as they are read had each refused
// unavailable before its rate charge, so rapid resets cost its lineage
// nothing there (each a cancelled node read of the server's). A call
// whose node read fails is now charged to the lineage its token's node was
// found in before: the rogue runs out of its budget, its sibling tree
// does not.
func TestRogue30GRapidResetsOnEtcdAreChargedToTheLineage(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the etcd replica tests; make test and CI run them.")
	}
	cluster := etcdtest.Start(t)
	prefix := etcdtest.Prefix(t)
	st := etcdtest.OpenStore(t, cluster, func(o *etcdstore.EtcdOptions) { o.Prefix = prefix })
	srv := testserver.Start(t, testserver.WithEtcdStore(st, "replica-r30g"), testserver.WithClock(clock.NewManual(epoch)),
		func(cfg *controlplane.Config) { cfg.RateLimit, cfg.RateBurst = 1, 1000 }) // no budget refills
	admin := srv.AdminClients()
	root := register(t, admin, "r30g-rogue")
	rogueC := srv.Clients(root.Credential)
	other := register(t, admin, "r30g-other")
	otherC := srv.Clients(other.Credential)
	if err := whoAmI(rogueC); err != nil {
		t.Fatal(err)
	}
	addr := hostOf(t, srv.URL)
	// A stream reset before its handler starts is dropped unjudged, so a
	// round may reach fewer handlers than the burst: the flood is
	// repeated, and a lineage never refused after ten rounds fails.
	var err error
	for round := 1; round <= 10; round++ {
		r := newH2Rogue(t, addr)
		sent := 0
		for i := 0; i < 20000 && !r.isClosed(); i++ {
			id, err := r.headers(root.Credential, false)
			if err != nil || r.fr.WriteRSTStream(id, http2.ErrCodeCancel) != nil {
				break
			}
			sent++
		}
		r.c.Close()
		<-r.closed
		_, err = rogueC.Agent.GetNode(context.Background(), connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: root.Node.NodeId}))
		t.Logf("round %d: %d reset calls sent; the rogue's own call: %v", round, sent, err)
		if connect.CodeOf(err) == connect.CodeResourceExhausted {
			break
		}
	}
	if connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Errorf("the rogue's own call after ten rounds of twenty thousand reset calls on etcd: %v, want resource_exhausted (each reached call charged to its lineage)", err)
	}
	if err := whoAmI(otherC); err != nil {
		t.Errorf("another tree's call after the floods: %v", err)
	}
}
