package controlplane_test

import (
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
)

// TestRogue30GChildrenCannotFillTheServersConnectionsWithTheirReserves: a
// node that bound no connection binds one past its lineage's share
// (ConnectionReserve), so that a member holding the share cannot keep a
// sibling off the server. A rogue took the share with its own
// connections, then spawned children and had each bind its reserve: its
// lineage held its share and a connection a child, until agents together
// held every connection they may and every other lineage was refused. The
// lineage's nodes now bind at most a quarter of its share past it: the
// rogue's children past that are refused, naming the limit, and another
// tree is served.
func TestRogue30GChildrenCannotFillTheServersConnectionsWithTheirReserves(t *testing.T) {
	const share, maxConns = 8, 24 // agents may hold 23 (one kept for operators)
	srv := testserver.Start(t, func(cfg *controlplane.Config) {
		cfg.Conn = controlplane.ConnLimits{MaxConnections: maxConns, MaxConnectionsPerLineage: share, PreAuthTimeout: time.Hour}
	})
	admin := srv.AdminClients()
	rogue := register(t, admin, "rogue")
	for i := range share {
		if err := whoAmI(newOwnConn(t, srv, rogue.Credential).Clients); err != nil {
			t.Fatalf("the rogue's connection %d: %v", i+1, err)
		}
	}
	reserves := 0
	for i := range maxConns {
		child := spawn(t, admin, rogue.Node.NodeId, fmt.Sprintf("c%d", i))
		err := whoAmI(newOwnConn(t, srv, child.Credential).Clients)
		if err != nil {
			wantLimit(t, "a child's reserve past the lineage's", err, connect.CodeResourceExhausted, "lineage "+rogue.Node.NodeId, "past its share")
			break
		}
		reserves++
	}
	if reserves != share/4 {
		t.Errorf("the rogue's children bound %d connections past its lineage's share of %d; want %d (a quarter of it)", reserves, share, share/4)
	}
	other := register(t, admin, "other")
	for i := range share {
		if err := whoAmI(newOwnConn(t, srv, other.Credential).Clients); err != nil {
			t.Fatalf("another tree's connection %d, the rogue's children holding every reserve they may: %v", i+1, err)
		}
	}
}
