// Package ledger is the tool-call ledger: every call a gate begins, ends,
// is asked to cancel and acknowledges, with the gate (a tool server's
// principal) that reported each step. It reads the agent tree (a call from
// a stopping or exited node is refused and kept as evidence, and a call
// that ends while a stop covers its node before its mark is put on that
// stop's account, as the mark puts the calls it finds open; a call that
// ends on a termination's account is noted by node until that record lists
// it, so that a stop that marks the node or takes it over first moves it
// to its own, MoveEndedIn) and never the termination, which reads and
// writes the ledger's calls inside its own transactions (GetCallIn,
// PutCallIn, RequestCancelIn, MoveEndedIn and the keys in keys.go). A
// refused call past those a termination lists is counted for its record
// (RefusedNotListedOf). A node's calls in flight are bounded per gate
// (MaxOpenCallsPerNode): a begin reads the node's count of open calls and
// reads its open-call keys only at the bound (or for a node whose calls an
// earlier version began); whatever closes a call, the termination
// included, goes through CloseOpenIn, which keeps the count. The count
// adds up the open calls' begin times too (OpenCount): the stop rules read
// a node's own open calls from it while it has none open or one.
//
// ToolCall, CallState and CallResolution are its own types: a call is
// stored in tether.v1.ToolCall's protobuf encoding, written from the pb
// tags by internal/storecodec; the RPC edge (controlplane/wire) converts
// them to the API's messages.
//
// Callers' duties:
//   - Allow only tool servers to report, each as its own gate: End and
//     CancelAck refuse a call begun by another gate (ErrWrongGate).
//   - Give the Ledger a TokenChecker that verifies the capability token
//     (signature, expiry, revocation chain, scope) before a call begins,
//     and checks its grant and chain again inside the transaction that
//     begins it (GrantUsableIn), so that a revocation committed in between
//     refuses the call.
//   - Treat the cancel orders WatchCancels sends as idempotent: they may
//     repeat after a reconnect.
//   - Keep an Observer cheap: it runs inside the call's transaction.
package ledger
