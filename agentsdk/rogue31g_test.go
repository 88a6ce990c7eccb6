package agentsdk

import (
	"context"
	"crypto/ed25519"
	"errors"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// forgedKidToken is a token naming a kid the control plane never
// published, signed by a key of the rogue's own.
func forgedKidToken(t *testing.T) string {
	t.Helper()
	_, stranger, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	forged := jwt.NewWithClaims(jwt.SigningMethodEdDSA, jwt.MapClaims{"iss": "tether", "aud": Audience, "sub": "n_child", "jti": "g_child", "exp": t0.Add(time.Minute).Unix()})
	forged.Header["kid"] = "made-up"
	token, err := forged.SignedString(stranger)
	if err != nil {
		t.Fatal(err)
	}
	return token
}

// A rogue presenting a token with a made-up kid, on a request it has
// already abandoned (an HTTP/2 stream reset right after its headers: the
// tool server's Verify gets a cancelled context), spent the verifier's
// on-demand key-set fetch: the fetch failed at once with the caller's
// cancellation, but counted against JWKSMinInterval, so the honest agents'
// tokens signed by a key just rotated in were refused as unknown for the
// interval, and again after each such request, until the scheduled refetch
// (every five minutes; a rotation publishes its key five minutes ahead by
// default, and an emergency one none). The fetch no longer follows the
// caller's cancellation: it is bounded by JWKSFetchTimeout alone.
func TestRogue31GAnAbandonedCheckOfAForgedKidDoesNotSpendTheKeySetFetch(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewManual(t0)
	ring := newRing(t)
	keys := newKeyServer(t, ring)
	v := newTestVerifier(t, keys, clk)
	if err := v.jwks.refresh(ctx); err != nil { // what Run does first
		t.Fatal(err)
	}
	apply(t, v, &tetherv1.WatchRevocationsResponse{})
	_, child := grantLine(t, "g_root", "g_child")

	// The control plane rotates with no publication ahead.
	rotated, _, err := ring.Rotate(nil, clk.Now(), 0, capability.MaxTokenTTL)
	if err != nil {
		t.Fatal(err)
	}
	keys.serve(rotated)

	abandoned, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := v.Verify(abandoned, forgedKidToken(t)); !errors.Is(err, capability.ErrUnknownKey) {
		t.Fatalf("the rogue's forged kid: %v, want unknown key", err)
	}
	honest := mint(t, rotated, child, clk.Now())
	if _, err := v.Verify(ctx, honest); err != nil {
		t.Fatalf("an honest token signed by the key rotated in, after the rogue's abandoned check: %v", err)
	}
}

// A rogue mints itself a distinct token every second (RefreshToken; the
// same second gives the same token) and presents each once to a tool
// server: the verifier cached every one until the cache was full, each
// entry up to a token's 8 KiB with its claims, and every other caller's
// token, no longer cached, paid its signature check on every call. One
// holder now keeps at most MaxCachedTokensPerHolder entries, its next
// replacing its oldest.
func TestRogue31GARogueMintingTokensCannotFillTheVerifiersCache(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewManual(t0.Add(time.Minute))
	ring := newRing(t)
	keys := newKeyServer(t, ring)
	v, err := NewVerifier(VerifierConfig{Conn: Dial(keys.url, "", WithHTTPClient(keys.client)), Clock: clk, CacheSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	if err := v.jwks.refresh(ctx); err != nil {
		t.Fatal(err)
	}
	apply(t, v, &tetherv1.WatchRevocationsResponse{})
	_, rogue := grantLine(t, "g_root", "g_rogue")
	for i := range 40 {
		if _, err := v.Verify(ctx, mint(t, ring, rogue, t0.Add(time.Duration(i)*time.Second))); err != nil {
			t.Fatalf("the rogue's token %d: %v", i, err)
		}
	}
	if n := v.cache.Len(); n != MaxCachedTokensPerHolder {
		t.Fatalf("%d cache entries of one holder, want %d", n, MaxCachedTokensPerHolder)
	}
	honest, err := capability.Delegate(rogue, capability.DelegateRequest{GrantID: "g_honest", Issuer: "agent:n_child", HolderNodeID: "n_honest", Scopes: []string{"tool:shell"}}, []string{"n_root", "n_child"}, t0)
	if err != nil {
		t.Fatal(err)
	}
	token := mint(t, ring, honest, t0)
	if _, err := v.Verify(ctx, token); err != nil {
		t.Fatal(err)
	}
	if !CachedToken(v, token) {
		t.Fatal("an honest caller's token is not cached after the rogue's")
	}
	// The newest of the rogue's are the ones kept, and expiry still drops
	// an entry (and its place in the holder's list).
	last := mint(t, ring, rogue, t0.Add(39*time.Second))
	if !CachedToken(v, last) {
		t.Fatal("the rogue's newest token is not the one cached")
	}
	clk.Set(t0.Add(39*time.Second + capability.DefaultTokenTTL))
	apply(t, v, &tetherv1.WatchRevocationsResponse{})
	if _, err := v.Verify(ctx, last); !errors.Is(err, capability.ErrTokenExpired) {
		t.Fatalf("an expired cached token: %v", err)
	}
	v.cacheMu.RLock()
	held := v.cache.Held("n_child")
	v.cacheMu.RUnlock()
	if held != MaxCachedTokensPerHolder-1 {
		t.Fatalf("the holder lists %d cached tokens after one expired, want %d", held, MaxCachedTokensPerHolder-1)
	}
}
