package controlplane

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/supervisor"
	"github.com/tetherhq/tether/supervisor/lease"
	"github.com/tetherhq/tether/supervisor/lease/coordinator"
)

// leaseCanceller is the lease coordinator as the supervisor needs it
// (supervisor.LeaseCanceller): the coordinator finalizes leases, and the
// record reports each one with its outcome.
type leaseCanceller struct{ *coordinator.Coordinator }

func (c leaseCanceller) FinalizeHeldBy(ctx context.Context, holders []string, reason string, page supervisor.LeasePage) ([]supervisor.RecordLease, bool, error) {
	ls, more, err := c.Coordinator.FinalizeHeldByPage(ctx, holders, reason, page.After, page.Limit)
	if err != nil {
		return nil, false, err
	}
	out := make([]supervisor.RecordLease, len(ls))
	var askers []lease.Lease
	for i, l := range ls {
		out[i] = supervisor.RecordLease{
			JobID: l.JobID, LeaseID: l.LeaseID, LeaseGeneration: l.Generation, HolderIdentity: l.HolderIdentity,
			Outcome: recordOutcome(l), TerminalResult: supervisor.LeaseResult(l.TerminalResult),
		}
		if l.CancelAck {
			out[i].CancelAckedAt = l.CancelAckedAt
			if l.CancelAckedAt.Before(page.StopRequestedAt) {
				askers = append(askers, l)
			}
		}
	}
	if err := readCancelRequesters(ctx, c.Coordinator, askers, out); err != nil {
		return nil, false, fmt.Errorf("evidence of the cancels of the stopped nodes' jobs: %w", err)
	}
	if err := readEnds(ctx, c.Coordinator, ls, out); err != nil {
		return nil, false, fmt.Errorf("evidence of the stopped nodes' jobs: %w", err)
	}
	return out, more, nil
}

// readCancelRequesters fills, in out (the record's leases, by job id),
// the CancelRequestedBy of each of ls — leases whose holder acknowledged
// the cancel request before the termination's request — from the job's
// evidence: the principal that signed the cancel request of its
// generation that was accepted (signed, as every request the API judges
// is), "" when none did. The supervisor flags the acknowledgement as the
// stopped subtree's claim when its own agent asked (markClaimsUnderStop).
// The requests are found as the jobs' ends are, by their anchor rows and
// with one read of the evidence log for many jobs
// (coordinator.CancelRequestOfEach): a few of each job's rows, not its
// whole history, which the holder makes as long as it likes (thirty-ninth
// pass, rogue39c tests).
func readCancelRequesters(ctx context.Context, c *coordinator.Coordinator, ls []lease.Lease, out []supervisor.RecordLease) error {
	if len(ls) == 0 {
		return nil
	}
	at := make(map[string]int, len(out))
	for i, l := range out {
		at[l.JobID] = i
	}
	return c.CancelRequestOfEach(ctx, ls, func(l lease.Lease, r coordinator.Row, found bool) error {
		if found {
			out[at[l.JobID]].CancelRequestedBy = signerOfRequest(r)
		}
		return nil
	})
}

// signerOfRequest is the principal that signed the accepted cancel
// request r, "" when it is not signed.
func signerOfRequest(r coordinator.Row) string {
	// The decision quotes the request's reason: `… (reason "agent:n_…: …"); …`.
	_, quoted, ok := strings.Cut(r.Reason, "(reason ")
	if !ok {
		return ""
	}
	q, err := strconv.QuotedPrefix(quoted)
	if err != nil {
		return ""
	}
	reason, err := strconv.Unquote(q)
	if err != nil {
		return ""
	}
	who, _ := lease.SignerOf(reason)
	return who
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

// readEnds fills, in out (the record's leases, by job id), the EndedBy,
// EndedByNodeID and EndedAt of each of ls with a terminal result: on whose word the job ended, read from the job's own
// evidence — the accepted message that gave the lease its terminal result
// — never from anything its holder says about itself:
//
//   - a Complete is the holder's report (only the holder of the active
//     generation has one accepted), its node the row's holder;
//   - a Resolve is the coordinator's resolution when its reason is signed
//     with a principal (every Resolve the API judges is, see signed; an
//     agent's names its node), and the termination's own reconciliation
//     otherwise (FinalizeHeldBy writes its reasons unsigned);
//   - a Tick is the lease's own deadline (an UNRESOLVED bound elapsed).
//
// Whether the holder's report came while its node was being stopped is the
// supervisor's to say (it knows when the termination was requested).
func readEnds(ctx context.Context, c *coordinator.Coordinator, ls []lease.Lease, out []supervisor.RecordLease) error {
	at := make(map[string]int, len(ls))
	var ended []lease.Lease
	for i, l := range out {
		at[l.JobID] = i
	}
	for _, l := range ls {
		if hasEnd(l) {
			ended = append(ended, l)
		}
	}
	// Read together: a read of one job's reads the whole evidence log,
	// and a record's leases are many.
	return c.EndOfEach(ctx, ended, func(l lease.Lease, end coordinator.Row, found bool) error {
		endedAt(l, end, found, &out[at[l.JobID]])
		return nil
	})
}

// hasEnd: l has a terminal result, whose row readEnds looks for.
func hasEnd(l lease.Lease) bool {
	return l.State == lease.StateTerminal && l.TerminalResult != lease.ResultUnspecified
}

// endedAt is readEnds for one lease, given the job's row that first
// carries its terminal result (coordinator.EndOfEach): the accepted
// message that gave the lease its result, or none when that row refused its message (the clock closed
// an UNRESOLVED as the message was judged: the lease's deadline is on no
// accepted row).
func endedAt(l lease.Lease, r coordinator.Row, found bool, rl *supervisor.RecordLease) {
	if !found || r.Decision.Outcome != lease.OutcomeAccepted {
		return
	}
	rl.EndedAt = r.DecidedAt
	switch r.Message {
	case lease.KindComplete:
		rl.EndedBy, rl.EndedByNodeID = supervisor.LeaseEndedByHolderReport, r.HolderIdentity
	case lease.KindResolve:
		principal, signed := lease.SignerOf(l.TerminalDetail)
		if !signed {
			rl.EndedBy = supervisor.LeaseEndedByTermination
			break
		}
		rl.EndedBy = supervisor.LeaseEndedByCoordinatorResolution
		if node, ok := strings.CutPrefix(principal, "agent:"); ok && id.Check(id.Node, "node_id", node) == nil {
			rl.EndedByNodeID = node
		}
	case lease.KindTick:
		rl.EndedBy = supervisor.LeaseEndedByLeaseDeadline
	}
}
