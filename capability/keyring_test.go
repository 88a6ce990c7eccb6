package capability_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tetherhq/tether/capability"
)

func seededKey(t *testing.T, seed byte, activeFrom time.Time) capability.SigningKey {
	t.Helper()
	k, err := capability.NewSigningKey(bytes.NewReader(bytes.Repeat([]byte{seed}, 32)), t0, activeFrom)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestNewSigningKey(t *testing.T) {
	a, b := seededKey(t, 1, t0), seededKey(t, 1, t0)
	if a.ID != b.ID || !a.Public.Equal(b.Public) {
		t.Fatal("the same seed gave different keys")
	}
	sum := sha256.Sum256(a.Public)
	if a.ID != base64.RawURLEncoding.EncodeToString(sum[:12]) {
		t.Fatalf("kid %q is not derived from the public key", a.ID)
	}
	if c := seededKey(t, 2, t0); c.ID == a.ID {
		t.Fatal("different seeds gave the same kid")
	}
	if _, err := capability.NewSigningKey(bytes.NewReader(nil), t0, t0); err == nil {
		t.Fatal("an exhausted random source was accepted")
	}
}

func TestKeyRingSignerPicksNewestActiveKey(t *testing.T) {
	old := seededKey(t, 1, t0)
	current := seededKey(t, 2, t0.Add(time.Hour))
	future := seededKey(t, 3, t0.Add(2*time.Hour))
	publicOnly := seededKey(t, 4, t0.Add(90*time.Minute))
	publicOnly.Private = nil
	ring := capability.KeyRing{Keys: []capability.SigningKey{future, old, publicOnly, current}}

	for _, tt := range []struct {
		at   time.Time
		want string
	}{
		{t0, old.ID},
		{t0.Add(time.Hour), current.ID},
		{t0.Add(100 * time.Minute), current.ID}, // the newer key has no private half
		{t0.Add(2 * time.Hour), future.ID},
	} {
		k, err := ring.Signer(tt.at)
		if err != nil || k.ID != tt.want {
			t.Errorf("Signer(t0+%v) = %q, %v; want %q", tt.at.Sub(t0), k.ID, err, tt.want)
		}
	}
	if _, err := ring.Signer(t0.Add(-time.Second)); !errors.Is(err, capability.ErrUnknownKey) {
		t.Fatalf("no key active yet: err = %v", err)
	}
	if _, err := (capability.KeyRing{}).Signer(t0); !errors.Is(err, capability.ErrUnknownKey) {
		t.Fatalf("empty ring: err = %v", err)
	}
	if _, err := ring.Public("nope"); !errors.Is(err, capability.ErrUnknownKey) {
		t.Fatalf("Public(unknown) err = %v", err)
	}
	if pub, err := ring.Public(publicOnly.ID); err != nil || !pub.Equal(publicOnly.Public) {
		t.Fatalf("Public(%s) = %v", publicOnly.ID, err)
	}
}

// TestKeyRingRotation follows one rotation through: the new key signs, the
// old key keeps verifying its tokens until they have all expired, and only
// then is it pruned.
func TestKeyRingRotation(t *testing.T) {
	tr := newGrantTree(t)
	m, v := newMinter(t), newVerifier(t)
	ring := capability.KeyRing{Keys: []capability.SigningKey{seededKey(t, 1, t0)}}
	oldToken, oldExp, err := m.Mint(ring, tr.root, t0, capability.MaxTokenTTL)
	if err != nil {
		t.Fatal(err)
	}

	rotatedAt := t0.Add(time.Minute)
	ring, next, err := ring.Rotate(nil, rotatedAt, 0, capability.MaxTokenTTL)
	if err != nil {
		t.Fatal(err)
	}
	if len(ring.Keys) != 2 || !ring.Keys[0].RetireAfter.Equal(rotatedAt.Add(capability.MaxTokenTTL)) {
		t.Fatalf("after Rotate: %+v", ring.Keys)
	}
	if k := signer(t, ring, rotatedAt); k.ID != next.ID {
		t.Fatalf("signer after rotation = %s, want the new key %s", k.ID, next.ID)
	}
	newToken, _, err := m.Mint(ring, tr.root, rotatedAt, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Verify(oldToken, ring, oldExp.Add(-time.Second)); err != nil {
		t.Fatalf("old token after rotation: %v", err)
	}

	retire := ring.Keys[0].RetireAfter
	if !oldExp.After(rotatedAt) || oldExp.After(retire) {
		t.Fatalf("the old key's last token expires at %v, after it retires at %v", oldExp, retire)
	}
	if got := ring.Prune(retire); len(got.Keys) != 2 {
		t.Fatal("Prune dropped a key at its RetireAfter")
	}
	ring = ring.Prune(retire.Add(time.Nanosecond))
	if len(ring.Keys) != 1 || ring.Keys[0].ID != next.ID {
		t.Fatalf("after Prune: %+v", ring.Keys)
	}
	if _, err := v.Verify(oldToken, ring, retire.Add(time.Nanosecond)); !errors.Is(err, capability.ErrUnknownKey) {
		t.Fatalf("old token after its key was pruned: err = %v", err)
	}
	if _, err := v.Verify(newToken, ring, rotatedAt); err != nil {
		t.Fatalf("new token: %v", err)
	}
}

func TestKeyRingRotationPublishesAhead(t *testing.T) {
	ring := capability.KeyRing{Keys: []capability.SigningKey{seededKey(t, 1, t0)}}
	ring, next, err := ring.Rotate(nil, t0, 5*time.Minute, capability.MaxTokenTTL)
	if err != nil {
		t.Fatal(err)
	}
	jwks, err := ring.JWKS()
	if err != nil {
		t.Fatal(err)
	}
	public, err := capability.ParseJWKS(jwks)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := public.Public(next.ID); err != nil {
		t.Fatalf("the next key is not in JWKS before it signs: %v", err)
	}
	if k := signer(t, ring, t0.Add(5*time.Minute)); k.ID != next.ID {
		t.Fatalf("signer at activation = %s, want %s", k.ID, next.ID)
	}
}

func TestJWKS(t *testing.T) {
	a, b := seededKey(t, 1, t0), seededKey(t, 2, t0)
	ring := capability.KeyRing{Keys: []capability.SigningKey{a, b}}
	data, err := ring.JWKS()
	if err != nil {
		t.Fatal(err)
	}
	var set struct {
		Keys []map[string]string `json:"keys"`
	}
	if err := json.Unmarshal(data, &set); err != nil {
		t.Fatal(err)
	}
	if len(set.Keys) != 2 || set.Keys[0]["kid"] > set.Keys[1]["kid"] {
		t.Fatalf("JWKS keys not sorted by kid: %s", data)
	}
	for _, k := range set.Keys {
		if k["kty"] != "OKP" || k["crv"] != "Ed25519" || k["alg"] != "EdDSA" || k["use"] != "sig" {
			t.Fatalf("JWK %v", k)
		}
		if _, ok := k["d"]; ok {
			t.Fatal("JWKS carries private key material")
		}
	}
	for _, k := range ring.Keys {
		if bytes.Contains(data, []byte(base64.RawURLEncoding.EncodeToString(k.Private.Seed()))) {
			t.Fatal("JWKS carries a private seed")
		}
	}
	parsed, err := capability.ParseJWKS(data)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range ring.Keys {
		pub, err := parsed.Public(k.ID)
		if err != nil || !pub.Equal(k.Public) {
			t.Fatalf("key %s did not round-trip: %v", k.ID, err)
		}
	}
	if _, err := parsed.Signer(t0); !errors.Is(err, capability.ErrUnknownKey) {
		t.Fatal("a ring parsed from JWKS can sign")
	}
}

func TestParseJWKSRefusesMalformedKeys(t *testing.T) {
	for name, doc := range map[string]string{
		"not JSON":      `{"keys":`,
		"short x":       `{"keys":[{"kty":"OKP","crv":"Ed25519","kid":"k1","x":"AAAA"}]}`,
		"x not base64":  `{"keys":[{"kty":"OKP","crv":"Ed25519","kid":"k1","x":"!!!"}]}`,
		"kid missing":   `{"keys":[{"kty":"OKP","crv":"Ed25519","x":"` + strings.Repeat("A", 43) + `"}]}`,
		"keys not list": `{"keys":{}}`,
	} {
		if _, err := capability.ParseJWKS([]byte(doc)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	ring, err := capability.ParseJWKS([]byte(`{"keys":[{"kty":"RSA","kid":"r1","n":"x","e":"AQAB"}]}`))
	if err != nil || len(ring.Keys) != 0 {
		t.Fatalf("a non-Ed25519 key must be skipped: %v, %+v", err, ring.Keys)
	}
}
