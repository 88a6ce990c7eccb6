package auth

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetherhq/tether/capability"
)

// cacheFixture is an issuer whose key ring a test can change.
type cacheFixture struct {
	issuer Issuer
	ring   atomic.Pointer[capability.KeyRing]
}

func newCacheFixture(t *testing.T) *cacheFixture {
	t.Helper()
	key, err := capability.NewSigningKey(bytes.NewReader(bytes.Repeat([]byte{7}, 32)), fuzzT0, fuzzT0)
	if err != nil {
		t.Fatal(err)
	}
	fx := &cacheFixture{}
	fx.ring.Store(&capability.KeyRing{Keys: []capability.SigningKey{key}})
	fx.issuer = Issuer{Name: "tether", Ring: func() capability.KeyRing { return *fx.ring.Load() }}
	return fx
}

func TestTokenCacheVerifiesOnceAndRechecksWhatCanChange(t *testing.T) {
	fx := newCacheFixture(t)
	token, exp, err := fx.issuer.MintAgent("n_agent", fuzzT0, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cache := NewTokenCache(0)
	now := fuzzT0.Add(time.Minute)
	for range 5 {
		p, err := cache.Parse(fx.issuer, token, now)
		if err != nil || p.Subject != "n_agent" || p.Kind != KindAgent || !p.ExpiresAt.Equal(exp) {
			t.Fatalf("cached parse: %+v, %v", p, err)
		}
	}
	if st := cache.Stats(); st.Misses != 1 || st.Hits != 4 || st.Size != 1 {
		t.Fatalf("after five calls with one token: %+v, want one verification and four hits", st)
	}

	// The same token with one byte changed is another token: verified, and
	// refused.
	tampered := []byte(token)
	tampered[len(tampered)-3] ^= 1
	if _, err := cache.Parse(fx.issuer, string(tampered), now); !errors.Is(err, ErrBadCredential) {
		t.Fatalf("tampered token: got %v, want ErrBadCredential", err)
	}

	// Expiry is checked on every hit, with the parser's leeway.
	if _, err := cache.Parse(fx.issuer, token, exp.Add(Leeway-time.Second)); err != nil {
		t.Fatalf("within the leeway: %v", err)
	}
	if _, err := cache.Parse(fx.issuer, token, exp.Add(Leeway)); !errors.Is(err, ErrBadCredential) {
		t.Fatalf("expired token served from the cache: %v", err)
	}
	// Expired tokens leave the cache.
	if st := cache.Stats(); st.Size != 0 {
		t.Fatalf("an expired token stayed cached: %+v", st)
	}

	// A clock that went back before the verification verifies again: the
	// token is not yet valid then, and the cache must not say otherwise.
	early, _, err := fx.issuer.MintAgent("n_early", fuzzT0.Add(time.Hour), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cache.Parse(fx.issuer, early, fuzzT0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := cache.Parse(fx.issuer, early, fuzzT0); !errors.Is(err, ErrBadCredential) {
		t.Fatalf("a token issued in the future of the clock was served from the cache: %v", err)
	}
}

func TestTokenCacheDropsTokensOfAKeyLeavingTheRing(t *testing.T) {
	fx := newCacheFixture(t)
	token, _, _, err := fx.issuer.MintOperator("ops", RoleOperator, fuzzT0, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cache := NewTokenCache(0)
	now := fuzzT0.Add(time.Minute)
	if _, err := cache.Parse(fx.issuer, token, now); err != nil {
		t.Fatal(err)
	}
	// Rotate, then prune the old key away: its tokens must stop working
	// at once, cached or not.
	old := *fx.ring.Load()
	rotated, _, err := old.Rotate(rand.Reader, now, 0, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	fx.ring.Store(&capability.KeyRing{Keys: rotated.Keys[1:]})
	if _, err := cache.Parse(fx.issuer, token, now); !errors.Is(err, ErrBadCredential) {
		t.Fatalf("a token of a key no longer in the ring: got %v, want ErrBadCredential", err)
	}
	// A key id reused for another key does not vouch for old tokens.
	impostor := rotated.Keys[1]
	impostor.ID = old.Keys[0].ID
	fx.ring.Store(&capability.KeyRing{Keys: []capability.SigningKey{impostor}})
	if _, err := cache.Parse(fx.issuer, token, now); !errors.Is(err, ErrBadCredential) {
		t.Fatalf("a token verified by a different key of the same id: got %v, want ErrBadCredential", err)
	}
}

func TestTokenCacheStaysBounded(t *testing.T) {
	fx := newCacheFixture(t)
	cache := NewTokenCache(8)
	now := fuzzT0.Add(time.Minute)
	var tokens []string
	for i := range 50 {
		token, _, err := fx.issuer.MintAgent("n_"+string(rune('a'+i%26))+string(rune('a'+i/26)), fuzzT0, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, token)
		if _, err := cache.Parse(fx.issuer, token, now); err != nil {
			t.Fatal(err)
		}
		if st := cache.Stats(); st.Size > 8 {
			t.Fatalf("after %d tokens the cache holds %d, more than its bound 8", i+1, st.Size)
		}
	}
	// Evicted tokens still verify; they are simply verified again.
	for _, token := range tokens {
		if _, err := cache.Parse(fx.issuer, token, now); err != nil {
			t.Fatal(err)
		}
	}
	// A nil cache verifies every time.
	var none *TokenCache
	if _, err := none.Parse(fx.issuer, tokens[0], now); err != nil {
		t.Fatal(err)
	}
	if _, err := none.Parse(fx.issuer, "", now); !errors.Is(err, ErrNoCredential) {
		t.Fatalf("empty token: %v", err)
	}
}

// TestRogue30GAgentMintingCredentialsCannotEvictOthersFromTheCache: an
// agent may mint itself a fresh credential on every Heartbeat late in its
// credential's life, and one that used each once filled the cache with
// its own, evicting other callers' entries, each of whose next call paid a
// verification again. A principal now holds at most
// MaxCachedTokensPerPrincipal entries, its next replacing its oldest.
func TestRogue30GAgentMintingCredentialsCannotEvictOthersFromTheCache(t *testing.T) {
	fx := newCacheFixture(t)
	cache := NewTokenCache(64)
	now := fuzzT0.Add(time.Hour) // after every token's issue, before its expiry
	var honest []string
	for i := range 16 {
		tok, _, err := fx.issuer.MintAgent(fmt.Sprintf("n_honest%d", i), fuzzT0, 2*time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cache.Parse(fx.issuer, tok, now); err != nil {
			t.Fatal(err)
		}
		honest = append(honest, tok)
	}
	var rogue []string
	for i := range 1000 {
		tok, _, err := fx.issuer.MintAgent("n_rogue", fuzzT0.Add(time.Duration(i)*time.Second), 2*time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cache.Parse(fx.issuer, tok, now); err != nil {
			t.Fatal(err)
		}
		rogue = append(rogue, tok)
	}
	before := cache.Stats()
	for _, tok := range honest {
		if _, err := cache.Parse(fx.issuer, tok, now); err != nil {
			t.Fatal(err)
		}
	}
	if st := cache.Stats(); st.Misses != before.Misses {
		t.Errorf("%d of 16 honest agents' tokens were evicted by a rogue's 1,000 fresh credentials", st.Misses-before.Misses)
	}
	// The rogue's last tokens are cached, its earlier ones not.
	before = cache.Stats()
	for _, tok := range rogue[len(rogue)-MaxCachedTokensPerPrincipal:] {
		if _, err := cache.Parse(fx.issuer, tok, now); err != nil {
			t.Fatal(err)
		}
	}
	if st := cache.Stats(); st.Misses != before.Misses || st.Size > 16+MaxCachedTokensPerPrincipal {
		t.Errorf("the rogue's last %d tokens: %d misses; cache size %d, want at most %d", MaxCachedTokensPerPrincipal, st.Misses-before.Misses, st.Size, 16+MaxCachedTokensPerPrincipal)
	}
	if _, err := cache.Parse(fx.issuer, rogue[0], now); err != nil {
		t.Fatal(err)
	}
	if st := cache.Stats(); st.Size > 16+MaxCachedTokensPerPrincipal {
		t.Errorf("cache size %d after the rogue's first token again, want at most %d", st.Size, 16+MaxCachedTokensPerPrincipal)
	}
}
