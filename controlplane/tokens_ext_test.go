package controlplane_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/controlplane/auth"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

func createToken(t *testing.T, c *testserver.Clients, role tetherv1.Role, subject string, ttl time.Duration) *tetherv1.CreateTokenResponse {
	t.Helper()
	req := &tetherv1.CreateTokenRequest{Role: role, Subject: subject}
	if ttl != 0 {
		req.Ttl = durationpb.New(ttl)
	}
	resp, err := c.Auth.CreateToken(context.Background(), connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg
}

func listTokens(t *testing.T, c *testserver.Clients, all bool) map[string]*tetherv1.TokenInfo {
	t.Helper()
	resp, err := c.Auth.ListTokens(context.Background(), connect.NewRequest(&tetherv1.ListTokensRequest{IncludeInactive: all}))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*tetherv1.TokenInfo{}
	for _, info := range resp.Msg.Tokens {
		out[info.TokenId] = info
	}
	return out
}

// TestMintedTokensExpireAndCanBeRevoked: every minted token has an id and
// an expiry, is listed without its secret, and a revocation stops it on
// the next call — cached or not, and across a restart — through a
// tombstone that outlives the feed's ordinary pruning until the token
// expires.
func TestMintedTokensExpireAndCanBeRevoked(t *testing.T) {
	clk := clock.NewManual(time.Now().UTC().Truncate(time.Second))
	srv := testserver.Start(t, testserver.WithClock(clk))
	ctx := context.Background()
	admin := srv.AdminClients()

	viewer := createToken(t, admin, tetherv1.Role_ROLE_VIEWER, "alice", 0)
	if want := clk.Now().Add(24 * time.Hour); !viewer.ExpiresAt.AsTime().Equal(want) || viewer.TokenId == "" {
		t.Fatalf("a token created without a ttl: id %q expires %s, want the default 24h (%s)", viewer.TokenId, viewer.ExpiresAt.AsTime(), want)
	}
	security := createToken(t, admin, tetherv1.Role_ROLE_SECURITY, "sec", time.Hour)
	alice := srv.Clients(viewer.Token)
	if err := whoAmI(alice); err != nil { // verified, and now cached
		t.Fatal(err)
	}

	// Listed, the bootstrap admin token too — never a secret.
	resp, err := admin.Auth.ListTokens(ctx, connect.NewRequest(&tetherv1.ListTokensRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := protojson.Marshal(resp.Msg)
	for _, secret := range []string{viewer.Token, security.Token, srv.Admin} {
		if strings.Contains(string(raw), secret) || strings.Contains(string(raw), strings.Split(secret, ".")[2]) {
			t.Fatal("ListTokens shows a token's secret")
		}
	}
	live := listTokens(t, admin, false)
	if info := live[viewer.TokenId]; info == nil || info.Principal != "operator:alice" || info.Role != tetherv1.Role_ROLE_VIEWER || info.CreatedBy != "operator:admin" || info.Kind != "operator" {
		t.Fatalf("the viewer's record: %v", info)
	}
	bootstrap := slices.IndexFunc(resp.Msg.Tokens, func(i *tetherv1.TokenInfo) bool { return i.CreatedBy == "bootstrap" && i.Principal == "operator:admin" })
	if bootstrap < 0 {
		t.Fatalf("the bootstrap admin token is not listed: %v", resp.Msg.Tokens)
	}

	// Revoked by a security operator: refused on the very next call.
	sec := srv.Clients(security.Token)
	revoked, err := sec.Auth.RevokeToken(ctx, connect.NewRequest(&tetherv1.RevokeTokenRequest{TokenId: viewer.TokenId, Reason: "laptop stolen"}))
	if err != nil {
		t.Fatal(err)
	}
	if revoked.Msg.AlreadyRevoked || revoked.Msg.Sequence == 0 || revoked.Msg.Token.RevokedBy != "operator:sec" {
		t.Fatalf("revocation: %v", revoked.Msg)
	}
	wantLimit(t, "the revoked token, cached before", whoAmI(alice), connect.CodeUnauthenticated, "revoked", viewer.TokenId)
	if _, ok := listTokens(t, admin, false)[viewer.TokenId]; ok {
		t.Fatal("a revoked token is listed as live")
	}
	if info := listTokens(t, admin, true)[viewer.TokenId]; info.GetRevokeReason() != "laptop stolen" || info.RevokedAt == nil {
		t.Fatalf("the revoked token's record: %v", info)
	}
	again, err := sec.Auth.RevokeToken(ctx, connect.NewRequest(&tetherv1.RevokeTokenRequest{TokenId: viewer.TokenId}))
	if err != nil || !again.Msg.AlreadyRevoked {
		t.Fatalf("revoking twice: %v, %v", again, err)
	}
	_, err = sec.Auth.RevokeToken(ctx, connect.NewRequest(&tetherv1.RevokeTokenRequest{TokenId: "never-minted"}))
	wantLimit(t, "an unknown token id", err, connect.CodeNotFound, "never-minted")

	// A token minted without a record (as an admin.token from before
	// records were kept) is revoked by value.
	old, _, _, err := srv.Issuer().MintOperator("legacy", auth.RoleAdmin, clk.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := whoAmI(srv.Clients(old)); err != nil {
		t.Fatal(err)
	}
	if _, err := sec.Auth.RevokeToken(ctx, connect.NewRequest(&tetherv1.RevokeTokenRequest{Token: old})); err != nil {
		t.Fatalf("revoking an unrecorded token by value: %v", err)
	}
	wantLimit(t, "the unrecorded token after its revocation", whoAmI(srv.Clients(old)), connect.CodeUnauthenticated, "revoked")

	// A grant revoked after the token: past the grant tombstone's drop
	// time, the pruner drops it and keeps the token's, which lives as long
	// as the token.
	root := register(t, admin, "root")
	grant, err := admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: root.Node.NodeId, Scopes: []string{"tool:x"}, Ttl: durationpb.New(time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Capability.Revoke(ctx, connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_GrantId{GrantId: grant.Msg.Grant.GrantId}})); err != nil {
		t.Fatal(err)
	}
	// The set learns a grant's revocation from the feed's store watch,
	// which on etcd delivers after the commit returns: wait for it, or the
	// wait for its pruning below would hold before the feed saw anything.
	testserver.WaitFor(t, 10*time.Second, "the feed to deliver the grant's tombstone", func() bool {
		_, ok := srv.Grants().Tombstones().Lookup(grant.Msg.Grant.GrantId)
		return ok
	})
	// (Moving the clock also fires the background pruner's timer: between
	// it and this call, the grant's one tombstone is pruned, and only it.)
	clk.Advance(capability.MaxTokenTTL + capability.MaxLeeway + time.Minute)
	if n, err := srv.Grants().PruneTombstones(ctx); err != nil || n > 1 {
		t.Fatalf("pruned %d tombstones (%v), want at most the grant's one", n, err)
	}
	testserver.WaitFor(t, 10*time.Second, "the feed to drop the grant's tombstone", func() bool {
		_, ok := srv.Grants().Tombstones().Lookup(grant.Msg.Grant.GrantId)
		return !ok
	})
	wantLimit(t, "the revoked token after pruning", whoAmI(alice), connect.CodeUnauthenticated, "revoked")
	// A follower starting from scratch gets it in its snapshot.
	watch, err := admin.Capability.WatchRevocations(ctx, connect.NewRequest(&tetherv1.WatchRevocationsRequest{}))
	if err != nil || !watch.Receive() {
		t.Fatalf("watch: %v %v", err, watch.Err())
	}
	if !slices.ContainsFunc(watch.Msg().Tombstones, func(ts *tetherv1.Tombstone) bool { return ts.GrantId == viewer.TokenId }) {
		t.Fatalf("the feed's first message lost the token's tombstone: %v (snapshot %v, head %d)", watch.Msg().Tombstones, watch.Msg().Snapshot, watch.Msg().HeadSequence)
	}
	_ = watch.Close()

	// Durable: after a restart the token is still refused, from the first
	// call on.
	dir := srv.DataDir
	srv.Stop()
	srv = testserver.StartIn(t, dir, testserver.WithClock(clk))
	wantLimit(t, "the revoked token after a restart", whoAmI(srv.Clients(viewer.Token)), connect.CodeUnauthenticated, "revoked")
	if err := whoAmI(srv.Clients(security.Token)); err != nil {
		t.Fatalf("an unrevoked token after the restart: %v", err)
	}

	// Expiry: the security token's hour runs out.
	clk.Advance(time.Hour + auth.Leeway)
	wantLimit(t, "an expired token", whoAmI(srv.Clients(security.Token)), connect.CodeUnauthenticated, "expired")
	if _, ok := listTokens(t, srv.AdminClients(), false)[security.TokenId]; ok {
		t.Fatal("an expired token is listed as live")
	}
	// Past the revoked token's own expiry, its tombstone goes too.
	clk.Advance(24 * time.Hour)
	if _, err := srv.Grants().PruneTombstones(ctx); err != nil {
		t.Fatal(err)
	}
	testserver.WaitFor(t, 10*time.Second, "the feed to drop the expired token's tombstone", func() bool {
		_, ok := srv.Grants().Tombstones().Lookup(viewer.TokenId)
		return !ok
	})
}

// TestRotateAdminToken: `tether token rotate-admin` against the real
// binary replaces admin.token and kills the old one, across a kill -9.
func TestRotateAdminToken(t *testing.T) {
	dir := t.TempDir()
	addr := testserver.FreeAddr(t)
	p := testserver.StartProcessOn(t, dir, addr)
	old := p.Admin
	if err := whoAmI(p.Clients(old)); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(testserver.Binary(t), "token", "rotate-admin", "--addr", p.URL, "--data-dir", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("rotate-admin: %v\n%s", err, out)
	}
	b, err := os.ReadFile(filepath.Join(dir, "admin.token"))
	if err != nil {
		t.Fatal(err)
	}
	fresh := strings.TrimSpace(string(b))
	if fresh == old || !strings.Contains(string(out), "revoked") {
		t.Fatalf("admin.token unchanged or no revocation reported:\n%s", out)
	}
	if info, err := os.Stat(filepath.Join(dir, "admin.token")); err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("admin.token mode: %v %v", info.Mode(), err)
	}
	wantLimit(t, "the old admin token", whoAmI(p.Clients(old)), connect.CodeUnauthenticated, "revoked")
	if err := whoAmI(p.Clients(fresh)); err != nil {
		t.Fatalf("the new admin token: %v", err)
	}
	p.Kill()
	p = testserver.StartProcessOn(t, dir, addr)
	if p.Admin != fresh {
		t.Fatal("the restarted server replaced the rotated admin.token")
	}
	wantLimit(t, "the old admin token after kill -9", whoAmI(p.Clients(old)), connect.CodeUnauthenticated, "revoked")
	if err := whoAmI(p.Clients(fresh)); err != nil {
		t.Fatalf("the new admin token after kill -9: %v", err)
	}
}
