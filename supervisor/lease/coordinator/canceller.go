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
//
// A job is listed first and judged after, and it may change hands in
// between (its lineage, an operator or a rollout's handover reassigning
// it, or, past the first applyWindow of jobs, some commits later): each
// request is made only if one of holders still holds the job when it is
// judged, so a stop never halts the work of the agent the job moved to.
//
// Only the holders' open jobs are listed (each shard's index of them):
// their finished ones, which stay under them for ever, have nothing to
// cancel. Until the forty-second pass every job a holder ever held was
// walked, on the goroutine that judges every tree's jobs on its shard,
// and judged again, for each chunk of a stop's members (rogue42b test).
func (c *Coordinator) CancelHeldBy(ctx context.Context, holders []string, reason string) error {
	jobs, err := c.heldBy(ctx, holders, "", 0, true)
	if err != nil {
		return err
	}
	held := holderSet(holders)
	_, err = c.applyAll(ctx, jobs, "cancel", func(job string) func(lease.Lease) (lease.Message, bool) {
		return func(l lease.Lease) (lease.Message, bool) {
			if !l.Exists() || !held[l.HolderIdentity] || l.State == lease.StateTerminal || l.CancelRequested {
				return nil, false
			}
			return lease.RequestCancel{JobID: job, Reason: reason}, true
		}
	})
	return err
}

// holderSet is holders as a set.
func holderSet(holders []string) map[string]bool {
	set := make(map[string]bool, len(holders))
	for _, h := range holders {
		set[h] = true
	}
	return set
}

// applyWindow is how many of a holder's jobs applyAll has judged at once
// (a variable only so that a test can act between two windows).
var applyWindow = 4096

// applyAll judges compute(job) for each of jobs, up to applyWindow at a
// time, rather than one after another: each shard gathers them into its
// batches, so a termination of a node holding thousands of jobs costs a
// few commits, not one or two each (a rogue's lineage offering its child
// 20,000 jobs, one request each, had its operator's abort wait for some
// 40,000 commits in a row). Each job's messages keep their order: a caller
// that sends two per job calls applyAll twice. results[i] is jobs[i]'s;
// what names the step in an error.
func (c *Coordinator) applyAll(ctx context.Context, jobs []string, what string, compute func(job string) func(lease.Lease) (lease.Message, bool)) ([]Result, error) {
	results := make([]Result, len(jobs))
	type answered struct {
		i int
		answer
	}
	for start := 0; start < len(jobs); start += applyWindow {
		end := min(start+applyWindow, len(jobs))
		ch := make(chan answered, end-start)
		for i := start; i < end; i++ {
			c.send(c.shardOf(jobs[i]), op{kind: opCompute, job: jobs[i], compute: compute(jobs[i]),
				done: func(r Result, err error) { ch <- answered{i, answer{r, err}} }})
		}
		var failed error
		for range end - start {
			select {
			case a := <-ch:
				if a.err != nil && failed == nil {
					failed = fmt.Errorf("coordinator: %s job %q: %w", what, jobs[a.i], a.err)
				}
				results[a.i] = a.r
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		if failed != nil {
			return nil, failed
		}
	}
	return results, nil
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
//   - as it was when the holder had already reported SUCCESS or FAILED;
//   - decided as above when the clock closed it UNRESOLVED because its
//     authority ended with a cancel request standing (lease.CancelLapsed):
//     the reconciliation the termination would have made of the EXPIRED
//     generation.
//
// A lease still without a cancel request gets one first (its own evidence
// row), so every CANCELLED in the record follows a request.
//
// It is idempotent: a second call finds the terminal results and returns
// the same leases.
func (c *Coordinator) FinalizeHeldBy(ctx context.Context, holders []string, reason string) ([]lease.Lease, error) {
	out, _, err := c.FinalizeHeldByPage(ctx, holders, reason, "", 0)
	return out, err
}

// FinalizeHeldByPage is FinalizeHeldBy of a page of the jobs, in order of
// job id: those after job id after, at most limit of them (0: every one).
// more says jobs remain after them. A termination's record lists its
// members' leases page by page, each from the last it wrote, so that it
// finalises and reads each lease about once, not once per page.
//
// As in CancelHeldBy, a job that changed hands after it was listed is
// left to its new holder: neither cancelled nor resolved, nor reported.
// A page whose every job moved so is followed by the next, so that an
// empty page never reads as the end of the holders' jobs.
func (c *Coordinator) FinalizeHeldByPage(ctx context.Context, holders []string, reason, after string, limit int) (leases []lease.Lease, more bool, err error) {
	held := holderSet(holders)
	for {
		jobs, err := c.heldBy(ctx, holders, after, limit, false)
		if err != nil {
			return nil, false, err
		}
		more = false
		if limit > 0 && len(jobs) > limit {
			jobs, more = jobs[:limit], true
		}
		// A reconciliation that ends a job CANCELLED needs the request in
		// the record (the lease machine refuses CANCELLED without one): a
		// termination that did not request it first — a rollout's batch
		// leaves its leases for the handover, and aborting the rollout
		// then finalises them — requests it now, as its own row.
		if _, err := c.applyAll(ctx, jobs, "cancel", func(job string) func(lease.Lease) (lease.Message, bool) {
			return func(l lease.Lease) (lease.Message, bool) {
				if !l.Exists() || !held[l.HolderIdentity] || l.State == lease.StateTerminal || l.CancelRequested {
					return nil, false
				}
				return lease.RequestCancel{JobID: job, Reason: clipReason("the holder is being stopped; " + reason)}, true
			}
		}); err != nil {
			return nil, false, err
		}
		final := func(l lease.Lease) (lease.Message, bool) {
			if !held[l.HolderIdentity] {
				return nil, false
			}
			return finalMessage(l, c.cfg.Clock.Now(), reason)
		}
		results, err := c.applyAll(ctx, jobs, "finalize", func(string) func(lease.Lease) (lease.Message, bool) { return final })
		if err != nil {
			return nil, false, err
		}
		out := make([]lease.Lease, 0, len(jobs))
		for _, res := range results {
			if res.Lease.Exists() && held[res.Lease.HolderIdentity] {
				out = append(out, res.Lease)
			}
		}
		if len(out) > 0 || !more {
			return out, more, nil
		}
		after = jobs[len(jobs)-1]
	}
}

// finalMessage is the Resolve that reconciles l at now, or false when l is
// already terminal (or unknown).
func finalMessage(l lease.Lease, now time.Time, reason string) (lease.Message, bool) {
	resolve := func(result lease.TerminalResult, why string) (lease.Message, bool) {
		return lease.Resolve{JobID: l.JobID, Result: result, Reason: clipReason(why + "; " + reason)}, true
	}
	switch {
	case !l.Exists() || l.State == lease.StateTerminal && !lease.CancelLapsed(l):
		return nil, false
	case l.CancelAck:
		return resolve(lease.ResultCancelled, "the holder acknowledged the cancel request")
	case l.AckState != lease.AckAcked:
		return resolve(lease.ResultCancelled, "the holder never acknowledged the offer, so it never had authority")
	case l.State == lease.StateExpired || lease.CancelLapsed(l) || !now.Before(l.ExpiresAt):
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
