package auth

import (
	"crypto/ed25519"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetherhq/tether/internal/tokencache"
)

// TokenCache remembers the bearer tokens the Interceptor verified, so that
// a client sending the same credential on every call pays for one Ed25519
// verification (about 40 µs, a third of a unary call's CPU) instead of one
// per call.
//
// It caches only what a verification proved about the token's bytes — its
// signature, issuer, audience and role — never a decision that can change:
//
//   - expiry is checked on every hit against the caller's clock (with the
//     parser's leeway), and a clock that went back before the verification
//     verifies again;
//   - the key that verified the token must still be in the ring, with the
//     same public key, so a key dropped from the ring (tether keys rotate)
//     rejects its cached tokens at once;
//   - whether an agent's node may still act (AgentActive), whether the
//     token was revoked (tether token revoke), the policy and the rate
//     limit are checked on every call as before, so a revocation takes
//     effect on the next call whether the token is cached or not.
//
// It also remembers which cached tokens were refused as dead (markDead:
// the token of a terminated, unknown or exited node, a revoked token). That
// decides nothing either: it tells the Interceptor to charge the next call
// with the token to its address's budget for requests without a valid
// credential before it reads anything, as it does a token that does not
// verify.
//
// Entries are keyed by the token's SHA-256 (the cache holds no credential)
// and bounded by Max; when full, expired entries go first, then arbitrary
// ones. One principal holds at most MaxCachedTokensPerPrincipal of them,
// so a caller minting itself fresh credentials cannot push others' out,
// and an agent lineage (a root and its descendants) its share, an eighth
// of Max: a full cache takes a lineage's token past its share in place of
// its lineage's oldest, and makes room from the lineages past their share
// first (internal/tokencache), so a rogue spawning thousands of children,
// each credential minted and remembered, cannot push other lineages' out
// (rogue37b test). A verified agent token is kept with the agents whose
// lineage is not yet known (that group has a share too) until its node is
// read (setLineage); a minted one, in its lineage at once. Only tokens
// that verified are cached, so a flood of bad tokens cannot fill it. The
// zero value is not usable: use NewTokenCache.
type TokenCache struct {
	mu      sync.Mutex
	entries *tokencache.Cache[cachedToken] // held by principal (ID)

	hits, misses atomic.Uint64
}

type cachedToken struct {
	principal  Principal
	by         verifiedBy
	verifiedAt time.Time
	dead       bool // refused as dead (markDead)
}

// DefaultTokenCacheSize is how many verified tokens a control plane keeps.
const DefaultTokenCacheSize = 16384

// MaxCachedTokensPerPrincipal bounds the entries one principal (an agent's
// node, an operator, a tool server) holds; its next token replaces its
// oldest. An agent may mint itself a fresh credential on every Heartbeat
// in the last third of its credential's life, and one that used each new
// credential once filled the cache with its own, evicting other callers'
// entries at random, each of whose next call then paid a verification
// again. An honest caller holds one credential, two across a refresh.
const MaxCachedTokensPerPrincipal = 4

// NewTokenCache returns a cache of at most size tokens (0: the default),
// a lineage's share an eighth of them.
func NewTokenCache(size int) *TokenCache {
	if size <= 0 {
		size = DefaultTokenCacheSize
	}
	return &TokenCache{entries: tokencache.New[cachedToken](size, MaxCachedTokensPerPrincipal, max(size/8, 1))}
}

// unplacedAgents is the cache group of the agent tokens that verified and
// whose lineage is not yet known; lineageGroup, a lineage's.
const unplacedAgents = "agents of unknown lineage"

func lineageGroup(lineage string) string { return "lineage:" + lineage }

// groupOf is the cache group of p's token: its lineage's for an agent
// (those of unknown lineage together), none for other callers.
func groupOf(p Principal, lineage string) string {
	switch {
	case p.Kind != KindAgent:
		return ""
	case lineage != "":
		return lineageGroup(lineage)
	default:
		return unplacedAgents
	}
}

// TokenCacheStats counts cache lookups.
type TokenCacheStats struct {
	Hits, Misses uint64
	Size         int
}

// Stats returns the counters so far.
func (c *TokenCache) Stats() TokenCacheStats {
	c.mu.Lock()
	size := c.entries.Len()
	c.mu.Unlock()
	return TokenCacheStats{Hits: c.hits.Load(), Misses: c.misses.Load(), Size: size}
}

