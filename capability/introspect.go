package capability

import (
	"fmt"
	"slices"
	"time"
)

// GrantLookup returns a stored grant by id. The core does no I/O: the
// caller loads the grant and its chain first (a token names them all) and
// answers from memory. A nil GrantLookup means "no grant store", as in an
// offline verifier, and only tombstones are consulted.
type GrantLookup func(grantID string) (Grant, bool)

// Verdict says whether a token or grant is active now, and why.
type Verdict struct {
	Active bool
	// Reason is a sentence for an operator: "active: …", "revoked via
	// ancestor grant g_1 at …", "expired at …". It names grants and times,
	// never token text.
	Reason string
	// Err is nil when Active, else an error wrapping one sentinel:
	// ErrGrantRevoked, ErrGrantExpired, ErrGrantNotYetValid, ErrUnknownGrant,
	// ErrChainBroken, ErrScopeEscalation, ErrTokenExpired or one of
	// Verify's.
	Err error
	// RevokedVia is the grant whose revocation covers this one, if revoked.
	RevokedVia string
	// Grant is the stored grant, when a lookup found it.
	Grant      Grant
	GrantFound bool
}

func inactive(err error, revokedVia string) Verdict {
	return Verdict{Reason: err.Error(), Err: err, RevokedVia: revokedVia}
}

// Introspect verifies a token and checks it: the whole answer of the
// Introspect RPC. A token that fails verification is inactive with the
// verification error as the reason.
func Introspect(token string, v Verifier, keys KeyLookup, tombstones *TombstoneSet, lookup GrantLookup, now time.Time) (Claims, Verdict) {
	claims, err := v.Verify(token, keys, now)
	if err != nil {
		return Claims{}, inactive(err, "")
	}
	return claims, Check(claims, tombstones, lookup, now)
}

// Check decides whether verified claims are still good at now:
//
//  1. no tombstone covers the grant or any ancestor (O(depth));
//  2. the token has not reached exp — checked strictly, without leeway,
//     so claims cached by a tool gate are dropped on time;
//  3. with a lookup: the grant exists and matches the token (holder, chain,
//     scopes), and CheckGrant holds for it.
//
// tombstones may be nil (no feed) and lookup may be nil (no store).
func Check(claims Claims, tombstones *TombstoneSet, lookup GrantLookup, now time.Time) Verdict {
	if v, revoked := checkTombstones(claims.GrantID, claims.Chain, tombstones); revoked {
		return v
	}
	if !now.Before(claims.ExpiresAt) {
		return inactive(fmt.Errorf("%w: token for grant %s expired at %s", ErrTokenExpired, claims.GrantID, formatTime(claims.ExpiresAt)), "")
	}
	if lookup == nil {
		return Verdict{
			Active: true,
			Reason: fmt.Sprintf("active: grant %s held by node %s; token expires at %s", claims.GrantID, claims.HolderNodeID, formatTime(claims.ExpiresAt)),
		}
	}
	g, ok := lookup(claims.GrantID)
	if !ok {
		return inactive(fmt.Errorf("%w: grant %s", ErrUnknownGrant, claims.GrantID), "")
	}
	var mismatch error
	switch {
	case g.GrantID != claims.GrantID, g.HolderNodeID != claims.HolderNodeID:
		mismatch = fmt.Errorf("%w: token for grant %s names a different holder than the stored grant", ErrChainBroken, claims.GrantID)
	case !slices.Equal(g.Chain, claims.Chain):
		mismatch = fmt.Errorf("%w: token for grant %s carries a different chain than the stored grant", ErrChainBroken, claims.GrantID)
	default:
		if scope, ok := Subset(g.Scopes, claims.Scopes); !ok {
			mismatch = fmt.Errorf("%w: token scope %q is not in grant %s", ErrScopeEscalation, scope, claims.GrantID)
		}
	}
	if mismatch != nil {
		v := inactive(mismatch, "")
		v.Grant, v.GrantFound = g, true
		return v
	}
	v := CheckGrant(g, nil, lookup, now)
	if v.Active {
		v.Reason = fmt.Sprintf("active: grant %s held by node %s; token expires at %s", g.GrantID, g.HolderNodeID, formatTime(claims.ExpiresAt))
	}
	return v
}

