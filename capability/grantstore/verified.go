package grantstore

import (
	"crypto/ed25519"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/internal/tokencache"
)

// verifiedTokens remembers the capability tokens Introspect verified, so
// that a tool call with the token its gate presented on the call before
// pays for no Ed25519 verification (about 75 µs of a tool call's CPU, the
// largest part of a BeginCall that is ours), where each call verified it
// again.
//
// It keeps only what a verification proved about the token's bytes: its
// claims (they are in the bytes) and the public key that verified its
// signature. Nothing that can change is decided by it:
//
//   - a hit needs the time now at or after the verification (the token's
//     not-before and issued-at held then, so they hold later; a clock set
//     back verifies again) and before the token's expiry (without the
//     leeway: a token in its leeway verifies again, and expires by the
//     verifier's rule);
//   - the key ring must still hold the key under the token's kid, with the
//     same public key, so a key dropped from the ring refuses its tokens
//     at the next call, cached or not;
//   - the grant, its chain and the tombstones are read on every call as
//     before (capability.Check): a revocation takes effect whether the
//     token is cached or not.
//
// Entries are keyed by the token's SHA-256 (the cache holds no token), and
// bounded (internal/tokencache): at most maxVerified of them, and
// maxVerifiedPerHolder of one holder's (its oldest goes first), so an
// agent that has many grants minted for itself and presents each once
// pushes out its own entries, not others'. When the cache is full, a token
// of a lineage (the root grant of its chain) holding
// maxVerifiedLineageShare entries or more pushes out its lineage's oldest,
// any other an entry of another: a rogue whose thousands of children each
// presented four tokens filled the cache and, churning them, pushed out
// other lineages' entries at random for as long as it churned (rogue36k
// test); now at most what it took before its share. Only tokens that
// verified are kept: a flood of bad tokens cannot fill it.
type verifiedTokens struct {
	mu      sync.Mutex
	entries *tokencache.Cache[verifiedToken] // held by the holder's node

	hits, misses atomic.Uint64
}

type verifiedToken struct {
	claims     capability.Claims
	pub        ed25519.PublicKey
	verifiedAt time.Time
}

const (
	// maxVerified bounds the cache: at most a token's 8 KiB of claims each,
	// 32 MiB at worst; a tool call's token is well under 1 KiB.
	maxVerified = 4096
	// maxVerifiedPerHolder bounds one holder's entries: an honest agent
	// presents one token per grant, two across a refresh.
	maxVerifiedPerHolder = 4
	// maxVerifiedLineageShare: a full cache takes a token of a lineage
	// holding this many entries in place of its lineage's oldest.
	maxVerifiedLineageShare = maxVerified / 8
)

// lineageOf is the lineage of a token's grant: the root grant of its
// chain (every grant delegated under a root names it first), or the grant
// itself for a root grant.
func lineageOf(c capability.Claims) string {
	if len(c.Chain) > 0 {
		return c.Chain[0]
	}
	return c.GrantID
}

func newVerifiedTokens() *verifiedTokens {
	return &verifiedTokens{entries: tokencache.New[verifiedToken](maxVerified, maxVerifiedPerHolder, maxVerifiedLineageShare)}
}

// verify is v.Verify(token, keys, now), answered from the cache when it
// can be, and remembering a token that verifies.
func (c *verifiedTokens) verify(v capability.Verifier, token string, keys capability.KeyLookup, now time.Time) (capability.Claims, error) {
	if len(token) > capability.MaxTokenBytes || token == "" {
		return v.Verify(token, keys, now) // the verifier's own error
	}
	sum := tokencache.Digest(token)
	c.mu.Lock()
	e, ok := c.entries.Get(sum)
	c.mu.Unlock()
	if ok && !now.Before(e.verifiedAt) && now.Before(e.claims.ExpiresAt) {
		if pub, err := keys.Public(e.claims.KeyID); err == nil && pub.Equal(e.pub) {
			c.hits.Add(1)
			claims := e.claims
			claims.Chain = slices.Clone(claims.Chain)
			claims.Scopes = slices.Clone(claims.Scopes)
			return claims, nil
		}
	}
	c.misses.Add(1)
	seen := &seenKey{keys: keys}
	claims, err := v.Verify(token, seen, now)
	if err != nil || seen.pub == nil || seen.kid != claims.KeyID {
		return claims, err
	}
	kept := claims
	kept.Chain = slices.Clone(claims.Chain)
	kept.Scopes = slices.Clone(claims.Scopes)
	c.mu.Lock()
	c.entries.Put(sum, claims.HolderNodeID, lineageOf(claims), claims.ExpiresAt, now, verifiedToken{claims: kept, pub: slices.Clone(seen.pub), verifiedAt: now})
	c.mu.Unlock()
	return claims, nil
}

// seenKey is a KeyLookup that remembers the key it gave the verifier: the
// key that verified the token, not the one the ring holds a moment later.
type seenKey struct {
	keys capability.KeyLookup
	kid  string
	pub  ed25519.PublicKey
}

func (s *seenKey) Public(kid string) (ed25519.PublicKey, error) {
	pub, err := s.keys.Public(kid)
	if err == nil {
		s.kid, s.pub = kid, pub
	}
	return pub, err
}
