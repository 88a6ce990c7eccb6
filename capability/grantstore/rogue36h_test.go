package grantstore

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tetherhq/tether/capability"
)

// issueToken issues a root grant of tool:* to holder and returns its token.
func (w *world) issueToken(holder string, ttl time.Duration) (capability.Grant, string) {
	w.t.Helper()
	issued, err := w.svc.IssueRoot(context.Background(), operator, RootRequest{HolderNodeID: holder, Scopes: []string{"tool:*"}, TTL: ttl})
	if err != nil {
		w.t.Fatal(err)
	}
	return issued.Grant, issued.Token
}

// sameAsVerifier checks the service's answer for token at the world's
// time against a verification of its own (no cache): the holder, the
// grant and the error's kind agree.
func (w *world) sameAsVerifier(token, what string) error {
	w.t.Helper()
	node, grant, err := w.svc.CheckToken(context.Background(), token, "tool:shell")
	claims, verr := w.svc.verifier.Verify(token, w.ring, w.clk.Now())
	switch {
	case verr != nil:
		for _, kind := range []error{capability.ErrTokenExpired, capability.ErrTokenNotYetValid, capability.ErrUnknownKey, capability.ErrTokenSignature, capability.ErrTokenMalformed, capability.ErrTokenClaims} {
			if err == nil || errors.Is(err, kind) != errors.Is(verr, kind) {
				w.t.Fatalf("%s: the service answered %s %s %v where a verification refuses: %v", what, node, grant, err, verr)
			}
		}
	case err != nil && !errors.Is(err, capability.ErrGrantRevoked):
		w.t.Fatalf("%s: the service refused (%v) a token that verifies", what, err)
	case err == nil && (node != claims.HolderNodeID || grant != claims.GrantID):
		w.t.Fatalf("%s: the service answered %s %s, the token holds %s %s", what, node, grant, claims.HolderNodeID, claims.GrantID)
	}
	return err
}

