package capability

import "errors"

// Every error this package returns wraps exactly one of these sentinels (or
// ErrUnknownKey, declared beside the key ring), so the RPC layer can map it
// to a Connect code with an errors.Is switch. The wrapping message names the
// offending field, scope or grant id and never contains token text or key
// material, so it is safe to return to a client.
var (
	// ErrInvalidScope: a scope is not well-formed (see ValidateScope).
	ErrInvalidScope = errors.New("capability: invalid scope")
	// ErrScopeEscalation: a delegated scope is not covered by the parent's scopes.
	ErrScopeEscalation = errors.New("capability: scope escalation")
	// ErrExpiryExceedsParent: a delegation asked to outlive its parent grant.
	ErrExpiryExceedsParent = errors.New("capability: expiry exceeds parent grant")
	// ErrNotInSubtree: the new holder is not a strict descendant of the parent's holder.
	ErrNotInSubtree = errors.New("capability: holder not in delegator's subtree")
	// ErrNotHolder: only the holder of a grant may delegate from it.
	ErrNotHolder = errors.New("capability: delegator does not hold the parent grant")
	// ErrNotRevoker: the principal is not in the grant's revoker set.
	ErrNotRevoker = errors.New("capability: principal may not revoke this grant")
	// ErrGrantRevoked: the grant (or, where stated, an ancestor) is revoked.
	ErrGrantRevoked = errors.New("capability: grant revoked")
	// ErrGrantExpired: the grant (or, where stated, an ancestor) has expired.
	ErrGrantExpired = errors.New("capability: grant expired")
	// ErrGrantNotYetValid: the grant's not_before is in the future.
	ErrGrantNotYetValid = errors.New("capability: grant not yet valid")
	// ErrInvalidGrant: a request or grant field is missing, malformed or over a limit.
	ErrInvalidGrant = errors.New("capability: invalid grant")
	// ErrInvalidTTL: a grant or token lifetime is out of range.
	ErrInvalidTTL = errors.New("capability: invalid ttl")
	// ErrChainTooDeep: the delegation chain would exceed MaxChainDepth.
	ErrChainTooDeep = errors.New("capability: delegation chain too deep")
	// ErrUnknownGrant: a grant named by a token or chain is not known.
	ErrUnknownGrant = errors.New("capability: unknown grant")
	// ErrChainBroken: stored grants disagree with the chain a token or grant claims.
	ErrChainBroken = errors.New("capability: grant chain inconsistent")
	// ErrFeedStale: the tombstone set has not heard from the revocation feed
	// within the staleness budget; a verifier must fail closed.
	ErrFeedStale = errors.New("capability: revocation feed stale")
	// ErrInvalidConfig: a Minter or Verifier is missing its issuer or audience,
	// or its leeway is out of bounds.
	ErrInvalidConfig = errors.New("capability: invalid token configuration")

	// ErrTokenTooLarge: the token exceeds MaxTokenBytes; it was not parsed.
	ErrTokenTooLarge = errors.New("capability: token too large")
	// ErrTokenMalformed: the token is not a well-formed compact JWS/JWT.
	ErrTokenMalformed = errors.New("capability: token malformed")
	// ErrTokenAlgorithm: the token's alg is not EdDSA (e.g. "none" or HS256).
	ErrTokenAlgorithm = errors.New("capability: token algorithm not allowed")
	// ErrTokenSignature: the signature does not verify under the named key.
	ErrTokenSignature = errors.New("capability: token signature invalid")
	// ErrTokenIssuer: iss is missing or not the expected issuer.
	ErrTokenIssuer = errors.New("capability: token issuer invalid")
	// ErrTokenAudience: aud is missing or does not contain the expected audience.
	ErrTokenAudience = errors.New("capability: token audience invalid")
	// ErrTokenExpired: exp is past, beyond the leeway.
	ErrTokenExpired = errors.New("capability: token expired")
	// ErrTokenNotYetValid: nbf or iat is in the future, beyond the leeway.
	ErrTokenNotYetValid = errors.New("capability: token not yet valid")
	// ErrTokenClaims: a required claim is missing or a claim is malformed.
	ErrTokenClaims = errors.New("capability: token claims invalid")
)
