// Package capability is the pure core of Tether's capability tree: grants
// delegated down the agent tree, attenuated at every step, carried as
// short-lived signed tokens, and revocable by any ancestor with one
// tombstone per revocation.
//
// The package does no I/O, reads no clock and starts no goroutines. Every
// decision takes the time as an argument; ids and keys are drawn from an
// io.Reader the caller passes. It does not import the generated protobuf,
// Connect or the store: the RPC layer maps these types to tether.v1 and the
// errors' categories (internal/fault) to Connect codes.
//
// # Grants
//
// A Grant gives one agent node (its holder) a set of scopes from NotBefore
// to ExpiresAt. Operators issue roots (NewRoot); the holder of a grant
// derives narrower grants for nodes below it (Delegate). Each grant records
// its Chain, the ancestor grant ids root first, and its Revokers.
//
// Attenuation is enforced when a grant is issued, never later: a delegated
// grant's scopes are each covered by a parent scope, its expiry is no later
// than the parent's (a longer explicit TTL is refused, TTL 0 inherits), its
// holder is a strict descendant of the parent's holder, and its chain is at
// most MaxChainDepth long. The parent must be active at the time.
//
// States are StateActive, StateRevoked and StateExpired; the only edges are
// active → revoked (Revoke, MarkRevokedVia) and active → expired (Expire),
// both decided by one transition function.
//
// # Principals and revocation authority
//
// Principals are "operator:<subject>", "agent:<node_id>", RoleSecurity and
// RoleAdmin. A grant's revoker set is its issuer, the holder of every
// ancestor grant, the root's issuing operator, and the two roles. The
// holder itself is never a revoker — an agent never holds its own kill
// switch — and neither is a sibling, a descendant or an unrelated node.
// CanRevoke decides; Revoke enforces.
//
// # Scopes
//
// A scope is colon-separated segments of printable ASCII, such as
// "tool:shell" or "s3:read:bucket/prefix". A scope may end in '*', which
// matches any suffix, across segments too; '*' anywhere else is invalid.
// Parent covers child (Covers) iff they are equal, or the parent is "p*"
// and the child starts with p. That one rule makes "⊆" exact, decidable by
// a prefix comparison, and explainable by naming the child scope that no
// parent scope covers (Subset).
//
// # Tokens
//
// A capability token is an EdDSA JWT whose kid header names a KeyRing key:
// iss and aud as configured, sub the holder node id, jti the grant id,
// chain the ancestor grant ids, scopes, and iat, nbf and exp in whole
// seconds. A token lives at most MaxTokenTTL and never past its grant.
// Verifier checks tokens offline with golang-jwt under pinned options
// (EdDSA only, exp required, issuer, audience, iat, a leeway of at most
// MaxLeeway, the caller's clock, strict base64) after a size and alphabet
// check; ParseJWT applies the same options to operator tokens and agent
// credentials, which differ only by audience and claim type. Every failure
// wraps exactly one sentinel and never quotes the token.
//
// # Revocation
//
// Revoking a grant revokes its subtree with one Tombstone, so revocation is
// O(1) in the subtree's size. A verifier rejects a token if its jti or any
// chain entry is in its TombstoneSet — O(depth), lock-free. A tombstone may
// be dropped at DropAfter (revoked_at + MaxTokenTTL + MaxLeeway), once no
// token that carries the grant can be accepted anywhere.
//
// # Caller duties
//
// The control plane, in this order:
//
//  1. Authenticates the caller and passes its principal and roles; the core
//     trusts them.
//  2. Loads the parent grant and the new holder's ancestors from the agent
//     tree, calls Delegate, and persists the grant before returning it.
//  3. Before minting (IssueRoot, Delegate, Refresh), calls CheckGrant with
//     the stored chain and its own TombstoneSet, then Mint. Mint checks the
//     grant alone; descendants of a revoked grant are marked asynchronously,
//     so the chain check is what stops a refresh from a revoked subtree.
//  4. To revoke: Revoke, then write the revoked grant and TombstoneFor(it,
//     next sequence) in one transaction, and only then acknowledge. When
//     the transaction commits later than Revoke's now, raise the
//     tombstone's DropAfter to DropAfter(the commit's time): a token minted
//     in between, by a mint that read the grant still active, lives past
//     a DropAfter counted from the decision. Mark
//     descendants later with MarkRevokedVia, bounded and restartable; the
//     outcome does not depend on when it runs.
//  5. Keeps tombstones in the feed until DropAfter, and keeps a signing key
//     in JWKS until every token it signed has expired (KeyRing).
//
// A verifier (tool gate, resource server):
//
//  1. Verifies the token (Verifier.Verify) against JWKS (ParseJWKS).
//  2. Refuses to decide if its TombstoneSet is stale (CheckFresh): fail
//     closed.
//  3. Calls Check (or TombstoneSet.Revoked) on the claims for every use,
//     including uses of cached claims, and Allows for the scope the call
//     needs.
//  4. Follows the revocation feed: Add each batch, Replace on a snapshot
//     once its last message (one that does not continue) has arrived,
//     adding its earlier messages' tombstones meanwhile, MarkSynced on
//     each message that does not continue, Prune periodically.
package capability
