package controlplane_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/tetherhq/tether/controlplane/auth"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The server answers a bearer token it verified before from its cache of
// verified tokens (auth.TokenCache) instead of checking the Ed25519
// signature on every call; issue 21's pass on the unary renew measured it
// at 2.5 µs a call (SHA-256 and a map lookup, of about 9.5 µs of
// authentication). These tests hold the cache to what design §8 promises:
// a token served from it is still refused at once once it is revoked,
// expired or its node terminated, and a token whose claims match a cached
// one but whose signature is not the server's is verified, and refused.

// getNodeTwice makes one call that verifies token and one answered from
// the cache, and fails the test unless both succeed.
func getNodeTwice(t *testing.T, c *testserver.Clients, nodeID string) {
	t.Helper()
	for i := range 2 {
		if _, err := c.Agent.GetNode(context.Background(), connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: nodeID})); err != nil {
			t.Fatalf("call %d before the token is spoiled: %v", i+1, err)
		}
	}
}

func wantUnauthenticated(t *testing.T, c *testserver.Clients, nodeID, what string) {
	t.Helper()
	_, err := c.Agent.GetNode(context.Background(), connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: nodeID}))
	if connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("%s: got %v, want unauthenticated", what, err)
	}
}

func TestRogue24ScaleACachedTokenOfATerminatedNodeIsRefusedAtOnce(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	a := register(t, admin, "a")
	c := srv.Clients(a.Credential)
	getNodeTwice(t, c, a.Node.NodeId)
	// Aborted, its exit confirmed, the termination over: the node is
	// terminated (while it stops, it may still answer its cancellations).
	stopChild(t, srv, admin, a.Node.NodeId)
	// The very next call, with the token the cache holds: no wait.
	wantUnauthenticated(t, c, a.Node.NodeId, "the cached token of a terminated node")
}

func TestRogue24ScaleACachedTokenIsRefusedAtOnceWhenRevoked(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	a := register(t, admin, "a")
	viewer := createToken(t, admin, tetherv1.Role_ROLE_VIEWER, "laptop", time.Hour)
	c := srv.Clients(viewer.Token)
	getNodeTwice(t, c, a.Node.NodeId)
	if _, err := admin.Auth.RevokeToken(context.Background(), connect.NewRequest(&tetherv1.RevokeTokenRequest{TokenId: viewer.TokenId, Reason: "laptop stolen"})); err != nil {
		t.Fatal(err)
	}
	wantUnauthenticated(t, c, a.Node.NodeId, "a cached token revoked")
}

func TestRogue24ScaleACachedTokenIsRefusedOnceExpired(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	a := register(t, admin, "a")
	viewer := createToken(t, admin, tetherv1.Role_ROLE_VIEWER, "short", 2*time.Minute)
	c := srv.Clients(viewer.Token)
	getNodeTwice(t, c, a.Node.NodeId)
	clk.Advance(2*time.Minute + auth.Leeway)
	wantUnauthenticated(t, c, a.Node.NodeId, "a cached token past its expiry and the leeway")
}

func TestRogue24ScaleAForgedSignatureOnACachedTokensClaimsIsRefused(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	a := register(t, admin, "a")
	genuine := srv.Clients(a.Credential)
	getNodeTwice(t, genuine, a.Node.NodeId)

	parts := strings.Split(a.Credential, ".")
	if len(parts) != 3 {
		t.Fatalf("the credential is not a JWS in compact form: %d parts", len(parts))
	}
	signed := parts[0] + "." + parts[1]
	_, rogueKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sig, _ := base64.RawURLEncoding.DecodeString(parts[2])
	for name, forged := range map[string]string{
		"the same claims signed with the rogue's own key":   signed + "." + base64.RawURLEncoding.EncodeToString(ed25519.Sign(rogueKey, []byte(signed))),
		"the same claims with a zeroed signature":           signed + "." + base64.RawURLEncoding.EncodeToString(make([]byte, len(sig))),
		"the same claims with the signature's last bit off": signed + "." + base64.RawURLEncoding.EncodeToString(append(sig[:len(sig)-1:len(sig)-1], sig[len(sig)-1]^1)),
		"the same claims with no signature":                 signed + ".",
	} {
		wantUnauthenticated(t, srv.Clients(forged), a.Node.NodeId, name)
	}
	// The genuine token, cached, still works: a forgery neither poisons nor
	// evicts it.
	getNodeTwice(t, genuine, a.Node.NodeId)
}
