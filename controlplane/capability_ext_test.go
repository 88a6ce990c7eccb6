package controlplane_test

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/golang-jwt/jwt/v5"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/tree"
)

// capAgent is a registered agent and a client presenting its credential.
type capAgent struct {
	id string
	c  *testserver.Clients
}

// held is a grant and the token minted with it.
type held struct {
	grant *tetherv1.Grant
	token string
}

// capWorld is the tree most capability tests use, on a server with a
// manual clock:
//
//	grandparent ── parent ──┬── child ── descendant
//	                        └── sibling
//	unrelated
//
// Each agent holds one grant, delegated down the tree from a root grant an
// operator issued to the grandparent; unrelated holds a root of its own.
type capWorld struct {
	srv   *testserver.Server
	clk   *clock.Manual
	admin *testserver.Clients

	grandparent, parent, child, sibling, descendant, unrelated       capAgent
	gGrandparent, gParent, gChild, gSibling, gDescendant, gUnrelated held
}

// fastHeartbeat makes idle revocation feeds tick often, so that verifiers
// following a server on a manual clock catch up with it quickly.
func fastHeartbeat(cfg *controlplane.Config) { cfg.RevocationHeartbeat = 20 * time.Millisecond }

func newCapWorld(t *testing.T) *capWorld {
	t.Helper()
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), fastHeartbeat)
	w := &capWorld{srv: srv, clk: clk, admin: srv.AdminClients()}
	agentOf := func(id, credential string) capAgent { return capAgent{id: id, c: srv.Clients(credential)} }

	gp := register(t, w.admin, "grandparent")
	w.grandparent = agentOf(gp.Node.NodeId, gp.Credential)
	p := spawn(t, w.grandparent.c, w.grandparent.id, "parent")
	w.parent = agentOf(p.Node.NodeId, p.Credential)
	c := spawn(t, w.parent.c, w.parent.id, "child")
	w.child = agentOf(c.Node.NodeId, c.Credential)
	s := spawn(t, w.parent.c, w.parent.id, "sibling")
	w.sibling = agentOf(s.Node.NodeId, s.Credential)
	d := spawn(t, w.child.c, w.child.id, "descendant")
	w.descendant = agentOf(d.Node.NodeId, d.Credential)
	u := register(t, w.admin, "unrelated")
	w.unrelated = agentOf(u.Node.NodeId, u.Credential)

	w.gGrandparent = issueRoot(t, w.admin, w.grandparent.id, time.Hour, "tool:*", "s3:read:logs/*")
	w.gParent = delegate(t, w.grandparent.c, w.gGrandparent, w.parent.id, "tool:shell", "tool:fs:*", "s3:read:logs/*")
	w.gChild = delegate(t, w.parent.c, w.gParent, w.child.id, "tool:shell", "tool:fs:read")
	w.gSibling = delegate(t, w.parent.c, w.gParent, w.sibling.id, "tool:shell")
	w.gDescendant = delegate(t, w.child.c, w.gChild, w.descendant.id, "tool:shell")
	w.gUnrelated = issueRoot(t, w.admin, w.unrelated.id, time.Hour, "tool:*")
	return w
}

func issueRoot(t *testing.T, c *testserver.Clients, holder string, ttl time.Duration, scopes ...string) held {
	t.Helper()
	resp, err := c.Capability.IssueRoot(context.Background(), connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: holder, Scopes: scopes, Ttl: durationpb.New(ttl)}))
	if err != nil {
		t.Fatalf("issue root to %s: %v", holder, err)
	}
	return held{resp.Msg.Grant, resp.Msg.Token}
}

func delegate(t *testing.T, c *testserver.Clients, parent held, holder string, scopes ...string) held {
	t.Helper()
	return delegateFor(t, c, parent, holder, 0, scopes...)
}

func delegateFor(t *testing.T, c *testserver.Clients, parent held, holder string, ttl time.Duration, scopes ...string) held {
	t.Helper()
	req := &tetherv1.DelegateRequest{ParentGrantId: parent.grant.GrantId, HolderNodeId: holder, Scopes: scopes}
	if ttl > 0 {
		req.Ttl = durationpb.New(ttl)
	}
	resp, err := c.Capability.Delegate(context.Background(), connect.NewRequest(req))
	if err != nil {
		t.Fatalf("delegate from %s to %s: %v", parent.grant.GrantId, holder, err)
	}
	return held{resp.Msg.Grant, resp.Msg.Token}
}

func revokeGrant(c *testserver.Clients, grantID string) (*tetherv1.RevokeResponse, error) {
	resp, err := c.Capability.Revoke(context.Background(), connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_GrantId{GrantId: grantID}, Reason: "test"}))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

func introspect(t *testing.T, c *testserver.Clients, token string) *tetherv1.IntrospectResponse {
	t.Helper()
	resp, err := c.Capability.Introspect(context.Background(), connect.NewRequest(&tetherv1.IntrospectRequest{Token: token}))
	if err != nil {
		t.Fatalf("introspect: %v", err)
	}
	return resp.Msg
}

func getGrant(t *testing.T, c *testserver.Clients, grantID string) *tetherv1.Grant {
	t.Helper()
	resp, err := c.Capability.GetGrant(context.Background(), connect.NewRequest(&tetherv1.GetGrantRequest{GrantId: grantID}))
	if err != nil {
		t.Fatalf("get grant %s: %v", grantID, err)
	}
	return resp.Msg.Grant
}

// allGrants lists every grant, page by page, as an operator sees them.
func allGrants(t *testing.T, c *testserver.Clients, req *tetherv1.ListGrantsRequest) []*tetherv1.Grant {
	t.Helper()
	var out []*tetherv1.Grant
	for {
		resp, err := c.Capability.ListGrants(context.Background(), connect.NewRequest(req))
		if err != nil {
			t.Fatalf("list grants: %v", err)
		}
		out = append(out, resp.Msg.Grants...)
		if resp.Msg.NextPageToken == "" {
			return out
		}
		req.PageToken = resp.Msg.NextPageToken
	}
}

func grantIDs(gs []*tetherv1.Grant) []string {
	out := make([]string, len(gs))
	for i, g := range gs {
		out[i] = g.GrantId
	}
	slices.Sort(out)
	return out
}

func sortedIDs(ids ...string) []string {
	out := slices.Clone(ids)
	slices.Sort(out)
	return out
}

