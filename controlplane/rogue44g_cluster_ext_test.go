package controlplane_test

import (
	"context"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// A rogue lineage at its share of connections to the leader that sends a
// job-lease call through a follower is refused resource_exhausted on the
// leader, alone: the follower's connection, which carries every caller's
// forwarded calls, is kept (rogue43m test), and so is the rogue's own
// connection to the follower. The refusal used to say otherwise: "this
// connection is being closed: send further calls over one you hold", the
// text of a direct refusal, relayed through the follower — neither
// connection was closed, and the connections to close were the ones held
// to the leader, not to the replica the rogue called. A forwarded
// refusal now says it was refused alone and which connections count; the
// direct one still says its connection is being closed, which it is.
func TestRogue44GAForwardedRefusalPastTheShareSaysItsConnectionIsKept(t *testing.T) {
	const share = 2
	lead, follower := lineageShareCluster(t, share)
	ctx := context.Background()
	admin := lead.AdminClients()
	rogue := register(t, admin, "rogue")
	list := connect.NewRequest(&tetherv1.ListLeasesRequest{HolderIdentity: rogue.Node.NodeId})
	throughFollower := follower.Clients(rogue.Credential)
	testserver.WaitFor(t, replicaWait, "the follower to forward to the leader", func() bool {
		_, err := throughFollower.Lease.ListLeases(ctx, list)
		return err == nil
	})
	// The follower's connection to the leader is bound to the rogue's
	// lineage by that call: one more of its own makes its share.
	for range share - 1 {
		if _, err := testserver.NewClients(testserver.H2CClient(), lead.URL, rogue.Credential).Lease.ListLeases(ctx, list); err != nil {
			t.Fatal(err)
		}
	}
	// Directly, on a connection of its own: refused, that connection closed.
	_, direct := testserver.NewClients(testserver.H2CClient(), lead.URL, rogue.Credential).Lease.ListLeases(ctx, list)
	if connect.CodeOf(direct) != connect.CodeResourceExhausted || !strings.Contains(direct.Error(), "this connection is being closed") {
		t.Fatalf("the rogue's call to the leader on a new connection, at its share: %v, want resource_exhausted, its connection being closed", direct)
	}

	// Through the follower, the rogue's calls are admitted: the
	// follower's connection already counts for its lineage. Another
	// lineage at its share on the leader calls through the follower.
	other := register(t, admin, "rogue-2")
	otherList := connect.NewRequest(&tetherv1.ListLeasesRequest{HolderIdentity: other.Node.NodeId})
	for range share {
		if _, err := testserver.NewClients(testserver.H2CClient(), lead.URL, other.Credential).Lease.ListLeases(ctx, otherList); err != nil {
			t.Fatal(err)
		}
	}
	_, forwarded := follower.Clients(other.Credential).Lease.ListLeases(ctx, otherList)
	if connect.CodeOf(forwarded) != connect.CodeResourceExhausted {
		t.Fatalf("the rogue's call through the follower, at its share on the leader: %v, want resource_exhausted", forwarded)
	}
	if strings.Contains(forwarded.Error(), "this connection is being closed") {
		t.Errorf("the refusal of a forwarded call says its connection is being closed, though neither the follower's connection nor the caller's is: %v", forwarded)
	}
	if !strings.Contains(forwarded.Error(), "refused alone") || !strings.Contains(forwarded.Error(), "forwarded") {
		t.Errorf("the refusal of a forwarded call does not say it was forwarded and refused alone: %v", forwarded)
	}
	// And it was refused alone: the caller's connection to the follower
	// still serves its calls there (GetPolicy is served by the follower).
	if _, err := follower.Clients(other.Credential).Lease.GetPolicy(ctx, connect.NewRequest(&tetherv1.GetPolicyRequest{})); err != nil {
		t.Errorf("the rogue's next call to the follower: %v", err)
	}
}
