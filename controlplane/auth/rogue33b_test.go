package auth

import (
	"crypto/ed25519"
	"testing"
	"time"
)

// TestRogue33BAMintedTokenIsRememberedAsAVerificationWouldFindIt: a token
// the Interceptor mints is cached as verified (so that its first call does
// not pay its address's budget, spent by a rogue behind the same NAT; the
// controlplane's rogue33b test). What is cached must be exactly what a
// verification of the token finds, for every kind of token, and it must
// still be dropped when its key leaves the ring, as a verified one is.
func TestRogue33BAMintedTokenIsRememberedAsAVerificationWouldFindIt(t *testing.T) {
	fx := newCacheFixture(t)
	now := fuzzT0.Add(time.Minute)
	i := &Interceptor{Issuer: fx.issuer, Now: func() time.Time { return now }, Cache: NewTokenCache(0)}
	agent, _, err := i.MintAgent("n_child", "n_root", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	op, _, _, err := i.MintOperator("alice", RoleSecurity, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	tool, _, _, err := i.MintToolServer("gate", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, tok := range []string{agent, op, tool} {
		cached, ok := i.Cache.Lookup(fx.issuer, tok, now)
		if !ok {
			t.Fatalf("a minted token is not cached")
		}
		verified, err := fx.issuer.Parse(tok, now)
		if err != nil {
			t.Fatal(err)
		}
		if !cached.ExpiresAt.Equal(verified.ExpiresAt) {
			t.Errorf("cached expiry %v, verified %v", cached.ExpiresAt, verified.ExpiresAt)
		}
		cached.ExpiresAt, verified.ExpiresAt = time.Time{}, time.Time{}
		if cached != verified {
			t.Errorf("cached %+v, a verification finds %+v", cached, verified)
		}
	}
	// Not minted here: not cached.
	other, _, err := fx.issuer.MintAgent("n_other", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := i.Cache.Lookup(fx.issuer, other, now); ok {
		t.Error("a token minted by the bare Issuer is cached")
	}
	// Its key's public half changed in the ring (a key replaced): the
	// minted entry is no longer answered, as a verified one is not.
	ring := *fx.ring.Load()
	keys := append(ring.Keys[:0:0], ring.Keys...)
	for k := range keys {
		pub, _, err := ed25519.GenerateKey(nil)
		if err != nil {
			t.Fatal(err)
		}
		keys[k].Public = pub
	}
	ring.Keys = keys
	fx.ring.Store(&ring)
	if _, ok := i.Cache.Lookup(fx.issuer, agent, now); ok {
		t.Error("a minted token is still answered from the cache once its key changed")
	}
}