// feedMessages opens the revocation feed after a sequence and returns its
// first message.
func firstFeedMessage(t *testing.T, c *testserver.Clients, after uint64) *tetherv1.WatchRevocationsResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := c.Capability.WatchRevocations(ctx, connect.NewRequest(&tetherv1.WatchRevocationsRequest{AfterSequence: after}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	if !stream.Receive() {
		t.Fatalf("the revocation feed sent nothing: %v", stream.Err())
	}
	return stream.Msg()
}

// capState is everything a refused request must leave as it was: every
// grant in its effective state, and the revocation feed's head.
func capState(t *testing.T, admin *testserver.Clients) string {
	t.Helper()
	var b strings.Builder
	for _, g := range allGrants(t, admin, &tetherv1.ListGrantsRequest{}) {
		raw, err := protojson.Marshal(g)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(raw)
		b.WriteByte('\n')
	}
	fmt.Fprintf(&b, "feed head %d", firstFeedMessage(t, admin, 0).HeadSequence)
	return b.String()
}

// startVerifier runs an agentsdk Verifier that follows srv's revocation
// feed on clk, until the test ends, and waits until it is ready.
func startVerifier(t *testing.T, url, token string, clk agentsdk.Clock) *agentsdk.Verifier {
	t.Helper()
	v, err := agentsdk.NewVerifier(agentsdk.VerifierConfig{
		Conn: agentsdk.Dial(url, token, agentsdk.WithHTTPClient(testserver.H2CClient())), Clock: clk, StalenessBudget: 10 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- v.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("verifier: %v", err)
		}
	})
	select {
	case <-v.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("the verifier never received the revocation feed")
	}
	return v
}

func viewerToken(t *testing.T, admin *testserver.Clients, role tetherv1.Role) string {
	t.Helper()
	resp, err := admin.Auth.CreateToken(context.Background(), connect.NewRequest(&tetherv1.CreateTokenRequest{Role: role, Ttl: durationpb.New(24 * time.Hour), Subject: strings.ToLower(strings.TrimPrefix(role.String(), "ROLE_"))}))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg.Token
}

// terminateInStore marks a node terminated directly in the store: the node
// is gone (its credential stops working) while its subtree keeps running,
// as when a parent process dies without a termination.
func terminateInStore(t *testing.T, srv *testserver.Server, nodeID string) {
	t.Helper()
	err := srv.Store().Update(context.Background(), func(tx store.Txn) error {
		n, err := tree.GetNodeIn(tx, nodeID)
		if err != nil {
			return err
		}
		n.State = tree.NodeStateTerminated
		return tree.PutNodeIn(tx, n)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The propagation rule of the seed: a grandparent revokes its grandchild's
// grant after the parent in the middle is gone, and the grandchild's token
// — and every token derived from it — is rejected by Introspect and by an
// offline verifier, while its sibling's stays good.
func TestGrandparentRevokesAGrandchildsGrantAfterTheParentIsGone(t *testing.T) {
	w := newCapWorld(t)
	ctx := context.Background()
	verifier := startVerifier(t, w.srv.URL, viewerToken(t, w.admin, tetherv1.Role_ROLE_VIEWER), w.clk)
	for _, h := range []held{w.gChild, w.gDescendant, w.gSibling} {
		if _, err := verifier.Verify(ctx, h.token); err != nil {
			t.Fatalf("before any revocation, the verifier refuses %s: %v", h.grant.GrantId, err)
		}
	}
	if !slices.Contains(w.gChild.grant.Revokers, "agent:"+w.grandparent.id) || slices.Contains(w.gChild.grant.Revokers, "agent:"+w.child.id) {
		t.Fatalf("child's revokers %v: want the grandparent in, the holder out", w.gChild.grant.Revokers)
	}

	terminateInStore(t, w.srv, w.parent.id)
	if _, err := revokeGrant(w.parent.c, w.gChild.grant.GrantId); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("the terminated parent still acts: %v", err)
	}
	res, err := revokeGrant(w.grandparent.c, w.gChild.grant.GrantId)
	if err != nil {
		t.Fatalf("the grandparent revoking its grandchild's grant: %v", err)
	}
	if !slices.Equal(res.RevokedGrantIds, []string{w.gChild.grant.GrantId}) || res.Sequence == 0 {
		t.Fatalf("revoke answered %v at %d; want one tombstone for the child's grant", res.RevokedGrantIds, res.Sequence)
	}

	for _, h := range []held{w.gChild, w.gDescendant} {
		got := introspect(t, w.admin, h.token)
		if got.Active || !strings.Contains(got.Reason, "revoked") || !strings.Contains(got.Reason, w.gChild.grant.GrantId) {
			t.Errorf("introspect %s after the revocation: active=%v %q", h.grant.GrantId, got.Active, got.Reason)
		}
	}
	if got := introspect(t, w.admin, w.gSibling.token); !got.Active {
		t.Errorf("the sibling's token went down with the child's: %q", got.Reason)
	}
	testserver.WaitFor(t, 10*time.Second, "the verifier to apply the tombstone", func() bool { return verifier.Head() >= res.Sequence })
	for _, h := range []held{w.gChild, w.gDescendant} {
		if _, err := verifier.Verify(ctx, h.token); !errors.Is(err, capability.ErrGrantRevoked) {
			t.Errorf("the verifier on %s after the revocation: %v, want ErrGrantRevoked", h.grant.GrantId, err)
		}
	}
	if _, err := verifier.Verify(ctx, w.gSibling.token); err != nil {
		t.Errorf("the verifier refuses the sibling: %v", err)
	}

	g := getGrant(t, w.admin, w.gDescendant.grant.GrantId)
	if g.State != tetherv1.GrantState_GRANT_STATE_REVOKED || g.RevokedVia != w.gChild.grant.GrantId || g.RevokedBy != "agent:"+w.grandparent.id {
		t.Fatalf("descendant's grant reads %v via %q by %q", g.State, g.RevokedVia, g.RevokedBy)
	}
	if _, err := w.child.c.Capability.Refresh(ctx, connect.NewRequest(&tetherv1.RefreshRequest{GrantId: w.gChild.grant.GrantId})); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("refreshing the revoked grant: %v", err)
	}
	if _, err := w.descendant.c.Capability.Refresh(ctx, connect.NewRequest(&tetherv1.RefreshRequest{GrantId: w.gDescendant.grant.GrantId})); connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "ancestor") {
		t.Fatalf("refreshing a grant below the revoked one: %v, want failed_precondition naming the ancestor", err)
	}
}

