package controlplane_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue33BARogueSharingTheAddressCannotStarveAFreshlySpawnedChildsFirstCall:
// a rogue behind the same address as an honest agent (a NAT, a shared
// host) sends tokens with forged signatures until the address's budget
// for requests without a valid credential is spent, and keeps it spent.
// The honest agent spawns a child over its own connection, and the
// child, a new process, calls with the credential the server just minted
// for it on a connection of its own: that first call had to be verified,
// paid from the address's budget, and was refused resource_exhausted for
// as long as the rogue kept sending — the rogue kept every child spawned
// behind its address from starting, and so an operator's new roots
// (RegisterRoot) and a session's refreshed credential taken to a new
// connection. A credential the server minted is now remembered as
// verified as it is minted: its first call is not the address's to pay.
func TestRogue33BARogueSharingTheAddressCannotStarveAFreshlySpawnedChildsFirstCall(t *testing.T) {
	srv := testserver.Start(t, testserver.WithClock(clock.NewManual(epoch)), func(cfg *controlplane.Config) {
		cfg.AnonymousRateLimit = 1 // bursts of 2
	})
	ctx := context.Background()
	honest := register(t, srv.AdminClients(), "honest")
	id := honest.Node.NodeId
	// The honest agent's own connection, bound by its first call.
	parent := testserver.NewClients(testserver.H2CClient(), srv.URL, honest.Credential)
	if _, err := parent.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: id})); err != nil {
		t.Fatal(err)
	}

	// The rogue, on its own connection from the same address, spends the
	// address's budget.
	rogueHC := testserver.H2CClient()
	spent := false
	for k := range 16 {
		_, err := testserver.NewClients(rogueHC, srv.URL, forged(honest.Credential, k)).Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: id}))
		if connect.CodeOf(err) == connect.CodeResourceExhausted {
			spent = true
			break
		}
		if connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Fatalf("forged token %d: %v, want unauthenticated or resource_exhausted", k, err)
		}
	}
	if !spent {
		t.Fatal("16 forged tokens never spent the address's budget")
	}

	// The honest agent spawns children (one, then a batch) on its
	// connection; each child calls on a new connection of its own.
	child, err := parent.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: id, Name: "child"}))
	if err != nil {
		t.Fatal(err)
	}
	batch, err := parent.Agent.SpawnBatch(ctx, connect.NewRequest(&tetherv1.SpawnBatchRequest{ParentNodeId: id, Children: []*tetherv1.SpawnBatchChild{{Name: "b1"}, {Name: "b2"}}}))
	if err != nil {
		t.Fatal(err)
	}
	root, err := srv.AdminClients().Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "another"}))
	if err != nil {
		t.Fatal(err)
	}
	fresh := []*tetherv1.SpawnResponse{child.Msg, batch.Msg.Spawned[0], batch.Msg.Spawned[1], {Node: root.Msg.Node, Credential: root.Msg.Credential}}
	for _, c := range fresh {
		_, err := testserver.NewClients(testserver.H2CClient(), srv.URL, c.Credential).Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: c.Node.NodeId}))
		if err != nil {
			t.Errorf("%s's first call with the credential just minted for it, on a new connection, with the address's budget spent by a rogue: %v (%s), want it answered", c.Node.Name, err, connect.CodeOf(err))
		}
	}

	// The rogue's forged tokens still pay the address's budget, spent.
	_, err = testserver.NewClients(rogueHC, srv.URL, forged(child.Msg.Credential, 20)).Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: id}))
	if connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Errorf("a forged token on the rogue's connection: %v, want resource_exhausted for the address's budget", err)
	}
}

// TestRogue33BARogueAtTheConnectionCapCannotCloseAnotherAddresssConnectionBeforeItsFirstCall:
// a rogue with no credential, from an address of its own, opens
// connections up to the cap and on past it. At the cap each new
// connection closed the oldest one that had not yet carried an admitted
// call, whoever's it was: an honest agent's new connection (an agent
// reconnecting, a Join, each call of the Python SDK's, which opens a
// connection per call) was closed before its first call was admitted, as
// often as the rogue liked. A new connection now pushes out the oldest
// unauthenticated connection of its own source address when it has one:
// the rogue closes its own.
func TestRogue33BARogueAtTheConnectionCapCannotCloseAnotherAddresssConnectionBeforeItsFirstCall(t *testing.T) {
	const max = 8
	srv := testserver.Start(t, func(cfg *controlplane.Config) {
		// An hour: what frees the places here is the cap, not the window.
		cfg.Conn = controlplane.ConnLimits{MaxConnections: max, HealthReserve: 2, PreAuthTimeout: time.Hour}
	})
	addr := hostOf(t, srv.URL)
	// The honest agent's new connection (from 127.0.0.1), opened first:
	// HTTP/2 is set up, its first call not yet sent.
	raw := dial(t, addr)
	cc, err := (&http2.Transport{AllowHTTP: true}).NewClientConn(raw)
	if err != nil {
		t.Fatal(err)
	}
	testserver.WaitFor(t, closeWait, "the server to accept the honest connection", func() bool { return srv.OpenConnections() == 1 })
	// The rogue, from another address (127.0.0.2), fills the cap and opens
	// as many again.
	rogueDial := func() net.Conn {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := io.WriteString(c, h2Preface); err != nil {
			t.Fatal(err)
		}
		return c
	}
	hoard := make([]net.Conn, 2*max)
	for i := range max - 1 {
		hoard[i] = rogueDial()
	}
	testserver.WaitFor(t, closeWait, "the server to accept the rogue's connections", func() bool { return srv.OpenConnections() == max })
	for i := max - 1; i < len(hoard); i++ {
		hoard[i] = rogueDial()
		waitClosed(t, fmt.Sprintf("the rogue's connection #%d, its oldest that never authenticated, once #%d came", i-(max-1), i), hoard[i-(max-1)])
	}
	// The honest connection carries its first call.
	honest := testserver.NewClients(&http.Client{Transport: cc}, srv.URL, srv.Admin)
	if _, err := honest.Auth.WhoAmI(context.Background(), connect.NewRequest(&tetherv1.WhoAmIRequest{})); err != nil {
		t.Fatalf("the first call on a connection opened before the rogue's, from another address: %v", err)
	}
}
