package controlplane_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/capability/grantstore"
	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The thirty-second rogue pass, the server's capability tree: what a
// rogue agent can make the revocation feed and revocations cost, and what
// it can hide from an operator revoking behind it.

// revokedMany has an operator issue n roots to holder and revoke them all
// by their holder: n live tombstones of holder's lineage in the feed.
func revokedMany(t *testing.T, srv *testserver.Server, holder string, n int) grantstore.RevokeResult {
	t.Helper()
	ctx := context.Background()
	op := grantstore.Caller{Principal: "operator:test", Roles: []string{capability.RoleAdmin}}
	for i := range n {
		if _, err := srv.Grants().IssueRoot(ctx, op, grantstore.RootRequest{HolderNodeID: holder, Scopes: []string{"tool:*"}, TTL: time.Hour}); err != nil {
			t.Fatalf("root %d to %s: %v", i, holder, err)
		}
	}
	res, err := srv.Grants().Revoke(ctx, op, grantstore.Target{HolderNodeID: holder}, "test")
	if err != nil {
		t.Fatal(err)
	}
	if len(res.GrantIDs) != n {
		t.Fatalf("revoked %d of %s's grants, want %d", len(res.GrantIDs), holder, n)
	}
	return res
}

// openFeed opens c's revocation feed after `after` and reads it until a
// message reaches head; it returns the messages read, or the error that
// refused or ended the feed.
func openFeed(ctx context.Context, c *testserver.Clients, after, head uint64) ([]*tetherv1.WatchRevocationsResponse, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.Capability.WatchRevocations(ctx, connect.NewRequest(&tetherv1.WatchRevocationsRequest{AfterSequence: after}))
	if err != nil {
		return nil, err
	}
	defer stream.Close()
	var msgs []*tetherv1.WatchRevocationsResponse
	for stream.Receive() {
		msgs = append(msgs, stream.Msg())
		if stream.Msg().HeadSequence >= head {
			return msgs, nil
		}
	}
	return msgs, stream.Err()
}

// TestRogue32FAnAgentsFeedOpenedAtZeroWalksOnlyItsLineage: another tree's
// 2,500 revocations are live in the feed. A rogue agent, whose lineage
// has none, opens its revocation feed at sequence 0 — as a follower new
// to the feed, or one behind its compaction point (a snapshot), does. The
// server walked every tree's live tombstones for it, a batch of a
// thousand at a time, filtering each out, before its feed reached the
// head: one request had the whole feed read, and the first message the
// agent heard was a head of a thousand (the first batch's). The feed now
// keeps each lineage's tombstones apart, and an agent's walks its own:
// its first message is the feed's head. On a manual clock that does not
// move, so that no heartbeat can carry the head instead.
func TestRogue32FAnAgentsFeedOpenedAtZeroWalksOnlyItsLineage(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the 2,500 revocations; make test and CI run them.")
	}
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) {
		cfg.GrantMaxPerNode, cfg.RevocationHeartbeat = 2600, 10*time.Minute
	})
	admin := srv.AdminClients()
	rogue := register(t, admin, "rogue")
	other := register(t, admin, "other")
	res := revokedMany(t, srv, other.Node.NodeId, 2500)
	for _, after := range []uint64{0, 1} {
		msgs, err := openFeed(context.Background(), srv.Clients(rogue.Credential), after, 0)
		if err != nil {
			t.Fatalf("after %d: %v", after, err)
		}
		if m := msgs[0]; len(m.Tombstones) != 0 || m.HeadSequence != res.Sequence {
			t.Fatalf("the rogue's feed opened after %d began with %d tombstones and the head %d, want none and the feed's head %d (another tree's tombstones walked a batch at a time)", after, len(m.Tombstones), m.HeadSequence, res.Sequence)
		}
	}
}

// TestRogue32FReopeningTheFeedCostsWhatItSends: the rogue's own lineage
// has 2,500 live revocations. It opens its revocation feed at 0 and reads
// it to the head, again and again: each opening sends it every live
// tombstone of its lineage (three messages), yet cost one request, where
// a listing of as many grants costs three (a request per thousand). It now
// costs a request per thousand tombstones sent past the first thousand.
func TestRogue32FReopeningTheFeedCostsWhatItSends(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the 2,500 revocations; make test and CI run them.")
	}
	const burst = 30
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) {
		cfg.GrantMaxPerNode, cfg.RateLimit, cfg.RateBurst = 2600, 1, burst
	})
	admin := srv.AdminClients()
	rogue := register(t, admin, "rogue")
	res := revokedMany(t, srv, rogue.Node.NodeId, 2500)
	clk.Advance(2 * burst * time.Second) // a full bucket
	c := srv.Clients(rogue.Credential)
	opened := 0
	var refusal error
	for opened <= burst {
		msgs, err := openFeed(context.Background(), c, 0, res.Sequence)
		if err != nil {
			refusal = err
			break
		}
		got := 0
		for _, m := range msgs {
			got += len(m.Tombstones)
		}
		if got != 2500 {
			t.Fatalf("the rogue's feed sent %d of its lineage's 2,500 tombstones", got)
		}
		opened++
	}
	if opened != burst/3 {
		t.Fatalf("the rogue read its lineage's 2,500 tombstones from its feed %d times on a budget of %d requests, want %d (three requests each); refused: %v", opened, burst, burst/3, refusal)
	}
	wantLimit(t, "the rogue past its budget", refusal, connect.CodeResourceExhausted, "rate limit", "lineage "+rogue.Node.NodeId)
}