// Only the revoker set may revoke: a sibling, a descendant, an unrelated
// agent and the holder itself are refused, and nothing changes.
func TestRevokeOutsideTheRevokerSetIsDenied(t *testing.T) {
	w := newCapWorld(t)
	before := capState(t, w.admin)
	for _, tc := range []struct {
		who    string
		caller *testserver.Clients
		target string
	}{
		{"a sibling", w.sibling.c, w.gChild.grant.GrantId},
		{"a descendant", w.descendant.c, w.gChild.grant.GrantId},
		{"a descendant, of the root", w.child.c, w.gGrandparent.grant.GrantId},
		{"an unrelated agent", w.unrelated.c, w.gChild.grant.GrantId},
		{"the holder itself", w.child.c, w.gChild.grant.GrantId},
		{"a holder of a root", w.grandparent.c, w.gGrandparent.grant.GrantId},
	} {
		_, err := revokeGrant(tc.caller, tc.target)
		if connect.CodeOf(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), "may not revoke grant "+tc.target) {
			t.Errorf("%s revoking %s: %v, want permission_denied saying who may not revoke what", tc.who, tc.target, err)
		}
	}
	if after := capState(t, w.admin); after != before {
		t.Fatalf("a refused revocation changed state:\n%s\n----\n%s", before, after)
	}
	// Every ancestor may, and so may the security role.
	if _, err := revokeGrant(w.parent.c, w.gDescendant.grant.GrantId); err != nil {
		t.Fatalf("the parent revoking two levels down: %v", err)
	}
	security := w.srv.Clients(viewerToken(t, w.admin, tetherv1.Role_ROLE_SECURITY))
	if _, err := revokeGrant(security, w.gUnrelated.grant.GrantId); err != nil {
		t.Fatalf("the security role revoking a root: %v", err)
	}
}

// Attenuation at issuance: a delegation that widens the scopes, outlives
// its parent or leaves the delegator's subtree is refused, naming the
// offending scope, and nothing changes.
func TestDelegationCannotEscalate(t *testing.T) {
	w := newCapWorld(t)
	before := capState(t, w.admin)
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		caller *testserver.Clients
		req    *tetherv1.DelegateRequest
		code   connect.Code
		says   string
	}{
		{"a scope the parent lacks", w.parent.c,
			&tetherv1.DelegateRequest{ParentGrantId: w.gParent.grant.GrantId, HolderNodeId: w.child.id, Scopes: []string{"tool:shell", "tool:net"}},
			connect.CodePermissionDenied, `scope "tool:net" is not covered`},
		{"a wider pattern", w.parent.c,
			&tetherv1.DelegateRequest{ParentGrantId: w.gParent.grant.GrantId, HolderNodeId: w.child.id, Scopes: []string{"tool:*"}},
			connect.CodePermissionDenied, `scope "tool:*" is not covered`},
		{"a prefix that is not a segment", w.parent.c,
			&tetherv1.DelegateRequest{ParentGrantId: w.gParent.grant.GrantId, HolderNodeId: w.child.id, Scopes: []string{"s3:read:logs*"}},
			connect.CodePermissionDenied, `scope "s3:read:logs*" is not covered`},
		{"a longer life than the parent", w.parent.c,
			&tetherv1.DelegateRequest{ParentGrantId: w.gParent.grant.GrantId, HolderNodeId: w.child.id, Scopes: []string{"tool:shell"}, Ttl: durationpb.New(2 * time.Hour)},
			connect.CodeInvalidArgument, "expiry"},
		{"to a sibling", w.child.c,
			&tetherv1.DelegateRequest{ParentGrantId: w.gChild.grant.GrantId, HolderNodeId: w.sibling.id, Scopes: []string{"tool:shell"}},
			connect.CodePermissionDenied, "not a descendant"},
		{"to an ancestor", w.child.c,
			&tetherv1.DelegateRequest{ParentGrantId: w.gChild.grant.GrantId, HolderNodeId: w.grandparent.id, Scopes: []string{"tool:shell"}},
			connect.CodePermissionDenied, "not a descendant"},
		{"to itself", w.child.c,
			&tetherv1.DelegateRequest{ParentGrantId: w.gChild.grant.GrantId, HolderNodeId: w.child.id, Scopes: []string{"tool:shell"}},
			connect.CodePermissionDenied, "already holds"},
	} {
		_, err := tc.caller.Capability.Delegate(ctx, connect.NewRequest(tc.req))
		if connect.CodeOf(err) != tc.code || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: %v, want %s saying %q", tc.name, err, tc.code, tc.says)
		}
	}
	if after := capState(t, w.admin); after != before {
		t.Fatalf("a refused delegation changed state:\n%s\n----\n%s", before, after)
	}
	// Narrowing works, a pattern within a pattern too.
	narrow := delegate(t, w.parent.c, w.gParent, w.child.id, "tool:fs:read:*", "s3:read:logs/2026/*")
	if !slices.Equal(narrow.grant.Chain, []string{w.gGrandparent.grant.GrantId, w.gParent.grant.GrantId}) {
		t.Fatalf("chain = %v", narrow.grant.Chain)
	}
}

