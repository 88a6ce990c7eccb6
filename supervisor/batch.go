package supervisor

import (
	"context"
	"errors"

	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/internal/kv"
)

// A rollout (package supervisor/rollout) runs each batch as one
// termination of several subtree roots that leaves the batch's job leases
// open for the rollout to hand over (TerminateIn with LeaseHandover). This
// file is what it needs of the termination beyond TerminateIn, Kick and
// Get: the lease module as the batch's record and the rollout see it, and
// the termination read and released inside the rollout's transactions.

// ErrHandoverRefused: the lease module refused to reassign a lease (a
// cancel request or an ownership conflict came first).
var ErrHandoverRefused = errors.New("supervisor: lease handover refused")

// ErrHandoverFull: the replacement already holds as many open leases as
// one agent may (the bound per holder); nothing was judged. Another
// replacement may take the lease, or this one once it has room.
var ErrHandoverFull = errors.New("supervisor: lease handover: the replacement holds as many open leases as one agent may")

// HandoverLease is a lease a rollout batch's agent holds.
type HandoverLease struct {
	JobID, LeaseID, Holder string
	Generation             uint64
	// Why a lease cannot be handed over ("" when it can).
	Why string
	// Conflict: it cannot be handed over because an ownership conflict is
	// recorded on it; the batch waits until the conflict is resolved.
	Conflict bool
}

// LeaseHandover is the lease module as a rollout needs it.
type LeaseHandover interface {
	// HeldBy reports every lease held by the holders without changing any:
	// open ones the rollout can reassign as HANDED_OVER, ones it cannot
	// (an ownership conflict, a cancel request) as they stand, terminal ones
	// with their outcome. For a rollout batch's record, page by page (see
	// LeasePage; more: leases of jobs after them remain).
	HeldBy(ctx context.Context, holders []string, page LeasePage) (leases []RecordLease, more bool, err error)
	// Open lists the open (not terminal) leases held by the holders:
	// those that can be reassigned, and those that cannot (Why says why).
	Open(ctx context.Context, holders []string) (open, stuck []HandoverLease, err error)
	// Reassign issues generation + 1 of l's job to holder, provided the
	// job is still at l's generation with l's holder (else it reports the
	// lease module's precondition error and changes nothing), within the
	// bound on the open leases one holder may hold (else ErrHandoverFull,
	// and nothing changes). A refusal is ErrHandoverRefused.
	// leaseID is the new generation's lease id, chosen by the caller (and
	// written down before the call: see Reassigned).
	Reassign(ctx context.Context, l HandoverLease, holder, leaseID, reason string) (generation uint64, err error)
	// Reassigned reports whether the reassignment p names was made: its
	// job passed from p.Generation to a generation whose lease id is
	// p.LeaseID. It is read from the lease and its evidence, so a
	// reassignment made before a crash is told from one never made.
	Reassigned(ctx context.Context, p PendingHandover) (bool, error)
	// Room is how many more open leases holder may be handed within the
	// bound per holder (bounded false: no bound).
	Room(holder string) (room int, bounded bool)
}

// PendingHandover is a reassignment a rollout's handover pass is about to
// make: the job, the generation it is taken from, and the lease id chosen
// for the next.
type PendingHandover struct {
	JobID      string `json:"job_id"`
	Generation uint64 `json:"generation"`
	LeaseID    string `json:"lease_id"`
}

// GetTerminationIn reads a termination inside the caller's transaction
// (ErrTerminationNotFound if there is none).
func GetTerminationIn(tx store.ReadTxn, terminationID string) (Termination, error) {
	var t Termination
	err := getTermination(tx, terminationID, &t)
	return t, err
}

// EndLeaseHandoverIn makes a rollout batch's termination a plain one,
// inside the caller's transaction: unless it is terminated already, it no
// longer leaves the batch's leases for the rollout but cancels and
// resolves them itself (its record says how). It returns the termination
// as it was read; the caller Kicks it once the transaction has committed.
func EndLeaseHandoverIn(tx store.Txn, terminationID string) (Termination, []string, error) {
	var t Termination
	if err := getTermination(tx, terminationID, &t); err != nil {
		return t, nil, err
	}
	members, err := membersIn(tx, t)
	if err != nil {
		return t, nil, err
	}
	if t.Phase == PhaseTerminated || !t.LeaseHandover {
		return t, members, nil
	}
	next := t
	next.LeaseHandover = false
	return t, members, kv.PutJSON(tx, terminationKey(t.ID), next)
}

// MembersIn lists the nodes t stops itself (its subtree index, in walk
// order), read in tx.
func MembersIn(tx store.ReadTxn, t Termination) ([]string, error) { return membersIn(tx, t) }