// TestRogue32FRevokingGrantsWithLongChainsCostsTheChainsRead: the rogue's
// child holds 1,000 grants its own child delegated it, each from a grant
// of its own (the operator raised the grant bound per node), so that each
// has an ancestor of its own. A revocation by the grandchild as holder, or
// by its subtree, reads the 1,000 grants and every grant of their chains —
// 1,001 more — whatever it then revokes (nothing, after the first), yet
// was charged for the node and the 1,000 grants only: two requests where
// the 2,002 reads cost three. It now counts each chain grant it reads once.
func TestRogue32FRevokingGrantsWithLongChainsCostsTheChainsRead(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the 2,000 delegations; make test and CI run them.")
	}
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) {
		cfg.RateLimit, cfg.RateBurst, cfg.GrantMaxPerNode = 100, bigBurst, 1100
	})
	refill := func() { clk.Advance(2 * bigBurst / 100 * time.Second) }
	ctx := context.Background()
	admin := srv.AdminClients()
	root := register(t, admin, "rogue")
	child := spawn(t, admin, root.Node.NodeId, "child")
	grandchild := spawn(t, admin, child.Node.NodeId, "grandchild")
	g := issueRoot(t, admin, root.Node.NodeId, time.Hour, "tool:*")
	const grants = 1000
	asRoot := grantstore.Caller{Principal: "agent:" + root.Node.NodeId}
	asChild := grantstore.Caller{Principal: "agent:" + child.Node.NodeId}
	for i := range grants {
		mid, err := srv.Grants().Delegate(ctx, asRoot, grantstore.DelegateRequest{ParentGrantID: g.grant.GrantId, HolderNodeID: child.Node.NodeId, Scopes: []string{"tool:*"}})
		if err != nil {
			t.Fatalf("delegation %d to the child: %v", i, err)
		}
		if _, err := srv.Grants().Delegate(ctx, asChild, grantstore.DelegateRequest{ParentGrantID: mid.Grant.GrantID, HolderNodeID: grandchild.Node.NodeId, Scopes: []string{"tool:shell"}}); err != nil {
			t.Fatalf("delegation %d to the grandchild: %v", i, err)
		}
	}
	rogue := srv.Clients(root.Credential)
	refill()
	first, err := rogue.Capability.Revoke(ctx, connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_HolderNodeId{HolderNodeId: grandchild.Node.NodeId}}))
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Msg.RevokedGrantIds) != grants {
		t.Fatalf("the rogue's first revocation revoked %d grants, want %d", len(first.Msg.RevokedGrantIds), grants)
	}
	for _, target := range []*tetherv1.RevokeRequest{
		{Target: &tetherv1.RevokeRequest_SubtreeNodeId{SubtreeNodeId: grandchild.Node.NodeId}},
		{Target: &tetherv1.RevokeRequest_HolderNodeId{HolderNodeId: grandchild.Node.NodeId}},
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
			t.Fatalf("%v: the rogue had its grandchild's %d grants and their %d ancestors read %d times on a budget of %d requests, want %d (three requests each); refused: %v", target.Target, grants, grants+1, revocations, bigBurst, bigBurst/3, refusal)
		}
		wantLimit(t, "the rogue past its budget", refusal, connect.CodeResourceExhausted, "rate limit", "lineage "+root.Node.NodeId)
	}
}