func TestBulkRevocation(t *testing.T) {
	ctx := context.Background()
	bulk := func(c *testserver.Clients, req *tetherv1.RevokeRequest) (*tetherv1.RevokeResponse, error) {
		resp, err := c.Capability.Revoke(ctx, connect.NewRequest(req))
		if err != nil {
			return nil, err
		}
		return resp.Msg, nil
	}
	state := func(c *testserver.Clients, h held) tetherv1.GrantState { return getGrant(t, c, h.grant.GrantId).State }
	const active, revoked = tetherv1.GrantState_GRANT_STATE_ACTIVE, tetherv1.GrantState_GRANT_STATE_REVOKED

	t.Run("by holder", func(t *testing.T) {
		w := newCapWorld(t)
		// The child holds a second grant, a root of its own.
		extra := issueRoot(t, w.admin, w.child.id, time.Hour, "tool:net")
		res, err := bulk(w.admin, &tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_HolderNodeId{HolderNodeId: w.child.id}, Reason: "rotate"})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := sortedIDs(res.RevokedGrantIds...), sortedIDs(w.gChild.grant.GrantId, extra.grant.GrantId); !slices.Equal(got, want) {
			t.Fatalf("revoked %v, want %v", got, want)
		}
		if state(w.admin, w.gDescendant) != revoked || state(w.admin, w.gSibling) != active || state(w.admin, w.gParent) != active {
			t.Fatal("revoking by holder reached the wrong grants")
		}
		if head := firstFeedMessage(t, w.admin, 0); len(head.Tombstones) != 2 {
			t.Fatalf("%d tombstones for two top grants", len(head.Tombstones))
		}
	})

	t.Run("by subtree", func(t *testing.T) {
		w := newCapWorld(t)
		before := capState(t, w.admin)
		// An unrelated agent, and the parent's own descendant, may not.
		for _, c := range []*testserver.Clients{w.unrelated.c, w.child.c} {
			if _, err := bulk(c, &tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_SubtreeNodeId{SubtreeNodeId: w.parent.id}}); connect.CodeOf(err) != connect.CodePermissionDenied {
				t.Fatalf("revoking the parent's subtree without authority: %v", err)
			}
		}
		if after := capState(t, w.admin); after != before {
			t.Fatalf("a refused bulk revocation changed state:\n%s\n----\n%s", before, after)
		}
		// The grandparent may: it is an ancestor of every grant there.
		res, err := bulk(w.grandparent.c, &tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_SubtreeNodeId{SubtreeNodeId: w.parent.id}})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(res.RevokedGrantIds, []string{w.gParent.grant.GrantId}) {
			t.Fatalf("revoked %v, want only the top grant %s: one tombstone covers the rest", res.RevokedGrantIds, w.gParent.grant.GrantId)
		}
		for _, h := range []held{w.gParent, w.gChild, w.gSibling, w.gDescendant} {
			if got := introspect(t, w.admin, h.token); got.Active {
				t.Errorf("%s is still active after its subtree was revoked", h.grant.GrantId)
			}
		}
		if state(w.admin, w.gGrandparent) != active || state(w.admin, w.gUnrelated) != active {
			t.Fatal("revoking a subtree reached outside it")
		}
		if res, err := bulk(w.grandparent.c, &tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_SubtreeNodeId{SubtreeNodeId: w.parent.id}}); err != nil || len(res.RevokedGrantIds) != 0 {
			t.Fatalf("revoking the same subtree again: %v %v, want nothing to do", res, err)
		}
	})

	t.Run("issued before", func(t *testing.T) {
		w := newCapWorld(t)
		cutoff := w.clk.Now().Add(time.Second)
		w.clk.Advance(time.Minute)
		late := issueRoot(t, w.admin, w.unrelated.id, time.Hour, "tool:shell")
		lateChild := delegate(t, w.grandparent.c, w.gGrandparent, w.child.id, "tool:shell")
		security := w.srv.Clients(viewerToken(t, w.admin, tetherv1.Role_ROLE_SECURITY))
		res, err := bulk(security, &tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_IssuedBefore{IssuedBefore: timestamppb.New(cutoff)}, Reason: "key compromise"})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := sortedIDs(res.RevokedGrantIds...), sortedIDs(w.gGrandparent.grant.GrantId, w.gUnrelated.grant.GrantId); !slices.Equal(got, want) {
			t.Fatalf("revoked %v, want the two old roots %v", got, want)
		}
		for _, h := range []held{w.gGrandparent, w.gChild, w.gDescendant, w.gUnrelated, lateChild} {
			if got := introspect(t, w.admin, h.token); got.Active {
				t.Errorf("%s is still active", h.grant.GrantId)
			}
		}
		if got := introspect(t, w.admin, late.token); !got.Active {
			t.Errorf("a grant issued after the cutoff was revoked: %s", got.Reason)
		}
	})
}

