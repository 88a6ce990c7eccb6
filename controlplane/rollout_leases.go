package controlplane

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/tetherhq/tether/internal/id"
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

// held returns the durable leases held by one of holders.
func (h leaseHandover) held(ctx context.Context, holders []string) ([]lease.Lease, error) {
	if len(holders) == 0 {
		return nil, nil
	}
	set := make(map[string]bool, len(holders))
	for _, holder := range holders {
		set[holder] = true
	}
	// One pass over every lease beats one pass per holder: List scans
	// every shard whatever the holder filter.
	all, _, err := h.leases.List(ctx, "", "", 0)
	if err != nil {
		return nil, err
	}
	var out []lease.Lease
	for _, l := range all {
		if set[l.HolderIdentity] {
			out = append(out, l)
		}
	}
	return out, nil
}

func (h leaseHandover) HeldBy(ctx context.Context, holders []string, page supervisor.LeasePage) ([]supervisor.RecordLease, bool, error) {
	held, err := h.held(ctx, holders)
	if err != nil {
		return nil, false, err
	}
	// The page: held is in order of job id (List's). What is read per
	// lease (its evidence, for how it ended) is read for the page's only.
	start := sort.Search(len(held), func(i int) bool { return held[i].JobID > page.After })
	held = held[start:]
	more := false
	if page.Limit > 0 && len(held) > page.Limit {
		held, more = held[:page.Limit], true
	}
	out := make([]supervisor.RecordLease, 0, len(held))
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
		} else if err := endedBy(ctx, h.leases, l, &rl); err != nil {
			return nil, false, err
		}
		out = append(out, rl)
	}
	return out, more, nil
}

func (h leaseHandover) Open(ctx context.Context, holders []string) (open, stuck []supervisor.HandoverLease, err error) {
	held, err := h.held(ctx, holders)
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

func (h leaseHandover) Reassign(ctx context.Context, l supervisor.HandoverLease, holder, reason string) (uint64, error) {
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
	res, err := h.leases.ApplyIf(ctx, lease.Reassign{
		JobID: l.JobID, LeaseID: id.New(id.Lease), HolderIdentity: holder, LeaseDuration: duration, Reason: reason,
	}, guard)
	if err != nil {
		return 0, err
	}
	if res.Decision.Outcome != lease.OutcomeAccepted {
		return 0, fmt.Errorf("%w: %s %s", supervisor.ErrHandoverRefused, res.Decision.Event, res.Decision.Reason)
	}
	return res.Lease.Generation, nil
}