// CheckGrant decides whether a stored grant may be used at now — the check
// Refresh makes before minting, since descendants are marked revoked only
// asynchronously:
//
//  1. no tombstone covers the grant or an ancestor (tombstones may be nil);
//  2. the grant itself is active (stored state, not_before, expiry);
//  3. with a lookup, every ancestor in the chain, root first, exists, agrees
//     with the chain, and is neither revoked nor expired.
func CheckGrant(g Grant, tombstones *TombstoneSet, lookup GrantLookup, now time.Time) Verdict {
	if v, revoked := checkTombstones(g.GrantID, g.Chain, tombstones); revoked {
		v.Grant, v.GrantFound = g, true
		return v
	}
	verdict := func(err error, via string) Verdict {
		v := inactive(err, via)
		v.Grant, v.GrantFound = g, true
		return v
	}
	if lookup != nil {
		parent := ""
		if len(g.Chain) > 0 {
			parent = g.Chain[len(g.Chain)-1]
		}
		if g.ParentGrantID != parent {
			return verdict(fmt.Errorf("%w: grant %s names parent %q but its chain ends in %q", ErrChainBroken, g.GrantID, g.ParentGrantID, parent), "")
		}
		for i, id := range g.Chain {
			a, ok := lookup(id)
			if !ok {
				return verdict(fmt.Errorf("%w: ancestor grant %s of %s", ErrUnknownGrant, id, g.GrantID), "")
			}
			if a.GrantID != id || !slices.Equal(a.Chain, g.Chain[:i]) {
				return verdict(fmt.Errorf("%w: ancestor grant %s disagrees with the chain of %s", ErrChainBroken, id, g.GrantID), "")
			}
			switch a.StateAt(now) {
			case StateRevoked:
				return verdict(fmt.Errorf("%w: revoked via ancestor grant %s at %s", ErrGrantRevoked, id, formatTime(a.RevokedAt)), id)
			case StateExpired:
				return verdict(fmt.Errorf("%w: ancestor grant %s expired at %s", ErrGrantExpired, id, formatTime(a.ExpiresAt)), "")
			}
		}
	}
	if err := g.CheckActive(now); err != nil {
		via := ""
		if g.StateAt(now) == StateRevoked {
			via = g.RevokedVia
			if via == "" {
				via = g.GrantID
			}
			if via != g.GrantID {
				err = fmt.Errorf("%w: grant %s revoked via ancestor grant %s at %s", ErrGrantRevoked, g.GrantID, via, formatTime(g.RevokedAt))
			}
		}
		return verdict(err, via)
	}
	return Verdict{
		Active:     true,
		Reason:     fmt.Sprintf("active: grant %s held by node %s until %s", g.GrantID, g.HolderNodeID, formatTime(g.ExpiresAt)),
		Grant:      g,
		GrantFound: true,
	}
}

func checkTombstones(grantID string, chain []string, tombstones *TombstoneSet) (Verdict, bool) {
	if tombstones == nil {
		return Verdict{}, false
	}
	via, revoked := tombstones.Revoked(grantID, chain)
	if !revoked {
		return Verdict{}, false
	}
	at := ""
	if t, ok := tombstones.Lookup(via); ok {
		at = " at " + formatTime(t.RevokedAt)
	}
	if via == grantID {
		return inactive(fmt.Errorf("%w: grant %s revoked%s", ErrGrantRevoked, grantID, at), via), true
	}
	return inactive(fmt.Errorf("%w: grant %s revoked via ancestor grant %s%s", ErrGrantRevoked, grantID, via, at), via), true
}
