package capability

import "github.com/tetherhq/tether/internal/fault"

// Every error this package returns wraps exactly one of these sentinels (or
// ErrUnknownKey, declared beside the key ring); each declares its category
// (internal/fault), which the RPC layer maps to a Connect code. The wrapping
// message names the offending field, scope or grant id and never contains
// token text or key material, so it is safe to return to a client.
var (
	// ErrInvalidScope: a scope is not well-formed (see ValidateScope).
	ErrInvalidScope = fault.New(fault.Invalid, "capability: invalid scope")
	// ErrScopeEscalation: a delegated scope is not covered by the parent's scopes.
	ErrScopeEscalation = fault.New(fault.Denied, "capability: scope escalation")
	// ErrExpiryExceedsParent: a delegation asked to outlive its parent grant.
	ErrExpiryExceedsParent = fault.New(fault.Invalid, "capability: expiry exceeds parent grant")
	// ErrNotInSubtree: the new holder is not a strict descendant of the parent's holder.
	ErrNotInSubtree = fault.New(fault.Denied, "capability: holder not in delegator's subtree")
	// ErrNotHolder: only the holder of a grant may delegate from it.
	ErrNotHolder = fault.New(fault.Denied, "capability: delegator does not hold the parent grant")
	// ErrNotRevoker: the principal is not in the grant's revoker set.
	ErrNotRevoker = fault.New(fault.Denied, "capability: principal may not revoke this grant")
	// ErrGrantRevoked: the grant (or, where stated, an ancestor) is revoked.
	ErrGrantRevoked = fault.New(fault.Precondition, "capability: grant revoked")
	// ErrGrantExpired: the grant (or, where stated, an ancestor) has expired.
	ErrGrantExpired = fault.New(fault.Precondition, "capability: grant expired")
	// ErrGrantNotYetValid: the grant's not_before is in the future.
	ErrGrantNotYetValid = fault.New(fault.Precondition, "capability: grant not yet valid")
	// ErrInvalidGrant: a request or grant field is missing, malformed or over a limit.
	ErrInvalidGrant = fault.New(fault.Invalid, "capability: invalid grant")
	// ErrInvalidTTL: a grant or token lifetime is out of range.
	ErrInvalidTTL = fault.New(fault.Invalid, "capability: invalid ttl")
	// ErrChainTooDeep: the delegation chain would exceed MaxChainDepth.
	ErrChainTooDeep = fault.New(fault.Invalid, "capability: delegation chain too deep")
	// ErrUnknownGrant: a grant named by a token or chain is not known.
	ErrUnknownGrant = fault.New(fault.NotFound, "capability: unknown grant")
	// ErrChainBroken: stored grants disagree with the chain a token or grant claims.
	ErrChainBroken = fault.New(fault.Internal, "capability: grant chain inconsistent")
	// ErrFeedStale: the tombstone set has not heard from the revocation feed
	// within the staleness budget; a verifier must fail closed.
	ErrFeedStale = fault.New(fault.Unavailable, "capability: revocation feed stale")
	// ErrInvalidConfig: a Minter or Verifier is missing its issuer or audience,
	// or its leeway is out of bounds.
	ErrInvalidConfig = fault.New(fault.Internal, "capability: invalid token configuration")

	// ErrTokenTooLarge: the token exceeds MaxTokenBytes; it was not parsed.
	ErrTokenTooLarge = fault.New(fault.Unauthenticated, "capability: token too large")
	// ErrTokenMalformed: the token is not a well-formed compact JWS/JWT.
	ErrTokenMalformed = fault.New(fault.Unauthenticated, "capability: token malformed")
	// ErrTokenAlgorithm: the token's alg is not EdDSA (e.g. "none" or HS256).
	ErrTokenAlgorithm = fault.New(fault.Unauthenticated, "capability: token algorithm not allowed")
	// ErrTokenSignature: the signature does not verify under the named key.
	ErrTokenSignature = fault.New(fault.Unauthenticated, "capability: token signature invalid")
	// ErrTokenIssuer: iss is missing or not the expected issuer.
	ErrTokenIssuer = fault.New(fault.Unauthenticated, "capability: token issuer invalid")
	// ErrTokenAudience: aud is missing or does not contain the expected audience.
	ErrTokenAudience = fault.New(fault.Unauthenticated, "capability: token audience invalid")
	// ErrTokenExpired: exp is past, beyond the leeway.
	ErrTokenExpired = fault.New(fault.Unauthenticated, "capability: token expired")
	// ErrTokenNotYetValid: nbf or iat is in the future, beyond the leeway.
	ErrTokenNotYetValid = fault.New(fault.Unauthenticated, "capability: token not yet valid")
	// ErrTokenClaims: a required claim is missing or a claim is malformed.
	ErrTokenClaims = fault.New(fault.Unauthenticated, "capability: token claims invalid")
)
