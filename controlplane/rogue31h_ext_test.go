package controlplane_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The thirty-first rogue pass, the server's capability tree: what a rogue
// agent can make the tree's revocations cost.

// TestRogue31HRevokingALargeSubtreeCostsWhatListingItDoes: a rogue revokes
// the grants held in its own 2,049-node subtree, again and again. Each
// revocation reads every node of the subtree and what each holds to find
// the grants it revokes (none, after the first: the answer is the feed's
// head), yet cost one request: the same subtree's grants listed cost three
// (a request per thousand nodes read), so revoking was the rogue's way to
// have the server read its whole subtree three times as often. It now
// costs a request per thousand nodes read, as the listing does.
func TestRogue31HRevokingALargeSubtreeCostsWhatListingItDoes(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the 2,049-node tree; make test and CI run them.")
	}
	srv, root, refill := bigRogueTree(t)
	ctx := context.Background()
	rogue := srv.Clients(root.Credential)
	refill()
	revocations := 0
	var refusal error
	for refusal == nil && revocations <= bigBurst {
		resp, err := rogue.Capability.Revoke(ctx, connect.NewRequest(&tetherv1.RevokeRequest{
			Target: &tetherv1.RevokeRequest_SubtreeNodeId{SubtreeNodeId: root.Node.NodeId}, Reason: "again",
		}))
		if err != nil {
			refusal = err
			break
		}
		if len(resp.Msg.RevokedGrantIds) != 0 {
			t.Fatalf("the rogue's subtree holds no grant, yet its revocation revoked %v", resp.Msg.RevokedGrantIds)
		}
		revocations++
	}
	if revocations != bigBurst/3 {
		t.Fatalf("the rogue revoked its 2,049-node subtree's grants %d times on a budget of %d requests, want %d (three requests each); refused: %v", revocations, bigBurst, bigBurst/3, refusal)
	}
	wantLimit(t, "the rogue past its budget", refusal, connect.CodeResourceExhausted, "rate limit", "lineage "+root.Node.NodeId)
}

// TestRogue31HRevokingANodesManyGrantsCostsWhatReadingThemDoes: a rogue
// delegates 2,000 grants to its child (the operator raised the grant bound
// per node), revokes them, and then revokes them again and again, by the
// child's subtree and by the child as their holder. Each revocation reads
// every grant the child holds, and each one's chain, whatever it then
// revokes (nothing, after the first), yet cost one request (or a request
// per thousand nodes): two thousand grants read for one request, where a
// listing reads a thousand for one. It now costs a request per thousand
// nodes and grants read past the first thousand.
func TestRogue31HRevokingANodesManyGrantsCostsWhatReadingThemDoes(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the 2,000-grant node; make test and CI run them.")
	}
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) {
		cfg.RateLimit, cfg.RateBurst, cfg.GrantMaxPerNode = 100, bigBurst, 2100
	})
	refill := func() { clk.Advance(2 * bigBurst / 100 * time.Second) }
	ctx := context.Background()
	admin := srv.AdminClients()
	root := register(t, admin, "rogue")
	child := spawn(t, admin, root.Node.NodeId, "child")
	issued, err := admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: root.Node.NodeId, Scopes: []string{"tool:*"}, Ttl: durationpb.New(time.Hour)}))
	if err != nil {
		t.Fatal(err)
	}
	rogue := srv.Clients(root.Credential)
	const grants = 2000
	for i := range grants {
		if i%(bigBurst-50) == 0 {
			refill()
		}
		if _, err := rogue.Capability.Delegate(ctx, connect.NewRequest(&tetherv1.DelegateRequest{ParentGrantId: issued.Msg.Grant.GrantId, HolderNodeId: child.Node.NodeId, Scopes: []string{"tool:shell"}})); err != nil {
			t.Fatalf("delegation %d: %v", i, err)
		}
	}
	refill()
	first, err := rogue.Capability.Revoke(ctx, connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_HolderNodeId{HolderNodeId: child.Node.NodeId}}))
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Msg.RevokedGrantIds) != grants {
		t.Fatalf("the rogue's first revocation revoked %d grants, want %d", len(first.Msg.RevokedGrantIds), grants)
	}
	for _, target := range []*tetherv1.RevokeRequest{
		{Target: &tetherv1.RevokeRequest_SubtreeNodeId{SubtreeNodeId: child.Node.NodeId}},
		{Target: &tetherv1.RevokeRequest_HolderNodeId{HolderNodeId: child.Node.NodeId}},
	} {
		refill()
		revocations := 0
		var refusal error
		for refusal == nil && revocations <= bigBurst {
			resp, err := rogue.Capability.Revoke(ctx, connect.NewRequest(target))
			if err != nil {
				refusal = err
				break
			}
			if len(resp.Msg.RevokedGrantIds) != 0 {
				t.Fatalf("%v revoked %v again", target.Target, resp.Msg.RevokedGrantIds)
			}
			revocations++
		}
		if revocations != bigBurst/3 {
			t.Fatalf("%v: the rogue had its child's %d grants read %d times on a budget of %d requests, want %d (three requests each); refused: %v", target.Target, grants, revocations, bigBurst, bigBurst/3, refusal)
		}
		wantLimit(t, "the rogue past its budget", refusal, connect.CodeResourceExhausted, "rate limit", "lineage "+root.Node.NodeId)
	}
}
