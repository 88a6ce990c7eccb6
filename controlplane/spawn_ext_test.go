package controlplane_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/auth"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// A spawning agent calls with the same credential again and again, so the
// server answers its authentication from memory (the verified-token cache,
// the remembered active node). The rogue keeps spawning with it after its
// node is terminated and after the credential expired, hoping the memory
// outlives the facts.

// TestASpawningAgentsCachedCredentialDiesWithItsNode: a parent that has
// spawned many times (its credential verified once and cached since) is
// refused on its very next spawn once its termination is visible, and so
// are its children's credentials, minted by the server's signers.
func TestASpawningAgentsCachedCredentialDiesWithItsNode(t *testing.T) {
	clk := clock.NewManual(time.Now().UTC().Truncate(time.Second))
	srv := testserver.Start(t, testserver.WithClock(clk))
	ctx := context.Background()
	admin := srv.AdminClients()
	root := register(t, admin, "rogue-parent")
	parent := srv.Clients(root.Credential)

	// Spawns one by one and in a batch: every child gets its own working
	// credential, for its own node, expiring with the server's clock.
	var children []*tetherv1.SpawnResponse
	for range 5 {
		children = append(children, spawn(t, parent, root.Node.NodeId, "child"))
	}
	batch, err := parent.Agent.SpawnBatch(ctx, connect.NewRequest(&tetherv1.SpawnBatchRequest{
		ParentNodeId: root.Node.NodeId,
		Children:     []*tetherv1.SpawnBatchChild{{Name: "a"}, {Name: "b"}, {Name: "c"}},
	}))
	if err != nil {
		t.Fatal(err)
	}
	children = append(children, batch.Msg.Spawned...)
	seen := map[string]bool{}
	for _, c := range children {
		if seen[c.Credential] {
			t.Fatalf("two children share a credential")
		}
		seen[c.Credential] = true
		p, err := srv.Issuer().Parse(c.Credential, clk.Now())
		if err != nil || !p.IsAgent() || p.NodeID() != c.Node.NodeId {
			t.Fatalf("the credential of child %s: %+v, %v", c.Node.NodeId, p, err)
		}
		if want := clk.Now().Add(15 * time.Minute); !c.CredentialExpiresAt.AsTime().Equal(want) {
			t.Fatalf("child %s's credential expires at %s, want %s (the server's clock plus the agent credential ttl)", c.Node.NodeId, c.CredentialExpiresAt.AsTime(), want)
		}
		// The child acts with it: its own node, and a grandchild.
		if got := getNode(t, srv.Clients(c.Credential), c.Node.NodeId); got.NodeId != c.Node.NodeId {
			t.Fatalf("child %s read %s", c.Node.NodeId, got.NodeId)
		}
	}
	grandchild := spawn(t, srv.Clients(children[0].Credential), children[0].Node.NodeId, "grandchild")

	term := terminate(t, admin, root.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, time.Second, time.Second, 0)
	clk.Advance(2 * time.Second) // past the drain window and the cancel-ack timeout
	testserver.WaitFor(t, 20*time.Second, "the parent to be terminated", func() bool {
		return getNode(t, admin, root.Node.NodeId).State == tetherv1.NodeState_NODE_STATE_TERMINATED
	})
	_, err = parent.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: root.Node.NodeId, Name: "after"}))
	wantLimit(t, "the terminated parent's next spawn, its credential cached", err, connect.CodeUnauthenticated, root.Node.NodeId, "terminated")
	_, err = parent.Agent.SpawnBatch(ctx, connect.NewRequest(&tetherv1.SpawnBatchRequest{ParentNodeId: root.Node.NodeId, Children: []*tetherv1.SpawnBatchChild{{Name: "after"}}}))
	wantLimit(t, "the terminated parent's next batch", err, connect.CodeUnauthenticated, "terminated")
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	for _, c := range append(children, grandchild) {
		_, err := srv.Clients(c.Credential).Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: c.Node.NodeId, Name: "after"}))
		wantLimit(t, "a terminated child's spawn", err, connect.CodeUnauthenticated, c.Node.NodeId)
	}
	// No spawn got through.
	list, err := admin.Agent.ListNodes(ctx, connect.NewRequest(&tetherv1.ListNodesRequest{RootNodeId: root.Node.NodeId}))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range list.Msg.Nodes {
		if n.Name == "after" {
			t.Fatalf("node %s was spawned after its parent's termination", n.NodeId)
		}
	}
}

// TestASpawningAgentsCachedCredentialExpiresOnTime: the cached credential
// stops working at its expiry (with the verifier's leeway) by the server's
// clock, not at the cache's convenience; the children it spawned before
// keep their own, later, expiry.
func TestASpawningAgentsCachedCredentialExpiresOnTime(t *testing.T) {
	clk := clock.NewManual(time.Now().UTC().Truncate(time.Second))
	srv := testserver.Start(t, testserver.WithClock(clk))
	ctx := context.Background()
	admin := srv.AdminClients()
	root := register(t, admin, "expiring-parent")
	parent := srv.Clients(root.Credential)
	spawn(t, parent, root.Node.NodeId, "first") // verified, and now cached

	clk.Advance(10 * time.Minute)
	child := spawn(t, parent, root.Node.NodeId, "second") // from the cache
	if !child.CredentialExpiresAt.AsTime().After(root.CredentialExpiresAt.AsTime()) {
		t.Fatalf("a child spawned later got a credential expiring at %s, not after its parent's %s", child.CredentialExpiresAt.AsTime(), root.CredentialExpiresAt.AsTime())
	}

	clk.Set(root.CredentialExpiresAt.AsTime().Add(auth.Leeway - time.Second))
	spawn(t, parent, root.Node.NodeId, "within-the-leeway")
	clk.Set(root.CredentialExpiresAt.AsTime().Add(auth.Leeway))
	_, err := parent.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: root.Node.NodeId, Name: "expired"}))
	wantLimit(t, "a spawn with the cached credential past its expiry", err, connect.CodeUnauthenticated, "expired")
	if err != nil && strings.Contains(err.Error(), root.Credential) {
		t.Fatal("the refusal shows the credential")
	}
	// The child's credential, minted ten minutes later, still works.
	spawn(t, srv.Clients(child.Credential), child.Node.NodeId, "grandchild")
}
