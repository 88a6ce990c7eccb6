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

// The thirty-third rogue pass, the server's capability tree: what a rogue
// agent can make its grants' listings cost.

// listBurst is the rogue's rate budget's burst here, at half of it a
// second (a burst is at least two seconds of the rate): small, so that
// the listings that spend it, each of hundreds of grants, stay few under
// -race (at a burst of 300 the test took 659 s under -race on a loaded
// machine).
const listBurst = 30

// rogueWithManyGrants starts a server whose operator raised the grant
// bound per node, registers the rogue with a root grant and a child, and
// returns them with the refill of the rogue's rate budget.
func rogueWithManyGrants(t *testing.T) (srv *testserver.Server, rogue *testserver.Clients, rootGrant, rootNode string, child *tetherv1.SpawnResponse, refill func()) {
	t.Helper()
	clk := clock.NewManual(epoch)
	srv = testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) {
		cfg.RateLimit, cfg.RateBurst, cfg.GrantMaxPerNode = listBurst/2, listBurst, 2100
	})
	refill = func() { clk.Advance(2 * time.Second) }
	admin := srv.AdminClients()
	root := register(t, admin, "rogue")
	child = spawn(t, admin, root.Node.NodeId, "child")
	issued, err := admin.Capability.IssueRoot(context.Background(), connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: root.Node.NodeId, Scopes: []string{"tool:*"}, Ttl: durationpb.New(time.Hour)}))
	if err != nil {
		t.Fatal(err)
	}
	return srv, srv.Clients(root.Credential), issued.Msg.Grant.GrantId, root.Node.NodeId, child, refill
}

// delegateOnBudget has the rogue delegate n grants from parent (or, with
// parents, one from each) to holder, refilling its budget as it goes.
func delegateOnBudget(t *testing.T, rogue *testserver.Clients, refill func(), holder string, n int, parent string, parents []string) []string {
	t.Helper()
	out := make([]string, n)
	for i := range n {
		if i%(listBurst-5) == 0 {
			refill()
		}
		from := parent
		if parents != nil {
			from = parents[i]
		}
		resp, err := rogue.Capability.Delegate(context.Background(), connect.NewRequest(&tetherv1.DelegateRequest{ParentGrantId: from, HolderNodeId: holder, Scopes: []string{"tool:shell"}}))
		if err != nil {
			t.Fatalf("delegation %d: %v", i, err)
		}
		out[i] = resp.Msg.Grant.GrantId
	}
	return out
}

// listUntilRefused has the rogue send the listing until its budget
// refuses it, and returns how many were answered.
func listUntilRefused(t *testing.T, rogue *testserver.Clients, req *tetherv1.ListGrantsRequest, wantGrants int) (int, error) {
	t.Helper()
	listings := 0
	for listings <= listBurst {
		resp, err := rogue.Capability.ListGrants(context.Background(), connect.NewRequest(req))
		if err != nil {
			return listings, err
		}
		if len(resp.Msg.Grants) != wantGrants {
			t.Fatalf("the listing answered %d grants, want %d", len(resp.Msg.Grants), wantGrants)
		}
		listings++
	}
	return listings, nil
}

// TestRogue33HListingASubtreesGrantsCostsTheGrantsItReads: a rogue
// delegates 2,000 grants to its child (the operator raised the grant bound
// per node) and lists the child's subtree's grants a page of one at a
// time, again and again. Each page reads every grant id the subtree's
// nodes hold (and sorts them) to find its one grant, yet cost a request
// per thousand nodes read: one node, one request, two thousand grant ids
// read for it, where a revocation of the same subtree costs three. It now
// costs a request per thousand nodes and grants read, as the revocation
// does.
func TestRogue33HListingASubtreesGrantsCostsTheGrantsItReads(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the 2,000-grant node; make test and CI run them.")
	}
	_, rogue, rootGrant, rootNode, spawned, refill := rogueWithManyGrants(t)
	child := spawned.Node.NodeId
	const grants = 2000
	delegateOnBudget(t, rogue, refill, child, grants, rootGrant, nil)
	refill()
	listings, refusal := listUntilRefused(t, rogue, &tetherv1.ListGrantsRequest{SubtreeNodeId: child, PageSize: 1}, 1)
	if listings != listBurst/3 {
		t.Fatalf("the rogue listed a page of its child's %d grants %d times on a budget of %d requests, want %d (three requests each); refused: %v", grants, listings, listBurst, listBurst/3, refusal)
	}
	wantLimit(t, "the rogue past its budget", refusal, connect.CodeResourceExhausted, "rate limit", "lineage "+rootNode)

}

// TestRogue33HListingGrantsCostsTheAncestorsItReads: a rogue delegates a
// thousand grants to its child, which delegates one from each to the
// grandchild, which delegates one from each of those to the
// great-grandchild; the rogue then lists the great-grandchild's grants,
// 600 a page, again and again. The page shows each grant in its effective
// state, so it reads each one's chain too: 1,201 ancestors beside the 600
// grants (an answer within its first 256 KiB), read for one request. It
// now costs a request per thousand grants read past the page's own (the
// chains' other grants, each once), as a revocation does.
func TestRogue33HListingGrantsCostsTheAncestorsItReads(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the 3,000-grant tree; make test and CI run them.")
	}
	srv, rogue, rootGrant, rootNode, child, refill := rogueWithManyGrants(t)
	admin := srv.AdminClients()
	grandchild := spawn(t, admin, child.Node.NodeId, "grandchild")
	great := spawn(t, admin, grandchild.Node.NodeId, "great").Node.NodeId
	const grants, page = 1000, 600
	first := delegateOnBudget(t, rogue, refill, child.Node.NodeId, grants, rootGrant, nil)
	second := delegateOnBudget(t, srv.Clients(child.Credential), refill, grandchild.Node.NodeId, grants, "", first)
	delegateOnBudget(t, srv.Clients(grandchild.Credential), refill, great, grants, "", second)
	for _, req := range []*tetherv1.ListGrantsRequest{{HolderNodeId: great, PageSize: page}, {SubtreeNodeId: great, PageSize: page}} {
		refill()
		listings, refusal := listUntilRefused(t, rogue, req, page)
		if listings != listBurst/2 {
			t.Fatalf("%v: the rogue listed %d of its great-grandchild's grants, each with two ancestors of its own, %d times on a budget of %d requests, want %d (two requests each); refused: %v", req, page, listings, listBurst, listBurst/2, refusal)
		}
		wantLimit(t, "the rogue past its budget", refusal, connect.CodeResourceExhausted, "rate limit", "lineage "+rootNode)
	}

	// The child's grants, whose one ancestor is the root grant: a page of
	// a thousand costs a request, as it always did.
	refill()
	listings, refusal := listUntilRefused(t, rogue, &tetherv1.ListGrantsRequest{HolderNodeId: child.Node.NodeId}, grants)
	if listings != listBurst {
		t.Fatalf("the rogue listed its child's %d grants (one ancestor) %d times on a budget of %d requests, want %d; refused: %v", grants, listings, listBurst, listBurst, refusal)
	}
	wantLimit(t, "the rogue past its budget", refusal, connect.CodeResourceExhausted, "rate limit", "lineage "+rootNode)
}
