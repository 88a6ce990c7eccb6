// Package supervisor holds the termination and its reconciliation record:
// the state machine (termination.go, pure: Next and Advance), the shell
// that persists each step before the next (supervisor.go, reconciler.go),
// the record built and written in the transaction that terminates the
// subtree (record.go, recordtypes.go), its delivery to a sink (sink.go),
// and the stop proposals whose approval starts a termination (proposal.go,
// proposaltypes.go). The record and the proposals are this package's own
// types, stored in their tether.v1 messages' encoding (codec.go);
// controlplane/wire converts them to the messages the API carries and
// renders the record's published JSON, which the outbox's Render hands to
// the sink.
//
// The supervisor's other concepts live in their own packages, each below
// or above this one:
//
//	supervisor/tree       the agent tree, sessions and exit evidence (bottom)
//	supervisor/ledger     the tool-call ledger (reads the tree)
//	supervisor/privilege  temporary privileges and their revoke hooks
//	supervisor            the termination, its record, stop proposals
//	supervisor/rollout    rollouts: batches of terminations (above)
//	supervisor/stoprule   stop rules: file proposals that stop (above)
//	supervisor/lease      the job-lease machine (beside; the supervisor
//	                      reaches leases through LeaseCanceller)
//
// Spawning checks the parent's state, and its ancestors', inside the same
// transaction that writes the child. A termination marks its subtree top
// down in bounded chunks (chunks.go), the roots first, so a spawn racing a
// termination is either refused (it serialized after the roots' chunk: an
// ancestor is stopping) or included (it serialized before, and the mark's
// walk, which starts after, sees it). Every step of a termination that
// touches the subtree node by node — mark, escalation, cancel orders,
// revocation, the record — runs in chunks of at most Supervisor.ChunkSize
// nodes or calls, each one transaction that also persists how far it got,
// so no subtree is too large for a store transaction and a restart resumes
// after the last chunk that committed. The revocation lists each chunk's
// grants and privileges in a held index as it goes (a marked node gets no
// new ones), and the record reads them there, a range per chunk.
//
// The termination reads and writes the tree's nodes and the ledger's calls
// inside its own transactions, calling the operations of supervisor/tree and
// supervisor/ledger (and supervisor/internal/kv) by their qualified names.
// Marking a subtree for termination is one transaction, and a spawn checks
// its parent's state inside the transaction that writes the child, so a
// spawn racing a termination is either refused (it serialized after the
// mark) or included (it serialized before, and the mark's subtree walk
// sees it). The record weighs each node's exit with tree.JudgeExitBeside: a
// confirmation counts only when the control plane's own evidence agrees,
// and a bare claim only while no descendant of the node (a child, whose
// credential it was issued, or one spawned below with such a credential)
// has a session, a stream or a tool call open, or was seen at work after
// its own last end (its session's, or its confirmed exit), or, never
// having had a session, was served after the node's claim was stored
// (tree.NoteAtWorkAfterClaims; once the node's record chunk is written,
// such a descendant is refused instead: tree.ErrAncestorRecorded), and no tool
// call of the node itself is still open at the record; an agent's attestation (an
// ancestor outside the workload) is weighed against these as a bare claim
// is, a launcher's is not.
//
// Callers' duties:
//   - Run the reconciler (Supervisor.Run) and the record outbox
//     (Outbox.Run, with a Render when there is a Sink) for as long as the
//     process leads; Terminate, Propose and Decide only persist a
//     request, and Run does the rest.
//   - KickRequested a termination written with TerminateIn or
//     FileRuleProposal once the caller's transaction has committed.
//   - Give the Supervisor the layers it revokes through (GrantRevoker,
//     LeaseCanceller, the privilege registry) and, for rollout batches, a
//     LeaseHandover (batch.go); nil leaves that part out of the record.
//
// Background work. The termination reconciler (Supervisor.Run), the
// rollout reconciler (Rollouts.Run) and the record outbox (Outbox.Run) are
// loops of internal/reconcile, keyed by termination, rollout and record
// id: they resume from stored state, are kicked by store watches (and by
// Kick), wake at their keys' deadlines on the Clock, and rescan after a
// watch fell behind. None of them returns before its context ends (but
// an outbox with a Sink and no Render, a wiring error, does not start); a
// record sink that fails is retried with a doubling backoff on the Clock.
// The termination reconciler and the outbox serve the keys ready at once a
// group at a time in turn: a termination's tree (its operators' stops a
// group of their own), a record its termination's, which its outbox entry
// names; so a rogue's many stops of its own children, or their records
// due together after a sink's outage, do not hold another tree's, or an
// operator's, behind them all.
// The caller runs the three as leader-only components, and moves a manual
// Clock in tests (its timers fire the wake-ups that came due).
//
// Stop rules (package supervisor/stoprule) plug in at two points: the
// ledger's and the tree's Observers, told of each call and spawn inside
// the writing transaction, and FileRuleProposal, which files a rule's
// proposal and applies ProposalPolicy.RuleActions inside the caller's
// transaction (the caller KickRequested the termination it may have
// started).
package supervisor