// Every kind of bad input is refused with a clear error and changes
// nothing: no grant, no tombstone.
func TestBadCapabilityInputIsRefusedWithoutStateChange(t *testing.T) {
	w := newCapWorld(t)
	ctx := context.Background()
	unknownGrant, unknownNode := "g_00000000000000000000", "n_00000000000000000000"
	viewer := w.srv.Clients(viewerToken(t, w.admin, tetherv1.Role_ROLE_VIEWER))
	operator := w.srv.Clients(viewerToken(t, w.admin, tetherv1.Role_ROLE_OPERATOR))
	tooMany := make([]string, capability.MaxScopes+1)
	for i := range tooMany {
		tooMany[i] = fmt.Sprintf("tool:t%d", i)
	}
	del := func(c *testserver.Clients, req *tetherv1.DelegateRequest) func() error {
		return func() error { _, err := c.Capability.Delegate(ctx, connect.NewRequest(req)); return err }
	}
	rev := func(c *testserver.Clients, req *tetherv1.RevokeRequest) func() error {
		return func() error { _, err := c.Capability.Revoke(ctx, connect.NewRequest(req)); return err }
	}
	root := func(c *testserver.Clients, req *tetherv1.IssueRootRequest) func() error {
		return func() error { _, err := c.Capability.IssueRoot(ctx, connect.NewRequest(req)); return err }
	}
	refresh := func(c *testserver.Clients, grantID string) func() error {
		return func() error {
			_, err := c.Capability.Refresh(ctx, connect.NewRequest(&tetherv1.RefreshRequest{GrantId: grantID}))
			return err
		}
	}
	byGrant := func(id string) *tetherv1.RevokeRequest {
		return &tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_GrantId{GrantId: id}}
	}
	child := w.gChild.grant.GrantId
	cases := []struct {
		name string
		call func() error
		code connect.Code
		says string
	}{
		{"get an unknown grant", func() error {
			_, err := w.admin.Capability.GetGrant(ctx, connect.NewRequest(&tetherv1.GetGrantRequest{GrantId: unknownGrant}))
			return err
		}, connect.CodeNotFound, unknownGrant},
		{"get a malformed grant id", func() error {
			_, err := w.admin.Capability.GetGrant(ctx, connect.NewRequest(&tetherv1.GetGrantRequest{GrantId: "../../etc"}))
			return err
		}, connect.CodeInvalidArgument, "grant_id"},
		{"get an oversized grant id", func() error {
			_, err := w.admin.Capability.GetGrant(ctx, connect.NewRequest(&tetherv1.GetGrantRequest{GrantId: strings.Repeat("g", 64<<10)}))
			return err
		}, connect.CodeInvalidArgument, "grant_id"},
		{"revoke an unknown grant", rev(w.admin, byGrant(unknownGrant)), connect.CodeNotFound, unknownGrant},
		{"revoke without a target", rev(w.admin, &tetherv1.RevokeRequest{Reason: "x"}), connect.CodeInvalidArgument, "exactly one target"},
		{"revoke with an oversized reason", rev(w.grandparent.c, &tetherv1.RevokeRequest{Target: byGrant(child).Target, Reason: strings.Repeat("r", 4096)}), connect.CodeInvalidArgument, "reason"},
		{"revoke the grants of an unknown holder", rev(w.admin, &tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_HolderNodeId{HolderNodeId: unknownNode}}), connect.CodeNotFound, unknownNode},
		{"revoke an unknown subtree", rev(w.admin, &tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_SubtreeNodeId{SubtreeNodeId: unknownNode}}), connect.CodeNotFound, unknownNode},
		{"revoke as a viewer", rev(viewer, byGrant(child)), connect.CodePermissionDenied, "may not call"},
		{"refresh an unknown grant", refresh(w.child.c, unknownGrant), connect.CodeNotFound, unknownGrant},
		{"refresh a descendant's grant", refresh(w.parent.c, child), connect.CodePermissionDenied, "only its holder"},
		{"refresh a grant outside the subtree, answered as unknown", refresh(w.sibling.c, child), connect.CodeNotFound, "unknown grant: grant_id " + child},
		{"delegate from an unknown grant", del(w.child.c, &tetherv1.DelegateRequest{ParentGrantId: unknownGrant, HolderNodeId: w.descendant.id, Scopes: []string{"tool:shell"}}), connect.CodeNotFound, unknownGrant},
		{"delegate to an unknown node, answered as one outside the subtree", del(w.child.c, &tetherv1.DelegateRequest{ParentGrantId: child, HolderNodeId: unknownNode, Scopes: []string{"tool:shell"}}), connect.CodePermissionDenied, "node " + unknownNode + " is not a descendant of " + w.child.id},
		{"delegate from a descendant's grant", del(w.parent.c, &tetherv1.DelegateRequest{ParentGrantId: child, HolderNodeId: w.descendant.id, Scopes: []string{"tool:shell"}}), connect.CodePermissionDenied, "is held by agent:" + w.child.id},
		{"delegate from a grant outside the subtree, answered as unknown", del(w.sibling.c, &tetherv1.DelegateRequest{ParentGrantId: child, HolderNodeId: w.descendant.id, Scopes: []string{"tool:shell"}}), connect.CodeNotFound, "unknown grant: parent_grant_id " + child},
		{"delegate as an operator", del(operator, &tetherv1.DelegateRequest{ParentGrantId: child, HolderNodeId: w.descendant.id, Scopes: []string{"tool:shell"}}), connect.CodePermissionDenied, "only the agent holding"},
		{"delegate an escalated scope", del(w.child.c, &tetherv1.DelegateRequest{ParentGrantId: child, HolderNodeId: w.descendant.id, Scopes: []string{"tool:fs:write"}}), connect.CodePermissionDenied, `"tool:fs:write"`},
		{"delegate too many scopes", del(w.child.c, &tetherv1.DelegateRequest{ParentGrantId: child, HolderNodeId: w.descendant.id, Scopes: tooMany}), connect.CodeInvalidArgument, "exceed"},
		{"delegate an oversized scope", del(w.child.c, &tetherv1.DelegateRequest{ParentGrantId: child, HolderNodeId: w.descendant.id, Scopes: []string{"tool:" + strings.Repeat("x", 200)}}), connect.CodeInvalidArgument, "exceeds"},
		{"delegate a malformed scope", del(w.child.c, &tetherv1.DelegateRequest{ParentGrantId: child, HolderNodeId: w.descendant.id, Scopes: []string{"tool:*:x"}}), connect.CodeInvalidArgument, "tool:*:x"},
		{"delegate no scope", del(w.child.c, &tetherv1.DelegateRequest{ParentGrantId: child, HolderNodeId: w.descendant.id}), connect.CodeInvalidArgument, "at least one scope"},
		{"delegate a negative ttl", del(w.child.c, &tetherv1.DelegateRequest{ParentGrantId: child, HolderNodeId: w.descendant.id, Scopes: []string{"tool:shell"}, Ttl: durationpb.New(-time.Minute)}), connect.CodeInvalidArgument, "ttl"},
		{"issue a root to an unknown node", root(w.admin, &tetherv1.IssueRootRequest{HolderNodeId: unknownNode, Scopes: []string{"tool:*"}}), connect.CodeNotFound, unknownNode},
		{"issue a root with a bad scope", root(w.admin, &tetherv1.IssueRootRequest{HolderNodeId: w.child.id, Scopes: []string{"tool shell"}}), connect.CodeInvalidArgument, "scope"},
		{"issue a root for ten years", root(w.admin, &tetherv1.IssueRootRequest{HolderNodeId: w.child.id, Scopes: []string{"tool:*"}, Ttl: durationpb.New(10 * 365 * 24 * time.Hour)}), connect.CodeInvalidArgument, "ttl"},
		{"issue a root as an agent", root(w.grandparent.c, &tetherv1.IssueRootRequest{HolderNodeId: w.child.id, Scopes: []string{"tool:*"}}), connect.CodePermissionDenied, "may not call"},
		{"list with two filters", func() error {
			_, err := w.admin.Capability.ListGrants(ctx, connect.NewRequest(&tetherv1.ListGrantsRequest{HolderNodeId: w.child.id, SubtreeNodeId: w.child.id}))
			return err
		}, connect.CodeInvalidArgument, "at most one"},
		{"list another agent's grants", func() error {
			_, err := w.child.c.Capability.ListGrants(ctx, connect.NewRequest(&tetherv1.ListGrantsRequest{HolderNodeId: w.grandparent.id}))
			return err
		}, connect.CodePermissionDenied, "own subtree"},
		{"introspect nothing", func() error {
			_, err := w.admin.Capability.Introspect(ctx, connect.NewRequest(&tetherv1.IntrospectRequest{}))
			return err
		}, connect.CodeInvalidArgument, "token"},
	}
	before := capState(t, w.admin)
	for _, tc := range cases {
		err := tc.call()
		if connect.CodeOf(err) != tc.code || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: %v, want %s saying %q", tc.name, err, tc.code, tc.says)
		}
	}
	if after := capState(t, w.admin); after != before {
		t.Fatalf("a refused request changed state:\n%s\n----\n%s", before, after)
	}

	// An expired parent: the grant lived a minute.
	short := delegateFor(t, w.parent.c, w.gParent, w.child.id, time.Minute, "tool:shell")
	w.clk.Advance(2 * time.Minute)
	before = capState(t, w.admin)
	err := del(w.child.c, &tetherv1.DelegateRequest{ParentGrantId: short.grant.GrantId, HolderNodeId: w.descendant.id, Scopes: []string{"tool:shell"}})()
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("delegating from an expired grant: %v", err)
	}
	if err := refresh(w.child.c, short.grant.GrantId)(); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("refreshing an expired grant: %v", err)
	}
	if after := capState(t, w.admin); after != before {
		t.Fatalf("a refused delegation from an expired grant changed state:\n%s\n----\n%s", before, after)
	}
}

// jwtParts splits a compact JWS and decodes its payload.
func jwtPayload(t *testing.T, token string) (header, payload string, claims map[string]any, signature string) {
	t.Helper()
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		t.Fatalf("not a JWS: %d parts", len(parts))
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &claims); err != nil {
		t.Fatal(err)
	}
	return parts[0], parts[1], claims, parts[2]
}

