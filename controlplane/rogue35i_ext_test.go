package controlplane_test

import (
	"context"
	"testing"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue35IOneLevelListingKeepsAnAgentInItsSubtree: ListNodes with
// one_level (the console's tree pages) lists a page of one node's children
// with their counts; an agent lists only its own subtree's levels (another
// node's answered as not found, the roots as its own children), and a
// page token that is not a node id is refused before anything is read.
func TestRogue35IOneLevelListingKeepsAnAgentInItsSubtree(t *testing.T) {
	srv := testserver.Start(t)
	ctx := context.Background()
	admin := srv.AdminClients()
	root, err := admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "planner"}))
	if err != nil {
		t.Fatal(err)
	}
	spawn := func(cred, parent, name string) *tetherv1.SpawnResponse {
		resp, err := srv.Clients(cred).Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: parent, Name: name}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg
	}
	rogue := spawn(root.Msg.Credential, root.Msg.Node.NodeId, "rogue")
	other := spawn(root.Msg.Credential, root.Msg.Node.NodeId, "other")
	spawn(other.Credential, other.Node.NodeId, "other-child")
	for _, name := range []string{"a", "b", "c"} {
		spawn(rogue.Credential, rogue.Node.NodeId, name)
	}

	page, err := admin.Agent.ListNodes(ctx, connect.NewRequest(&tetherv1.ListNodesRequest{RootNodeId: root.Msg.Node.NodeId, OneLevel: true, PageSize: 1}))
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Msg.Nodes) != 1 || page.Msg.NextPageToken == "" || page.Msg.ChildCounts[root.Msg.Node.NodeId] != 2 {
		t.Fatalf("a page of 1 of the planner's children: %d nodes, next %q, counts %v", len(page.Msg.Nodes), page.Msg.NextPageToken, page.Msg.ChildCounts)
	}
	roots, err := admin.Agent.ListNodes(ctx, connect.NewRequest(&tetherv1.ListNodesRequest{OneLevel: true}))
	if err != nil || len(roots.Msg.Nodes) != 1 || roots.Msg.Nodes[0].NodeId != root.Msg.Node.NodeId {
		t.Fatalf("the roots: %v, %v", roots, err)
	}

	as := srv.Clients(rogue.Credential).Agent
	own, err := as.ListNodes(ctx, connect.NewRequest(&tetherv1.ListNodesRequest{OneLevel: true}))
	if err != nil || len(own.Msg.Nodes) != 3 || own.Msg.ChildCounts[rogue.Node.NodeId] != 3 {
		t.Fatalf("the rogue's own level: %v, %v", own, err)
	}
	for _, target := range []string{root.Msg.Node.NodeId, other.Node.NodeId} {
		_, err := as.ListNodes(ctx, connect.NewRequest(&tetherv1.ListNodesRequest{RootNodeId: target, OneLevel: true}))
		if connect.CodeOf(err) != connect.CodeNotFound {
			t.Fatalf("the rogue lists the level of %s outside its subtree: %v", target, err)
		}
	}
	_, err = admin.Agent.ListNodes(ctx, connect.NewRequest(&tetherv1.ListNodesRequest{RootNodeId: root.Msg.Node.NodeId, OneLevel: true, PageToken: "x/../../grants"}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("a page token that is no node id: %v, want invalid_argument", err)
	}
}
