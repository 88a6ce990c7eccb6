package coordinator

import (
	"context"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/tetherhq/tether/supervisor/lease"
)

// CancelHeldBy requests cancellation of every open lease (not terminal)
// held by one of holders (agent node ids). It is idempotent: a lease whose
// cancellation was already requested answers DUPLICATE and is unchanged.
// It returns once every request is durable. This is the supervisor's
// LeaseCanceller.
func (c *Coordinator) CancelHeldBy(ctx context.Context, holders []string, reason string) error {
	jobs, err := c.heldBy(ctx, holders)
	if err != nil {
		return err
	}
	for _, job := range jobs {
		_, err := c.applyComputed(ctx, job, func(l lease.Lease) (lease.Message, bool) {
			if !l.Exists() || l.State == lease.StateTerminal || l.CancelRequested {
				return nil, false
			}
			return lease.RequestCancel{JobID: job, Reason: reason}, true
		})
		if err != nil {
			return fmt.Errorf("coordinator: cancel job %q: %w", job, err)
		}
	}
	return nil
}

// FinalizeHeldBy is the explicit terminal reconciliation of every lease
// held by one of holders, for a termination's record; it returns each
// lease as it stands after it (controlplane reports them in the record).
// Each job ends as:
//
//   - CANCELLED when its holder acknowledged the cancel request or
//     reported CANCELLED (Resolve CANCELLED if not yet terminal);
//   - expired, resolved FAILED, when its lease ran out (or its ACK
//     deadline passed) without a terminal result, since success was never
//     proven;
//   - CANCELLED when the offer was never ACKed: the holder never had
//     authority (Resolve CANCELLED);
//   - otherwise UNRESOLVED: the holder still has authority until its
//     expiry and did not acknowledge; it is resolved UNRESOLVED bounded by
//     the policy's MaxUnresolvedBound, after which it closes as FAILED;
//   - as it was when the holder had already reported SUCCESS or FAILED.
//
// A lease still without a cancel request gets one first (its own evidence
// row), so every CANCELLED in the record follows a request.
//
// It is idempotent: a second call finds the terminal results and returns
// the same leases.
func (c *Coordinator) FinalizeHeldBy(ctx context.Context, holders []string, reason string) ([]lease.Lease, error) {
	jobs, err := c.heldBy(ctx, holders)
	if err != nil {
		return nil, err
	}
	out := make([]lease.Lease, 0, len(jobs))
	for _, job := range jobs {
		// A reconciliation that ends a job CANCELLED needs the request in
		// the record (the lease machine refuses CANCELLED without one): a
		// termination that did not request it first — a rollout's batch
		// leaves its leases for the handover, and aborting the rollout
		// then finalises them — requests it now, as its own row.
		if _, err := c.applyComputed(ctx, job, func(l lease.Lease) (lease.Message, bool) {
			if !l.Exists() || l.State == lease.StateTerminal || l.CancelRequested {
				return nil, false
			}
			return lease.RequestCancel{JobID: job, Reason: clipReason("the holder is being stopped; " + reason)}, true
		}); err != nil {
			return nil, fmt.Errorf("coordinator: cancel job %q: %w", job, err)
		}
		res, err := c.applyComputed(ctx, job, func(l lease.Lease) (lease.Message, bool) {
			return finalMessage(l, c.cfg.Clock.Now(), reason)
		})
		if err != nil {
			return nil, fmt.Errorf("coordinator: finalize job %q: %w", job, err)
		}
		if res.Lease.Exists() {
			out = append(out, res.Lease)
		}
	}
	return out, nil
}

// finalMessage is the Resolve that reconciles l at now, or false when l is
// already terminal (or unknown).
func finalMessage(l lease.Lease, now time.Time, reason string) (lease.Message, bool) {
	resolve := func(result lease.TerminalResult, why string) (lease.Message, bool) {
		return lease.Resolve{JobID: l.JobID, Result: result, Reason: clipReason(why + "; " + reason)}, true
	}
	switch {
	case !l.Exists() || l.State == lease.StateTerminal:
		return nil, false
	case l.CancelAck:
		return resolve(lease.ResultCancelled, "the holder acknowledged the cancel request")
	case l.AckState != lease.AckAcked:
		return resolve(lease.ResultCancelled, "the holder never acknowledged the offer, so it never had authority")
	case l.State == lease.StateExpired || !now.Before(l.ExpiresAt):
		return resolve(lease.ResultFailed, "the lease expired without a terminal result; success was never proven")
	}
	return lease.Resolve{JobID: l.JobID, Result: lease.ResultUnresolved,
		Reason: clipReason("the holder still had authority and did not acknowledge the cancel request; " + reason)}, true
}

// clipReason keeps a composed reason within the message limit.
func clipReason(s string) string {
	if len(s) <= lease.MaxValueBytes {
		return s
	}
	s = s[:lease.MaxValueBytes-len("…")]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "…"
}