func encodeSegment(t *testing.T, v any) string {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return base64.RawURLEncoding.EncodeToString(raw)
}

// Forged, tampered and malformed tokens: Introspect calls each inactive
// with a reason that says why (and never quotes it), the offline verifier
// and the tool ledger refuse each with the matching error, and nothing
// changes.
func TestForgedAndMalformedTokensAreRefused(t *testing.T) {
	w := newCapWorld(t)
	ctx := context.Background()
	verifier := startVerifier(t, w.srv.URL, w.srv.Admin, w.clk)
	ring := w.srv.Issuer().Ring()
	signer, err := ring.Signer(w.clk.Now())
	if err != nil {
		t.Fatal(err)
	}
	valid := w.gChild.token
	header, payload, claims, _ := jwtPayload(t, valid)

	sign := func(method jwt.SigningMethod, key any, kid string, c jwt.MapClaims) string {
		tok := jwt.NewWithClaims(method, c)
		tok.Header["kid"] = kid
		s, err := tok.SignedString(key)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	withClaim := func(name string, value any) jwt.MapClaims {
		c := jwt.MapClaims{}
		for k, v := range claims {
			c[k] = v
		}
		c[name] = value
		return c
	}
	_, stranger, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	tamperedChain := encodeSegment(t, withClaim("chain", []string{w.gUnrelated.grant.GrantId}))

	cases := []struct {
		name  string
		token string
		want  error
		says  string
	}{
		{"garbage", "not-a-token", capability.ErrTokenMalformed, "malformed"},
		{"three empty segments", "..", capability.ErrTokenMalformed, "malformed"},
		{"a space inside", header + ". " + payload + ".x", capability.ErrTokenMalformed, "malformed"},
		{"oversized", strings.Repeat("A", capability.MaxTokenBytes+1), capability.ErrTokenTooLarge, "too large"},
		{"alg none", encodeSegment(t, map[string]any{"alg": "none", "typ": "JWT", "kid": signer.ID}) + "." + payload + ".", capability.ErrTokenAlgorithm, "algorithm"},
		{"HS256 keyed with the public key", sign(jwt.SigningMethodHS256, []byte(signer.Public), signer.ID, withClaim("sub", w.child.id)), capability.ErrTokenAlgorithm, "algorithm"},
		{"an unknown kid", sign(jwt.SigningMethodEdDSA, stranger, "no-such-key", withClaim("sub", w.child.id)), capability.ErrUnknownKey, "unknown signing key"},
		{"a tampered chain", header + "." + tamperedChain + "." + strings.Split(valid, ".")[2], capability.ErrTokenSignature, "signature"},
		{"another issuer", sign(jwt.SigningMethodEdDSA, signer.Private, signer.ID, withClaim("iss", "someone-else")), capability.ErrTokenIssuer, "issuer"},
		// Signed by the same ring, for another audience.
		{"an agent credential", credentialOf(t, w.srv, w.child.id), capability.ErrTokenAudience, "audience"},
	}

	gate := w.srv.Clients(w.srv.ToolServerToken(t, "gate-1"))
	before := capState(t, w.admin)
	for _, tc := range cases {
		got := introspect(t, w.admin, tc.token)
		if got.Active || !strings.Contains(got.Reason, tc.says) || got.Grant != nil {
			t.Errorf("introspect %s: active=%v %q (grant %v), want inactive saying %q", tc.name, got.Active, got.Reason, got.Grant != nil, tc.says)
		}
		if _, err := verifier.Verify(ctx, tc.token); !errors.Is(err, tc.want) {
			t.Errorf("verifier on %s: %v, want %v", tc.name, err, tc.want)
		} else if leaks(err.Error(), tc.token) {
			t.Errorf("verifier on %s: the error quotes the token", tc.name)
		}
		_, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: tc.token, Tool: "shell", GateId: "gate-1"}))
		if connect.CodeOf(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("begin a call with %s: %v, want permission_denied saying %q", tc.name, err, tc.says)
		} else if leaks(err.Error(), tc.token) {
			t.Errorf("begin a call with %s: the error quotes the token", tc.name)
		}
		if leaks(got.Reason, tc.token) {
			t.Errorf("introspect %s: the reason quotes the token", tc.name)
		}
	}
	if after := capState(t, w.admin); after != before {
		t.Fatalf("a refused token changed state:\n%s\n----\n%s", before, after)
	}
	// Even signed with the control plane's own key, a token whose chain
	// differs from the stored grant's is refused where the store is known.
	resigned := sign(jwt.SigningMethodEdDSA, signer.Private, signer.ID, withClaim("chain", []string{w.gGrandparent.grant.GrantId}))
	if got := introspect(t, w.admin, resigned); got.Active || !strings.Contains(got.Reason, "different chain") {
		t.Errorf("introspect a re-signed token with another chain: active=%v %q", got.Active, got.Reason)
	}
	if _, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: resigned, Tool: "shell", GateId: "gate-1"})); connect.CodeOf(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), "different chain") {
		t.Errorf("begin a call with a re-signed token with another chain: %v", err)
	}
	// The untouched token is fine everywhere.
	if got := introspect(t, w.admin, valid); !got.Active {
		t.Fatalf("the valid token: %q", got.Reason)
	}
	if _, err := verifier.Verify(ctx, valid); err != nil {
		t.Fatal(err)
	}
}