// TestRogue32FAnOperatorsRevocationNamesWhatItFoundRevoked: a rogue that
// sees its operator coming revokes its child's grant itself first (its
// own reason on the record, its own tombstone). The operator's revocation
// by the child's holder, by the rogue's subtree or by the grant's id then
// reported no grant at all — nothing to revoke — and the security team
// could not tell from its answer which grants its request covered. It now
// names them, apart from those it revoked: the child's grant as already
// revoked, and the rogue's own grant (the subtree's) as revoked.
func TestRogue32FAnOperatorsRevocationNamesWhatItFoundRevoked(t *testing.T) {
	srv := testserver.Start(t)
	ctx := context.Background()
	admin := srv.AdminClients()
	root := register(t, admin, "rogue")
	child := spawn(t, admin, root.Node.NodeId, "child")
	g := issueRoot(t, admin, root.Node.NodeId, time.Hour, "tool:*")
	rogue := srv.Clients(root.Credential)
	c := delegate(t, rogue, g, child.Node.NodeId, "tool:shell")
	c2 := delegate(t, rogue, g, child.Node.NodeId, "tool:shell")
	if _, err := revokeGrant(rogue, c.grant.GrantId); err != nil {
		t.Fatal(err)
	}
	// The operator's later requests find its own earlier ones' too.
	both := []string{c.grant.GrantId, c2.grant.GrantId}
	slices.Sort(both)
	for _, tc := range []struct {
		target           *tetherv1.RevokeRequest
		already, revoked []string
	}{
		{&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_GrantId{GrantId: c.grant.GrantId}}, []string{c.grant.GrantId}, nil},
		{&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_HolderNodeId{HolderNodeId: child.Node.NodeId}}, []string{c.grant.GrantId}, []string{c2.grant.GrantId}},
		{&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_SubtreeNodeId{SubtreeNodeId: root.Node.NodeId}}, both, []string{g.grant.GrantId}},
	} {
		resp, err := admin.Capability.Revoke(ctx, connect.NewRequest(tc.target))
		if err != nil {
			t.Fatalf("%v: %v", tc.target.Target, err)
		}
		if got := resp.Msg.AlreadyRevokedGrantIds; !slices.Equal(got, tc.already) {
			t.Errorf("%v: the operator's revocation named %v as already revoked, want %v (the child's grant %s the rogue revoked first)", tc.target.Target, got, tc.already, c.grant.GrantId)
		}
		if got := resp.Msg.RevokedGrantIds; !slices.Equal(got, tc.revoked) {
			t.Errorf("%v: revoked %v, want %v", tc.target.Target, got, tc.revoked)
		}
	}
	// Revoked through an ancestor, and named once: the top of what the
	// request found revoked.
	resp, err := admin.Capability.Revoke(ctx, connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_SubtreeNodeId{SubtreeNodeId: root.Node.NodeId}}))
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Msg.AlreadyRevokedGrantIds; len(got) != 1 || got[0] != g.grant.GrantId || len(resp.Msg.RevokedGrantIds) != 0 {
		t.Errorf("revoking the subtree again named %v already revoked and revoked %v, want the rogue's grant %s alone (its descendants with it) and nothing revoked", got, resp.Msg.RevokedGrantIds, g.grant.GrantId)
	}
}

// TestRogue32FWhatAnOperatorFoundRevokedIsListedWithinABound: the rogue
// revokes the 1,200 grants it delegated to its child (the operator raised
// the grant bound per node), each dead grant kept. An operator's sweep by
// issue time then finds them all revoked already, and listed every one in
// its answer: a rogue revoking its own tree's grants grew the operator's
// answer without bound (every tree's kept dead grants, in one message).
// It lists the first 1,000 and counts the rest.
func TestRogue32FWhatAnOperatorFoundRevokedIsListedWithinABound(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the 1,200 delegations; make test and CI run them.")
	}
	srv := testserver.Start(t, func(cfg *controlplane.Config) { cfg.GrantMaxPerNode = 1300 })
	ctx := context.Background()
	admin := srv.AdminClients()
	root := register(t, admin, "rogue")
	child := spawn(t, admin, root.Node.NodeId, "child")
	g := issueRoot(t, admin, root.Node.NodeId, time.Hour, "tool:*")
	asRoot := grantstore.Caller{Principal: "agent:" + root.Node.NodeId}
	const grants = 1200
	for i := range grants {
		if _, err := srv.Grants().Delegate(ctx, asRoot, grantstore.DelegateRequest{ParentGrantID: g.grant.GrantId, HolderNodeID: child.Node.NodeId, Scopes: []string{"tool:shell"}}); err != nil {
			t.Fatalf("delegation %d: %v", i, err)
		}
	}
	rogue := srv.Clients(root.Credential)
	if _, err := rogue.Capability.Revoke(ctx, connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_HolderNodeId{HolderNodeId: child.Node.NodeId}})); err != nil {
		t.Fatal(err)
	}
	resp, err := admin.Capability.Revoke(ctx, connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_IssuedBefore{IssuedBefore: timestamppb.New(time.Now().Add(time.Hour))}}))
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Msg.RevokedGrantIds; len(got) != 1 || got[0] != g.grant.GrantId {
		t.Fatalf("the sweep revoked %v, want the rogue's grant %s", got, g.grant.GrantId)
	}
	if n, rest := len(resp.Msg.AlreadyRevokedGrantIds), resp.Msg.AlreadyRevokedNotListed; n != grantstore.MaxAlreadyRevokedListed || int(rest) != grants-n {
		t.Fatalf("the sweep listed %d grants already revoked and counted %d more, want %d listed and %d counted", n, rest, grantstore.MaxAlreadyRevokedListed, grants-grantstore.MaxAlreadyRevokedListed)
	}
}
