// Package auth authenticates and authorises every RPC of the control plane.
//
// Two kinds of caller present a bearer JWT (EdDSA, signed by the key ring):
//
//   - operators, with a role: viewer < operator, security, admin. Operator
//     tokens have audience "tether-operator" and a "role" claim. The first
//     admin token is written to <data-dir>/admin.token on first start.
//   - agents, with the credential returned by RegisterRoot or Spawn
//     (audience "tether-agent", subject = node id). An agent credential stops
//     working the moment its node is terminated, whatever its expiry.
//
// The interceptor authenticates first, then applies the procedure's Rule from
// one table (Policy). A procedure with no rule is denied: adding an RPC
// without deciding who may call it fails closed, and a test checks every
// procedure of every service has a rule. Finer checks that need the agent
// tree (is the caller an ancestor of the target?) are made by the handlers
// with the Principal this package puts in the context.
//
// A TokenCache (cache.go) spares the Ed25519 verification of a token the
// interceptor already verified; expiry, the key's presence in the ring, the
// agent's node, the policy and the rate limit are still checked on every
// call.
//
// Errors never contain the token: a failure is Unauthenticated (no, malformed,
// expired or revoked credential) or PermissionDenied (valid caller, not
// allowed), with a reason a person can act on.
package auth