// credentialOf mints an agent credential for a node with the server's own
// issuer, as Spawn does.
func credentialOf(t *testing.T, srv *testserver.Server, nodeID string) string {
	t.Helper()
	token, _, err := srv.Issuer().MintAgent(nodeID, srv.Clock.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return token
}

// leaks reports whether msg contains any sizeable piece of token.
func leaks(msg, token string) bool {
	for _, part := range strings.Split(token, ".") {
		for len(part) >= 16 {
			if strings.Contains(msg, part[:16]) {
				return true
			}
			part = part[16:]
		}
	}
	return false
}

// A verifier that stops hearing from the feed fails closed once its
// staleness budget has passed on its own clock, for every token, cached
// or not.
func TestVerifierFailsClosedWhenTheFeedStalls(t *testing.T) {
	w := newCapWorld(t)
	ctx := context.Background()
	verifier := startVerifier(t, w.srv.URL, w.srv.Admin, w.clk)
	if _, err := verifier.Verify(ctx, w.gChild.token); err != nil {
		t.Fatal(err)
	}
	w.srv.Stop() // the feed goes silent
	w.clk.Advance(9 * time.Second)
	if _, err := verifier.Verify(ctx, w.gChild.token); err != nil {
		t.Fatalf("within the budget: %v", err)
	}
	w.clk.Advance(2 * time.Second)
	for _, token := range []string{w.gChild.token, w.gSibling.token} { // cached, and never seen
		if _, err := verifier.Verify(ctx, token); !errors.Is(err, capability.ErrFeedStale) {
			t.Fatalf("past the budget: %v, want ErrFeedStale", err)
		}
	}
	if err := verifier.Fresh(); !errors.Is(err, capability.ErrFeedStale) {
		t.Fatalf("Fresh = %v", err)
	}

	// A verifier that never heard from its feed refuses from the start.
	never, err := agentsdk.NewVerifier(agentsdk.VerifierConfig{Conn: agentsdk.Dial(w.srv.URL, w.srv.Admin), Clock: w.clk})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := never.Verify(ctx, w.gChild.token); !errors.Is(err, capability.ErrFeedStale) {
		t.Fatalf("a verifier that never synced: %v", err)
	}
}

// The feed over the wire: resume from a sequence, live tombstones, and a
// snapshot for a follower whose position was pruned away.
func TestWatchRevocationsResumesAndSnapshots(t *testing.T) {
	w := newCapWorld(t)
	ctx := context.Background()
	var seqs []uint64
	for _, h := range []held{w.gDescendant, w.gSibling, w.gUnrelated} {
		res, err := revokeGrant(w.admin, h.grant.GrantId)
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, res.Sequence)
		w.clk.Advance(time.Minute)
	}
	if !slices.Equal(seqs, []uint64{1, 2, 3}) {
		t.Fatalf("sequences %v", seqs)
	}
	testserver.WaitFor(t, 10*time.Second, "the feed to reach 3", func() bool { return firstFeedMessage(t, w.admin, 0).HeadSequence == 3 })
	m := firstFeedMessage(t, w.admin, 1)
	if m.Snapshot || len(m.Tombstones) != 2 || m.Tombstones[0].Sequence != 2 || m.Tombstones[0].GrantId != w.gSibling.grant.GrantId || m.HeadSequence != 3 {
		t.Fatalf("resuming after 1: %v", m)
	}

	// A follower at 3 hears the next revocation live, heartbeats aside.
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	stream, err := w.child.c.Capability.WatchRevocations(sctx, connect.NewRequest(&tetherv1.WatchRevocationsRequest{AfterSequence: 3}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	if !stream.Receive() || len(stream.Msg().Tombstones) != 0 || stream.Msg().HeadSequence != 3 {
		t.Fatalf("first message at the head: %v %v", stream.Msg(), stream.Err())
	}
	if _, err := revokeGrant(w.grandparent.c, w.gChild.grant.GrantId); err != nil {
		t.Fatal(err)
	}
	for stream.Receive() {
		if msg := stream.Msg(); len(msg.Tombstones) > 0 {
			if msg.Tombstones[0].Sequence != 4 || msg.Tombstones[0].GrantId != w.gChild.grant.GrantId || msg.HeadSequence != 4 {
				t.Fatalf("live message %v", msg)
			}
			break
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}

	// Prune the first tombstone: a follower at 0 now gets a snapshot.
	// (Moving the clock also fires the background pruner's timer: between
	// it and this call, the first tombstone is pruned, and only it.)
	w.clk.Set(capability.DropAfter(epoch).Add(time.Second))
	if n, err := w.srv.Grants().PruneTombstones(ctx); err != nil || n > 1 {
		t.Fatalf("pruned %d (%v), want at most 1", n, err)
	}
	testserver.WaitFor(t, 10*time.Second, "a snapshot for a follower at 0", func() bool { return firstFeedMessage(t, w.admin, 0).Snapshot })
	m = firstFeedMessage(t, w.admin, 0)
	if len(m.Tombstones) != 3 || m.Tombstones[0].Sequence != 2 || m.HeadSequence != 4 {
		t.Fatalf("snapshot %v", m)
	}
	if g := getGrant(t, w.admin, w.gDescendant.grant.GrantId); g.State != tetherv1.GrantState_GRANT_STATE_REVOKED {
		t.Fatalf("the grant whose tombstone was pruned reads %v", g.State)
	}
}

func TestListGrants(t *testing.T) {
	w := newCapWorld(t)
	ids := func(c *testserver.Clients, req *tetherv1.ListGrantsRequest) []string {
		return grantIDs(allGrants(t, c, req))
	}
	under := sortedIDs(w.gParent.grant.GrantId, w.gChild.grant.GrantId, w.gSibling.grant.GrantId, w.gDescendant.grant.GrantId)
	for _, tc := range []struct {
		name string
		c    *testserver.Clients
		req  *tetherv1.ListGrantsRequest
		want []string
	}{
		{"what derives from the parent's grant", w.admin, &tetherv1.ListGrantsRequest{DerivedFromGrantId: w.gParent.grant.GrantId, PageSize: 2}, under},
		{"held in the parent's subtree", w.admin, &tetherv1.ListGrantsRequest{SubtreeNodeId: w.parent.id, PageSize: 3}, under},
		{"held by the child", w.admin, &tetherv1.ListGrantsRequest{HolderNodeId: w.child.id}, []string{w.gChild.grant.GrantId}},
		{"the child's own view", w.child.c, &tetherv1.ListGrantsRequest{}, sortedIDs(w.gChild.grant.GrantId, w.gDescendant.grant.GrantId)},
		{"everything, one at a time", w.admin, &tetherv1.ListGrantsRequest{PageSize: 1}, sortedIDs(append(under, w.gGrandparent.grant.GrantId, w.gUnrelated.grant.GrantId)...)},
	} {
		if got := ids(tc.c, tc.req); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// Acknowledged revocations survive kill -9 of the real server: after a
// restart every one of them is revoked, in the feed, refused by
// Introspect and by a fresh verifier.
func TestAcknowledgedRevocationsSurviveKill9(t *testing.T) {
	if testing.Short() {
		// By design: -short (make test-short) leaves out the slow subprocess and
		// browser tests; make test and CI run them.
		t.Skip("By design: -short skips the tests that run the real binary; make test and CI run them.")
	}
	dir := t.TempDir()
	proc := testserver.StartProcess(t, dir)
	admin := proc.Clients(proc.Admin)
	ctx := context.Background()
	rootNode, err := admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "root"}))
	if err != nil {
		t.Fatal(err)
	}
	rootAgent := proc.Clients(rootNode.Msg.Credential)
	childNode, err := rootAgent.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: rootNode.Msg.Node.NodeId, Name: "worker"}))
	if err != nil {
		t.Fatal(err)
	}
	top := issueRoot(t, admin, rootNode.Msg.Node.NodeId, time.Hour, "tool:*")
	const n = 48
	grants := make([]held, n)
	for i := range grants {
		grants[i] = delegate(t, rootAgent, top, childNode.Msg.Node.NodeId, "tool:shell")
	}

	var (
		mu    sync.Mutex
		acked = map[string]bool{}
		next  = make(chan held, n)
		wg    sync.WaitGroup
	)
	for _, g := range grants {
		next <- g
	}
	close(next)
	killAt := n / 2
	var once sync.Once
	for range 8 {
		wg.Go(func() {
			for g := range next {
				if _, err := revokeGrant(rootAgent, g.grant.GrantId); err != nil {
					return // the server is gone
				}
				mu.Lock()
				acked[g.grant.GrantId] = true
				count := len(acked)
				mu.Unlock()
				if count == killAt {
					once.Do(proc.Kill)
				}
			}
		})
	}
	wg.Wait()
	once.Do(proc.Kill) // in case every revocation was acknowledged first
	if len(acked) < killAt {
		t.Fatalf("only %d revocations were acknowledged", len(acked))
	}

	restarted := testserver.StartProcess(t, dir)
	admin = restarted.Clients(restarted.Admin)
	feed := map[string]bool{}
	stream, err := admin.Capability.WatchRevocations(ctx, connect.NewRequest(&tetherv1.WatchRevocationsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() {
		t.Fatal(stream.Err())
	}
	for _, ts := range stream.Msg().Tombstones {
		feed[ts.GrantId] = true
	}
	stream.Close()
	verifier := startVerifier(t, restarted.URL, restarted.Admin, clock.Real{})
	for _, g := range grants {
		if !acked[g.grant.GrantId] {
			continue
		}
		got := getGrant(t, admin, g.grant.GrantId)
		if got.State != tetherv1.GrantState_GRANT_STATE_REVOKED || !feed[g.grant.GrantId] {
			t.Errorf("acknowledged revocation of %s lost: state %v, in feed %v", g.grant.GrantId, got.State, feed[g.grant.GrantId])
		}
		if in := introspect(t, admin, g.token); in.Active {
			t.Errorf("introspect %s after the restart: active", g.grant.GrantId)
		}
		if _, err := verifier.Verify(ctx, g.token); !errors.Is(err, capability.ErrGrantRevoked) {
			t.Errorf("a fresh verifier on %s: %v", g.grant.GrantId, err)
		}
	}
	// The server goes on: the next revocation gets the next sequence.
	res, err := revokeGrant(admin, top.grant.GrantId)
	if err != nil {
		t.Fatal(err)
	}
	if res.Sequence != uint64(len(feed))+1 {
		t.Fatalf("the next revocation got sequence %d after %d tombstones", res.Sequence, len(feed))
	}
}

// TestAgentsSeeOnlyTheirLineagesRevocations: an agent's WatchRevocations
// carries the tombstones of grants held in its own tree, with an
// operator's reason only when the revoked grant's holder is the agent or
// one of its ancestors; operators see the whole feed, revoked tokens
// included.
func TestAgentsSeeOnlyTheirLineagesRevocations(t *testing.T) {
	srv := testserver.Start(t)
	ctx := context.Background()
	admin := srv.AdminClients()
	a := register(t, admin, "a")
	a1 := spawn(t, srv.Clients(a.Credential), a.Node.NodeId, "a1")
	a2 := spawn(t, srv.Clients(a1.Credential), a1.Node.NodeId, "a2")
	b := register(t, admin, "b")
	issue := func(holder string) string {
		resp, err := admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: holder, Scopes: []string{"tool:x"}, Ttl: durationpb.New(time.Hour)}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg.Grant.GrantId
	}
	revoke := func(grant, reason string) {
		if _, err := admin.Capability.Revoke(ctx, connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_GrantId{GrantId: grant}, Reason: reason})); err != nil {
			t.Fatal(err)
		}
	}
	ga1, gb := issue(a1.Node.NodeId), issue(b.Node.NodeId)
	revoke(ga1, "a1 exfiltrated data to host evil.example")
	revoke(gb, "b is being investigated")
	tok := createToken(t, admin, tetherv1.Role_ROLE_VIEWER, "leaked", time.Hour)
	revoked, err := admin.Auth.RevokeToken(ctx, connect.NewRequest(&tetherv1.RevokeTokenRequest{TokenId: tok.TokenId, Reason: "leaked in a ticket"}))
	if err != nil {
		t.Fatal(err)
	}

	// feed returns what a caller sees of the whole feed: grant → reason.
	// The feed publishes a tombstone once the store's watch delivers it,
	// a moment after the revocation's answer: it reads until the feed's
	// head has reached the last revocation.
	feed := func(token string) (map[string]string, uint64) {
		t.Helper()
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stream, err := srv.Clients(token).Capability.WatchRevocations(ctx, connect.NewRequest(&tetherv1.WatchRevocationsRequest{}))
		if err != nil {
			t.Fatalf("watch: %v", err)
		}
		seen := map[string]string{}
		for stream.Receive() {
			for _, ts := range stream.Msg().Tombstones {
				seen[ts.GrantId] = ts.Reason
			}
			if head := stream.Msg().HeadSequence; head >= revoked.Msg.Sequence {
				return seen, head
			}
		}
		t.Fatalf("watch ended before the feed reached sequence %d: %v", revoked.Msg.Sequence, stream.Err())
		return nil, 0
	}
	all, head := feed(srv.Admin)
	if len(all) != 3 || all[ga1] == "" || all[tok.TokenId] != "leaked in a ticket" {
		t.Fatalf("the operator's feed: %v", all)
	}
	for _, tc := range []struct {
		name, token string
		want        map[string]string
	}{
		// a2 is in the subtree of a1, whose grant was revoked: it sees why.
		{"a2, below the holder", a2.Credential, map[string]string{ga1: "a1 exfiltrated data to host evil.example"}},
		{"a1, the holder", a1.Credential, map[string]string{ga1: "a1 exfiltrated data to host evil.example"}},
		// a, the root, is of the lineage but outside the affected subtree.
		{"a, above the holder", a.Credential, map[string]string{ga1: ""}},
		{"b, another lineage", b.Credential, map[string]string{gb: "b is being investigated"}},
	} {
		got, gotHead := feed(tc.token)
		if !maps.Equal(got, tc.want) {
			t.Fatalf("%s sees %v, want %v", tc.name, got, tc.want)
		}
		if gotHead != head {
			t.Fatalf("%s: head %d, want the feed's %d", tc.name, gotHead, head)
		}
	}
}
