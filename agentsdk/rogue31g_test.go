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
