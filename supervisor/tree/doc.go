// Package tree is the agent tree: the enumeration of every
// credential-bearing agent, its sessions and the evidence of its exit.
// Credentials are only issued to registered nodes, so walking a node's
// subtree finds everything that must stop with it. Nodes are stored under
// keys.go's layout; a child index makes a subtree walk a sequence of
// prefix scans, never a full scan. It is the bottom of the supervisor: it
// imports none of the supervisor's other packages.
//
// Its types (Node, NodeState, SessionSignal, ...) are its own: a node is
// stored in tether.v1.Node's protobuf encoding, written from Node's pb
// tags by internal/storecodec, so a node any version stored reads back;
// the RPC edge (controlplane/wire) converts them to the API's messages.
//
// Spawning checks the parent's state inside the same transaction that
// writes the child, so a spawn racing a termination's mark (one
// transaction, in package supervisor) is either refused or included.
//
// Covers (cover.go). A termination covers its subtree from its request,
// before its mark reaches each node: the request notes itself on each root
// (NoteStopRequestedIn, in the requesting transaction; the mark's first
// chunk clears it as it marks the roots), and CoveringStopIn finds, for a
// running node, a stopping ancestor (an exited one once a termination
// marked it: StopsBelow) or a request on the node or an ancestor. What a
// stopping node may not start (a spawn, a tool call, a privilege, a
// proposal, a stop of its own, new lease work) a covered one may not
// either, and its word about a descendant's exit is a claim.
//
// Exit evidence (evidence.go, session.go). A node's exit is confirmed by
// its own word or an ancestor's (a claim when the ancestor is itself
// stopping, stopped or exited, under this termination or another; an
// exited agent may not vouch at all) or by an operator such as a launcher
// (an attestation); JudgeExit counts a confirmation only when the control
// plane's own evidence agrees: no session open (SessionOpened and
// SessionClosed store the observation on the node), every grant revoked or
// expired, no activity after it, and for a bare claim the session's end
// observed. From the first confirmation the node may not act: Act and the
// ledger refuse it (ErrNodeExited) and keep each attempt on the node as a
// contradiction (at most MaxContradictions); the control plane's
// Introspect answers its tokens inactive, and keeps a tool server's or an
// agent's introspection of them as such an attempt (through Act). A confirmation outside a
// termination moves a running node to EXITED; a later termination covering
// it includes it. A node that never had a session (NeverSessioned) leaves
// no end of its own for its activity to come after, so each request served
// to its credential (each active answer to a tool introspecting its token,
// each tool call begun or request a gate reports served with it) is noted on its ancestors whose exit was confirmed by then
// (NoteAtWorkAfterClaims, BelowAfterClaim, once each): such an ancestor's
// bare claim, or an agent's attestation of it, is not corroborated
// (JudgeExitBeside) — the ancestor was issued that credential. Once such
// an ancestor is terminated (its record's entry written) with its exit
// confirmed by a word the record weighs (no launcher's), such a request
// is refused instead (ErrAncestorRecorded, FailedPrecondition): nothing
// noted then would reach the written entry.
//
// Signals pushes drain and abort signals to open sessions from the nodes'
// stored state (a watch on the nodes), wherever the decision was made.
//
// Callers' duties:
//   - Refuse the request when Act returns ErrNodeExited: it has already
//     stored the contradiction.
//   - Call NoteAtWorkAfterClaims for each request served to a node's
//     credential (not one its stop refuses while it is draining or
//     aborting), before serving it, and refuse the request when it
//     returns an error (ErrAncestorRecorded: a refusal); do not answer a
//     never-sessioned node's requests from a cache that skips it.
//   - Call SessionClosed when a session ends, with a context that outlives
//     the stream; call CloseStaleSessions at start only in a process that
//     owns its store alone.
//   - Run Signals (Signals.Run) for as long as sessions are served.
//   - Keep an Observer cheap: it runs inside the spawn's transaction.
//   - Note a termination's request on its roots in the transaction that
//     writes it (NoteStopRequestedIn), and clear it in the one that marks
//     them (ClearStopRequestedIn): a note never cleared refuses the
//     subtree's work for good.
package tree
