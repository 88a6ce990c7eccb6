package controlplane_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue32EARogueSharingTheAddressCannotKeepAConnectedAgentsRefreshedCredentialUnverified:
// a rogue behind the same address as an honest agent (a NAT, a shared
// host) sends tokens with forged signatures until the address's budget
// for requests without a valid credential is spent, and keeps it spent.
// The honest agent, connected and working, refreshes its credential (a
// heartbeat's, in the last third of its life): its first call with it
// had to be verified, paid from the address's budget, and was refused
// resource_exhausted for as long as the rogue kept sending. A request on
// a connection bound to a live caller now pays for a verification from
// that caller's own budget, which the rogue, on its own connection,
// cannot spend.
func TestRogue32EARogueSharingTheAddressCannotKeepAConnectedAgentsRefreshedCredentialUnverified(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) {
		cfg.AnonymousRateLimit = 1 // bursts of 2
	})
	ctx := context.Background()
	honest := register(t, srv.AdminClients(), "honest")
	id := honest.Node.NodeId
	// The honest agent's own connection, bound by its first call.
	hc := testserver.H2CClient()
	if _, err := testserver.NewClients(hc, srv.URL, honest.Credential).Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: id})); err != nil {
		t.Fatal(err)
	}
	// Its credential in the last third of its life: a heartbeat refreshes it.
	clk.Advance(11 * time.Minute)
	hb, err := testserver.NewClients(hc, srv.URL, honest.Credential).Agent.Heartbeat(ctx, connect.NewRequest(&tetherv1.HeartbeatRequest{NodeId: id}))
	if err != nil {
		t.Fatal(err)
	}
	fresh := hb.Msg.GetCredential().GetCredential()
	if fresh == "" || fresh == honest.Credential {
		t.Fatalf("the heartbeat refreshed no credential: %v", hb.Msg)
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

	// The honest agent's refreshed credential, on its connection.
	if _, err := testserver.NewClients(hc, srv.URL, fresh).Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: id})); err != nil {
		t.Errorf("the connected agent's refreshed credential, with the address's budget spent by a rogue: %v (%s), want it verified", err, connect.CodeOf(err))
	}

	// The rogue's own connection still pays the address's budget, spent.
	_, err = testserver.NewClients(rogueHC, srv.URL, forged(honest.Credential, 20)).Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: id}))
	if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "from 127.0.0.1") {
		t.Errorf("a forged token on the rogue's connection: %v, want resource_exhausted for the address's budget", err)
	}
}
