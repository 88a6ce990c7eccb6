// Package supervisor holds the agent tree and (in later files) the
// termination state machine, its reconciler and the reconciliation records.
//
// The agent tree is the enumeration of every credential-bearing agent:
// credentials are only issued to registered nodes, so walking a node's
// subtree finds everything that must stop with it. Nodes are stored under
// keys.go's layout; a child index makes a subtree walk a sequence of prefix
// scans, never a full scan.
//
// Spawning checks the parent's state inside the same transaction that writes
// the child. Marking a subtree for termination is also one transaction, so a
// spawn racing a termination is either refused (it serialized after the mark)
// or included (it serialized before, and the mark's subtree walk sees it).
//
// Exit evidence (evidence.go). A node's exit is confirmed by its own word
// or an ancestor's (a claim when the ancestor is itself stopping, stopped or
// exited, under this termination or another; an exited agent may not vouch
// at all) or by
// an operator such as a launcher (an attestation); the record counts a
// confirmation only when the control plane's own evidence agrees: no
// session open (Tree.SessionOpened/SessionClosed store the observation on
// the node), every grant revoked or expired, no activity after it, and for a
// bare claim the session's end observed. From the first confirmation the
// node may not act: Tree.Act and the ledger refuse it (ErrNodeExited) and
// keep each attempt on the node as a contradiction (at most
// MaxContradictions). A confirmation outside a termination moves a running
// node to EXITED; a later termination covering it includes it (Terminate and
// the mark accept an exited node no termination covers yet). Callers of Act
// refuse the request when it returns ErrNodeExited; it has already stored
// the contradiction.
//
// The tool-call ledger (ledger.go) records who reported each step (a tool
// server's principal id); the edge allows only tool servers to report, each
// as its own gate.
//
// Rollouts (rollout.go, rollout_reconciler.go) replace the agents matching
// a selector in batches: the pure NextRollout decides, the Rollouts shell
// persists each step before the next. Each batch is one termination of
// several subtree roots (TerminateIn, written in the same transaction as
// the batch) and so one record; its job leases are left open (LeaseHandover)
// and reassigned, generation + 1, to ready replacements. Callers of
// TerminateIn must Kick the termination after their transaction commits.
//
// Background work. The termination reconciler (Supervisor.Run), the
// rollout reconciler (Rollouts.Run) and the record outbox (Outbox.Run) are
// loops of internal/reconcile, keyed by termination, rollout and record
// id: they resume from stored state, are kicked by store watches (and by
// Kick), wake at their keys' deadlines on the Clock, and rescan after a
// watch fell behind. None of them returns before its context ends; a
// record sink that fails is retried with a doubling backoff on the Clock.
// The caller runs the three as leader-only components, and moves a manual
// Clock in tests (its timers fire the wake-ups that came due).
//
// Stop rules (package supervisor/stoprule) plug in at two points: the
// Ledger's and the Tree's Observer, told of each call and spawn inside the
// writing transaction, and FileRuleProposal, which files a rule's proposal
// and applies ProposalPolicy.RuleActions inside the caller's transaction
// (the caller Kicks the termination it may have started).
package supervisor
