package controlplane

import (
	"context"

	"github.com/tetherhq/tether/supervisor"
	"github.com/tetherhq/tether/supervisor/lease"
	"github.com/tetherhq/tether/supervisor/lease/coordinator"
)

// leaseCanceller is the lease coordinator as the supervisor needs it
// (supervisor.LeaseCanceller): the coordinator finalizes leases, and the
// record reports each one with its outcome.
type leaseCanceller struct{ *coordinator.Coordinator }

func (c leaseCanceller) FinalizeHeldBy(ctx context.Context, holders []string, reason string) ([]supervisor.RecordLease, error) {
	ls, err := c.Coordinator.FinalizeHeldBy(ctx, holders, reason)
	if err != nil {
		return nil, err
	}
	out := make([]supervisor.RecordLease, len(ls))
	for i, l := range ls {
		out[i] = supervisor.RecordLease{
			JobID: l.JobID, LeaseID: l.LeaseID, LeaseGeneration: l.Generation, HolderIdentity: l.HolderIdentity,
			Outcome: recordOutcome(l), TerminalResult: supervisor.LeaseResult(l.TerminalResult),
		}
	}
	return out, nil
}

// recordOutcome is how a reconciliation record reports a lease.
func recordOutcome(l lease.Lease) supervisor.LeaseOutcome {
	switch {
	case l.TerminalResult == lease.ResultUnresolved:
		return supervisor.LeaseOutcomeUnresolved
	case l.TerminalResult == lease.ResultCancelled:
		return supervisor.LeaseOutcomeCancelled
	case l.LeaseExpired || l.State == lease.StateExpired:
		return supervisor.LeaseOutcomeExpired
	case l.TerminalResult.Final():
		return supervisor.LeaseOutcomeCompleted
	}
	return supervisor.LeaseOutcomeUnresolved
}