// TestRogue36HAGrantTokenPresentedAgainIsVerifiedOnce: a gate presents
// an agent's token on every tool call; its signature is verified at the
// first and not again (each BeginCall paid an Ed25519 verification,
// about 75 µs of a tool call's CPU), while every answer stays the
// verifier's: the expiry (and its leeway), a clock set back before the
// token's not-before, a key dropped from the ring and a revoked grant
// each refuse the cached token at once.
func TestRogue36HAGrantTokenPresentedAgainIsVerifiedOnce(t *testing.T) {
	w := newWorld(t, 0)
	nodes := w.chainOfNodes(2)
	ttl := 10 * time.Minute
	g, token := w.issueToken(nodes[1], ttl)
	issuedAt := w.clk.Now()
	for i := range 5 {
		if err := w.sameAsVerifier(token, fmt.Sprint("call ", i)); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if hits, misses := w.svc.verified.hits.Load(), w.svc.verified.misses.Load(); misses != 1 || hits != 4 {
		t.Fatalf("5 calls with one token: %d verifications, %d answered from what the first proved; want 1 and 4", misses, hits)
	}

	// Around the expiry, and back before the token's not-before.
	exp := issuedAt.Add(ttl).Truncate(time.Second)
	for _, at := range []time.Time{
		exp.Add(-time.Second), exp.Add(-time.Nanosecond), exp, exp.Add(capability.DefaultLeeway - time.Second),
		issuedAt.Add(-capability.DefaultLeeway - time.Second), issuedAt, exp.Add(capability.DefaultLeeway + time.Second),
	} {
		w.clk.Set(at)
		_ = w.sameAsVerifier(token, fmt.Sprint("at ", at.Sub(issuedAt)))
	}
	w.clk.Set(exp.Add(capability.DefaultLeeway + time.Second))
	if _, _, err := w.svc.CheckToken(context.Background(), token, "tool:shell"); !errors.Is(err, capability.ErrTokenExpired) {
		t.Fatalf("past its expiry and the leeway the cached token answered %v, want %v", err, capability.ErrTokenExpired)
	}
	w.clk.Set(issuedAt.Add(-capability.DefaultLeeway - time.Second))
	if _, _, err := w.svc.CheckToken(context.Background(), token, "tool:shell"); !errors.Is(err, capability.ErrTokenNotYetValid) {
		t.Fatalf("before its not-before the cached token answered %v, want %v", err, capability.ErrTokenNotYetValid)
	}
	w.clk.Set(issuedAt.Add(time.Minute))

	// The key dropped from the ring (and another under its kid).
	if err := w.sameAsVerifier(token, "back in its life"); err != nil {
		t.Fatal(err)
	}
	kept := w.ring
	other, err := capability.NewSigningKey(nil, epoch, epoch)
	if err != nil {
		t.Fatal(err)
	}
	w.ring = capability.KeyRing{Keys: []capability.SigningKey{other}}
	if _, _, err := w.svc.CheckToken(context.Background(), token, "tool:shell"); !errors.Is(err, capability.ErrUnknownKey) {
		t.Fatalf("with its key dropped from the ring the cached token answered %v, want %v", err, capability.ErrUnknownKey)
	}
	other.ID = kept.Keys[0].ID
	w.ring = capability.KeyRing{Keys: []capability.SigningKey{other}}
	if _, _, err := w.svc.CheckToken(context.Background(), token, "tool:shell"); !errors.Is(err, capability.ErrTokenSignature) {
		t.Fatalf("with another key under its kid the cached token answered %v, want %v", err, capability.ErrTokenSignature)
	}
	w.ring = kept
	if err := w.sameAsVerifier(token, "its key back"); err != nil {
		t.Fatal(err)
	}

	// Revoked: the store is read on every call.
	w.revoke(security, g.GrantID)
	if _, _, err := w.svc.CheckToken(context.Background(), token, "tool:shell"); !errors.Is(err, capability.ErrGrantRevoked) {
		t.Fatalf("the cached token of a revoked grant answered %v, want %v", err, capability.ErrGrantRevoked)
	}
}

// TestRogue36HARogueMintingTokensPushesOutOnlyItsOwn: a rogue that has
// fresh grants issued to itself and presents each once fills its own
// share of the cache, not others': an honest agent's token stays
// answered without a verification, and a flood of tokens that do not
// verify keeps nothing.
func TestRogue36HARogueMintingTokensPushesOutOnlyItsOwn(t *testing.T) {
	w := newWorld(t, 0)
	nodes := w.chainOfNodes(3)
	_, honest := w.issueToken(nodes[1], time.Hour)
	if _, _, err := w.svc.CheckToken(context.Background(), honest, "tool:shell"); err != nil {
		t.Fatal(err)
	}
	for i := range 3 * maxVerifiedPerHolder {
		_, token := w.issueToken(nodes[2], time.Hour)
		if _, _, err := w.svc.CheckToken(context.Background(), token, "tool:shell"); err != nil {
			t.Fatalf("rogue token %d: %v", i, err)
		}
		bad := token[:len(token)-4] + "AAAA"
		if _, _, err := w.svc.CheckToken(context.Background(), bad, "tool:shell"); err == nil {
			t.Fatalf("rogue token %d with its signature changed was accepted", i)
		}
	}
	w.svc.verified.mu.Lock()
	size, rogue := w.svc.verified.entries.Len(), w.svc.verified.entries.Held(nodes[2])
	w.svc.verified.mu.Unlock()
	if rogue != maxVerifiedPerHolder || size != maxVerifiedPerHolder+1 {
		t.Fatalf("the cache holds %d tokens, %d of them the rogue's; want %d and %d", size, rogue, maxVerifiedPerHolder+1, maxVerifiedPerHolder)
	}
	hits := w.svc.verified.hits.Load()
	if _, _, err := w.svc.CheckToken(context.Background(), honest, "tool:shell"); err != nil {
		t.Fatal(err)
	}
	if w.svc.verified.hits.Load() != hits+1 {
		t.Fatal("the honest agent's token was verified again after the rogue's flood")
	}
}
