package controlplane

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tetherhq/tether/supervisor"
	"github.com/tetherhq/tether/supervisor/lease"
	"github.com/tetherhq/tether/supervisor/lease/coordinator"
)

// leaseHandover is the lease coordinator as a rollout needs it
// (supervisor.LeaseHandover): it lists a drained batch's leases and
// reassigns them, generation + 1, through the coordinator's ordinary
// Reassign, so the old generation is fenced off and its late messages are
// judged — and recorded — as stale by the lease protocol itself.
type leaseHandover struct {
	leases *coordinator.Coordinator
}

var _ supervisor.LeaseHandover = leaseHandover{}

// held returns the durable leases held by one of holders, in order of
// job id, after job id after, at most limit of them (0: every one); more
// says others follow. They are read from the coordinator's index by
// holder: the rollout's reconciler reads a replaced batch's open leases on
// every pass, and listing every lease (every tree's, terminal ones
// included) and keeping the members' made each pass cost every job the
// server holds, copied out by the shards that judge renewals.
func (h leaseHandover) held(ctx context.Context, holders []string, after string, limit int) (leases []lease.Lease, more bool, err error) {
	leases, next, err := h.leases.ListHeldBy(ctx, holders, after, limit)
	return leases, next != "", err
}

func (h leaseHandover) HeldBy(ctx context.Context, holders []string, page supervisor.LeasePage) ([]supervisor.RecordLease, bool, error) {
	// What is read per lease (its evidence, for how it ended) is read
	// for the page's only.
	held, more, err := h.held(ctx, holders, page.After, page.Limit)
	if err != nil {
		return nil, false, err
	}
	out := make([]supervisor.RecordLease, 0, len(held))
	var left []lease.Lease // left as they stand: how each ended is read below
	for _, l := range held {
		// HANDED_OVER only for what the rollout can reassign: a lease with
		// an ownership conflict (or a cancel request) is left as it stands,
		// UNRESOLVED until someone allowed to resolves it.
		// A lease left as it stands says how its job ended, as a
		// termination's record does (SUCCESS and FAILED are both
		// COMPLETED); a lease handed over has no result yet.
		rl := supervisor.RecordLease{
			JobID: l.JobID, LeaseID: l.LeaseID, LeaseGeneration: l.Generation, HolderIdentity: l.HolderIdentity,
			Outcome: recordOutcome(l), TerminalResult: supervisor.LeaseResult(l.TerminalResult),
		}
		if handoverable(l) {
			rl.Outcome, rl.TerminalResult = supervisor.LeaseOutcomeHandedOver, supervisor.LeaseResultUnspecified
		} else {
			left = append(left, l)
		}
		out = append(out, rl)
	}
	// The page's ends are read together, as a termination's record reads
	// them: a read of one job's reads the whole evidence log.
	if err := readEnds(ctx, h.leases, left, out); err != nil {
		return nil, false, err
	}
	return out, more, nil
}

func (h leaseHandover) Open(ctx context.Context, holders []string) (open, stuck []supervisor.HandoverLease, err error) {
	held, _, err := h.held(ctx, holders, "", 0)
	if err != nil {
		return nil, nil, err
	}
	for _, l := range held {
		hl := supervisor.HandoverLease{JobID: l.JobID, LeaseID: l.LeaseID, Holder: l.HolderIdentity, Generation: l.Generation}
		switch {
		case l.State == lease.StateTerminal:
			continue
		case l.CancelRequested:
			hl.Why = "cancellation was requested; resolve the job instead"
			stuck = append(stuck, hl)
		case l.OwnershipConflict:
			hl.Why = fmt.Sprintf("an ownership conflict with %q is recorded; settle it with an explicit reassignment or resolve", l.ConflictHolder)
			hl.Conflict = true
			stuck = append(stuck, hl)
		default:
			open = append(open, hl)
		}
	}
	return open, stuck, nil
}

// handoverable reports whether a rollout may reassign l: open, with no
// cancel request and no ownership conflict.
func handoverable(l lease.Lease) bool {
	return l.State != lease.StateTerminal && !l.CancelRequested && !l.OwnershipConflict
}

func (h leaseHandover) Reassign(ctx context.Context, l supervisor.HandoverLease, holder, leaseID, reason string) (uint64, error) {
	policy := h.leases.Policy()
	var duration time.Duration
	guard := func(current lease.Lease) error {
		if current.Generation != l.Generation || current.HolderIdentity != l.Holder {
			return fmt.Errorf("%w: job %q moved to generation %d (holder %q) since it was listed", coordinator.ErrPrecondition, l.JobID, current.Generation, current.HolderIdentity)
		}
		return nil
	}
	current, err := h.leases.Get(ctx, l.JobID)
	if err != nil {
		return 0, err
	}
	duration = current.LeaseDuration
	if duration == 0 {
		duration = policy.DefaultLeaseDuration
	}
	// Within the bound per holder, as an operator's Reassign is: until
	// the forty-eighth hostile pass the handover was unbounded, and a
	// rogue drained agent that filled its lineage with offers to itself
	// and its children, never acknowledged, had every one handed to a
	// replacement, which was then refused its coordinator's next offer.
	// The lease counts in no lineage's share, as before.
	res, err := h.leases.ApplyHolderBounded(ctx, lease.Reassign{
		JobID: l.JobID, LeaseID: leaseID, HolderIdentity: holder, LeaseDuration: duration, Reason: reason,
	}, guard, "")
	if errors.Is(err, coordinator.ErrLimit) {
		return 0, fmt.Errorf("%w: %v", supervisor.ErrHandoverFull, err)
	}
	if err != nil {
		return 0, err
	}
	if res.Decision.Outcome != lease.OutcomeAccepted {
		return 0, fmt.Errorf("%w: %s %s", supervisor.ErrHandoverRefused, res.Decision.Event, res.Decision.Reason)
	}
	return res.Lease.Generation, nil
}

func (h leaseHandover) Room(holder string) (int, bool) { return h.leases.HolderRoom(holder) }

// reassignedPage is how many evidence rows Reassigned reads a page.
const reassignedPage = 64

func (h leaseHandover) Reassigned(ctx context.Context, p supervisor.PendingHandover) (bool, error) {
	current, err := h.leases.Get(ctx, p.JobID)
	switch {
	case errors.Is(err, coordinator.ErrNotFound):
		return false, nil
	case err != nil:
		return false, err
	case current.LeaseID == p.LeaseID:
		return true, nil
	case current.Generation <= p.Generation:
		return false, nil // never moved past the generation it was taken from
	}
	// It moved past since (its replacement gave it up, its coordinator
	// moved it): the first row of a later generation names the lease
	// id of the one after p.Generation. Rows are in decision order and
	// generations never decrease.
	var cursor coordinator.EvidenceCursor
	for {
		page, err := h.leases.EvidencePage(ctx, p.JobID, cursor, reassignedPage)
		if err != nil {
			return false, err
		}
		for _, row := range page.Rows {
			if row.Generation > p.Generation {
				return row.LeaseID == p.LeaseID, nil
			}
		}
		if !page.More {
			return false, nil
		}
		cursor = page.Next
	}
}
