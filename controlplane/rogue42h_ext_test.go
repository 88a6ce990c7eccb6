package controlplane_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The forty-second rogue pass, the server's capability tree.

// TestRogue42HDelegatingToANodeWithManyKeptGrantsCostsWhatReadingThemDoes:
// a node holds at most --grant-max-per-node (256) live grants of agents',
// and its dead ones past as many again are dropped, but a dead grant
// another derives from is kept. A rogue delegates 256 grants to its child,
// has the child delegate each on to a grandchild of its own, and revokes
// the child's (one request for them all), four times: the child's index
// names 1,024 dead grants, none dropped, and 256 live ones. Each
// delegation to the child then read every grant the index names and their
// chains, 1,282 grants, to decide the bound, refused at it or not, for one
// request: the rogue had the server read a thousand and more grants a
// request, as often as its budget allowed, where a listing reads a
// thousand. It now costs a request per thousand grants read, as the
// listing does.
func TestRogue42HDelegatingToANodeWithManyKeptGrantsCostsWhatReadingThemDoes(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the 2,300 delegations; make test and CI run them.")
	}
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) { cfg.RateLimit, cfg.RateBurst = 100, bigBurst })
	refill := func() { clk.Advance(2 * bigBurst / 100 * time.Second) } // a full bucket at 100/s
	ctx := context.Background()
	admin := srv.AdminClients()
	root := register(t, admin, "rogue")
	child := spawn(t, admin, root.Node.NodeId, "child")
	issued, err := admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: root.Node.NodeId, Scopes: []string{"tool:*"}, Ttl: durationpb.New(time.Hour)}))
	if err != nil {
		t.Fatal(err)
	}
	rogue, accomplice := srv.Clients(root.Credential), srv.Clients(child.Credential)
	const perNode = 256 // the default --grant-max-per-node
	requests := 0
	delegate := func(as *testserver.Clients, parent, holder string) string {
		t.Helper()
		if requests++; requests%100 == 0 {
			refill()
		}
		resp, err := as.Capability.Delegate(ctx, connect.NewRequest(&tetherv1.DelegateRequest{ParentGrantId: parent, HolderNodeId: holder, Scopes: []string{"tool:shell"}}))
		if err != nil {
			t.Fatalf("delegation %d: %v", requests, err)
		}
		return resp.Msg.Grant.GrantId
	}
	for round := range 4 {
		grandchild := spawn(t, admin, child.Node.NodeId, "grandchild")
		var toChild []string
		for range perNode {
			toChild = append(toChild, delegate(rogue, issued.Msg.Grant.GrantId, child.Node.NodeId))
		}
		for _, g := range toChild {
			delegate(accomplice, g, grandchild.Node.NodeId)
		}
		refill()
		res, err := rogue.Capability.Revoke(ctx, connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_HolderNodeId{HolderNodeId: child.Node.NodeId}}))
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Msg.RevokedGrantIds) != perNode {
			t.Fatalf("round %d: the rogue revoked %d of its child's grants, want %d", round, len(res.Msg.RevokedGrantIds), perNode)
		}
	}
	for range perNode {
		delegate(rogue, issued.Msg.Grant.GrantId, child.Node.NodeId)
	}
	listed, err := admin.Capability.ListGrants(ctx, connect.NewRequest(&tetherv1.ListGrantsRequest{HolderNodeId: child.Node.NodeId}))
	if err != nil {
		t.Fatal(err)
	}
	page := len(listed.Msg.Grants)
	if listed.Msg.NextPageToken != "" {
		more, err := admin.Capability.ListGrants(ctx, connect.NewRequest(&tetherv1.ListGrantsRequest{HolderNodeId: child.Node.NodeId, PageToken: listed.Msg.NextPageToken}))
		if err != nil {
			t.Fatal(err)
		}
		page += len(more.Msg.Grants)
	}
	if page != 5*perNode {
		t.Fatalf("the child holds %d grants, want %d (1,024 dead ones kept, each derived from, and 256 live)", page, 5*perNode)
	}

	// Each further delegation to the child is refused at the bound, after
	// the bound read every grant the child's index names.
	refill()
	attempts := 0
	var refusal error
	for attempts <= bigBurst {
		_, err := rogue.Capability.Delegate(ctx, connect.NewRequest(&tetherv1.DelegateRequest{ParentGrantId: issued.Msg.Grant.GrantId, HolderNodeId: child.Node.NodeId, Scopes: []string{"tool:shell"}}))
		if err == nil {
			t.Fatal("a delegation past the child's bound was accepted")
		}
		if !strings.Contains(err.Error(), "the maximum per node") {
			refusal = err
			break
		}
		attempts++
	}
	if attempts != bigBurst/2 {
		t.Fatalf("the rogue had its child's %d grants read %d times on a budget of %d requests, want %d (two requests each); refused: %v", page, attempts, bigBurst, bigBurst/2, refusal)
	}
	wantLimit(t, "the rogue past its budget", refusal, connect.CodeResourceExhausted, "rate limit", "lineage "+root.Node.NodeId)
}
