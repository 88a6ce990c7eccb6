// Package auth authenticates and authorises every RPC of the control plane.
//
// Two kinds of caller present a bearer JWT (EdDSA, signed by the key ring):
//
//   - operators, with a role: viewer < operator, security, admin. Operator
//     tokens have audience "tether-operator" and a "role" claim. The first
//     admin token is written to <data-dir>/admin.token on first start.
//     Every token has an id (jti) and an expiry; a revoked token id
//     (Interceptor.Revoked) is refused on every call.
//   - agents, with the credential returned by RegisterRoot or Spawn
//     (audience "tether-agent", subject = node id). An agent credential stops
//     working the moment its node is terminated, whatever its expiry.
//
// The interceptor authenticates first, then applies the procedure's Rule from
// one table (Policy). It runs as HTTP middleware too (Interceptor.Gate),
// deciding from the headers alone, so a request without a valid credential
// never has its body read or decompressed. A procedure with no rule is denied: adding an RPC
// without deciding who may call it fails closed, and a test checks every
// procedure of every service has a rule. Finer checks that need the agent
// tree (is the caller an ancestor of the target?) are made by the handlers
// with the Principal this package puts in the context.
//
// A TokenCache (cache.go) spares the Ed25519 verification of a token the
// interceptor already verified, or minted (Interceptor.MintAgent, so that a
// fresh credential's first call does not pay its address's budget below);
// expiry, the key's presence in the ring, the
// token's revocation, the agent's node, the policy and the rate limit are
// still checked on every call. It holds at most four tokens of one
// principal and an eighth of its entries of one agent lineage, so that
// neither an agent minting itself credentials nor a lineage spawning
// thousands of children pushes other callers' tokens out.
//
// Rate limits (RateLimiter) are token buckets per budget: an agent spends
// from its lineage's (its root and every descendant share one), an
// operator from its own, and requests without a valid credential from
// their source address's (on a connection already bound to a live caller,
// that caller's own: BoundBudget) — a credential that verifies but is dead (a
// revoked token, a terminated, unknown or exited node's) among them, which
// the cache remembers, so that once the address's budget is spent it is
// refused before its node is read. Every stream message costs one request, and a
// batch on a lease Channel one per message it carries (Spend). A refusal
// is ResourceExhausted, with the wait in the message and in a Retry-After
// header. MaxStreams bounds the streams one principal holds open, and
// MaxLineageStreams those of an agent lineage together (beside a small
// reserve of its own per node: signal streams, and streams of other kinds).
// The same two bound, counted apart, the calls the Gate admitted from their
// headers whose bodies have not all arrived (each handler waits for its
// body until the read timeout), a node BodyReserve more of its own; and,
// counted apart again, the answers of admitted unary calls being written
// (TakeAnswer: a client granting no window kept each until the write
// timeout).
//
// Errors never contain the token: a failure is Unauthenticated (no, malformed,
// expired or revoked credential) or PermissionDenied (valid caller, not
// allowed), with a reason a person can act on.
package auth