// Parse is Issuer.Parse answered from the cache when it can be.
func (c *TokenCache) Parse(issuer Issuer, token string, now time.Time) (Principal, error) {
	if c == nil {
		return issuer.Parse(token, now)
	}
	if token == "" || len(token) > MaxTokenBytes {
		return issuer.Parse(token, now) // the parser's own error
	}
	if p, ok := c.Lookup(issuer, token, now); ok {
		return p, nil
	}
	return c.verify(issuer, token, now)
}

// Lookup answers from the cache alone: the principal of a token verified
// before and still valid at now, or false (the token must be verified).
// It counts a hit or a miss.
func (c *TokenCache) Lookup(issuer Issuer, token string, now time.Time) (Principal, bool) {
	p, ok, _ := c.lookup(issuer, token, now)
	return p, ok
}

// lookup is Lookup, also saying whether the token was refused as dead
// (markDead).
func (c *TokenCache) lookup(issuer Issuer, token string, now time.Time) (p Principal, ok, dead bool) {
	if c == nil || token == "" || len(token) > MaxTokenBytes {
		return Principal{}, false, false
	}
	sum := tokencache.Digest(token)
	c.mu.Lock()
	e, ok := c.entries.Get(sum)
	c.mu.Unlock()
	if ok && e.stillValid(issuer, now) {
		c.hits.Add(1)
		return e.principal, true, e.dead
	}
	c.misses.Add(1)
	return Principal{}, false, false
}

// setLineage keeps with token's principal the lineage its node was found
// in, which never changes: a call whose node read fails is charged to it
// (Interceptor.authenticate).
func (c *TokenCache) setLineage(token, lineage string) {
	if c == nil || token == "" || len(token) > MaxTokenBytes {
		return
	}
	sum := tokencache.Digest(token)
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.entries.Get(sum); ok && e.principal.Kind == KindAgent {
		e.principal.Lineage = lineage
		c.entries.Update(sum, e)
		if lineage != "" {
			c.entries.SetGroup(sum, lineageGroup(lineage))
		}
	}
}

// markDead notes that a cached token was refused as dead. A token not
// cached (evicted since) is not noted: its next call verifies it again,
// and a verification is charged like a dead refusal once the address's
// budget is spent.
func (c *TokenCache) markDead(token string) {
	if c == nil || token == "" || len(token) > MaxTokenBytes {
		return
	}
	sum := tokencache.Digest(token)
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.entries.Get(sum); ok {
		e.dead = true
		c.entries.Update(sum, e)
	}
}

// verify verifies a token the cache could not answer for, and caches it
// when it verifies.
func (c *TokenCache) verify(issuer Issuer, token string, now time.Time) (Principal, error) {
	if c == nil {
		return issuer.Parse(token, now)
	}
	sum := tokencache.Digest(token)
	p, by, err := issuer.parse(token, now)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.entries.Remove(sum)
		return Principal{}, err
	}
	c.remember(sum, p, by, p.Lineage, now)
	return p, nil
}

// minted remembers a token the control plane just minted as verified:
// minting proved what a verification would (its principal, the key that
// signed it), so its first call is not verified again, nor paid from its
// address's budget for requests without a valid credential (a child's
// first call on a connection of its own, with its address's budget spent
// by a rogue behind the same NAT, was refused; rogue33b test).
//
// lineage is an agent's ("" for other callers, or not known): its token
// is kept in its lineage's share at once.
func (c *TokenCache) minted(token string, m mintedToken, lineage string, now time.Time) {
	if c == nil || token == "" || len(token) > MaxTokenBytes {
		return
	}
	sum := tokencache.Digest(token)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.remember(sum, m.principal, m.by, lineage, now)
}

// remember caches a token that verified (or was minted) at now as p's,
// in lineage's share for an agent's. c.mu is held.
func (c *TokenCache) remember(sum tokencache.Sum, p Principal, by verifiedBy, lineage string, now time.Time) {
	c.entries.Put(sum, p.ID(), groupOf(p, lineage), p.ExpiresAt.Add(Leeway), now, cachedToken{principal: p, by: by, verifiedAt: now})
}

// stillValid: what the verification proved still holds at now.
func (e cachedToken) stillValid(issuer Issuer, now time.Time) bool {
	if now.Before(e.verifiedAt) || e.principal.ExpiresAt.IsZero() || !now.Before(e.principal.ExpiresAt.Add(Leeway)) {
		return false
	}
	key, err := issuer.Ring().Public(e.by.kid)
	return err == nil && key.Equal(ed25519.PublicKey(e.by.key))
}
