package lease_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/tetherhq/tether/supervisor/lease"
)

// checkStep verifies the invariants that every Step must keep, whatever the
// message. Transcripts, property tests and the fuzzer all run it after each
// step.
func checkStep(pre lease.Lease, m lease.Message, now time.Time, post lease.Lease, d lease.Decision, events []lease.Event) error {
	if d.Reason == "" {
		return errors.New("decision without a reason")
	}
	switch d.Outcome {
	case lease.OutcomeAccepted, lease.OutcomeDuplicate:
		if d.Err() != nil {
			return fmt.Errorf("%s decision has error %v", d.Outcome, d.Err())
		}
	case lease.OutcomeRejected:
		if d.Err() == nil {
			return errors.New("rejection without error")
		}
	default:
		return fmt.Errorf("outcome %s", d.Outcome)
	}

	// Events chain from the old state to the new one and end with the
	// decision's own event.
	if len(events) == 0 {
		return errors.New("no events")
	}
	if last := events[len(events)-1]; last.Audit != d.Event {
		return fmt.Errorf("last event %s, decision %s", last.Audit, d.Event)
	}
	from := pre.State
	for _, e := range events {
		if e.From != from {
			return fmt.Errorf("event %s does not start at %s", e, from)
		}
		if e.Transition && !lease.CanTransition(e.From, e.To) {
			return fmt.Errorf("event %s is an illegal edge", e)
		}
		if !e.Transition && e.From != e.To {
			return fmt.Errorf("event %s changes state without being a transition", e)
		}
		if !e.At.Equal(now) {
			return fmt.Errorf("event %s at %s, step at %s", e, e.At, now)
		}
		from = e.To
	}
	if from != post.State {
		return fmt.Errorf("events end at %s, lease is %s", from, post.State)
	}

	clockOnly := len(events) == 1 // nothing forced by the clock before judging
	// A message that could not be judged (malformed, or about a job this
	// record is not) changes nothing at all.
	err := d.Err()
	unjudged := errors.Is(err, lease.ErrInvalidMessage) || errors.Is(err, lease.ErrInvalidPolicy) ||
		errors.Is(err, lease.ErrUnknownLease) && (!pre.Exists() || m == nil || pre.JobID != m.Job())
	if unjudged && clockOnly && post != pre {
		return fmt.Errorf("unjudged message (%v) changed the lease", err)
	}
	if clockOnly && d.Outcome == lease.OutcomeDuplicate && post != pre {
		return errors.New("duplicate changed the lease")
	}
	if clockOnly && d.Outcome == lease.OutcomeRejected && authority(post) != authority(pre) {
		return fmt.Errorf("rejection changed authority:\n pre  %+v\n post %+v", authority(pre), authority(post))
	}

	// Generations only move forward, one at a time, with a new lease id.
	switch {
	case post.Generation < pre.Generation:
		return fmt.Errorf("generation went back %d -> %d", pre.Generation, post.Generation)
	case post.Generation > pre.Generation:
		if post.Generation != pre.Generation+1 || post.LeaseID == pre.LeaseID || d.Outcome != lease.OutcomeAccepted {
			return fmt.Errorf("generation %d -> %d (lease %q -> %q, %s)", pre.Generation, post.Generation, pre.LeaseID, post.LeaseID, d.Outcome)
		}
		if _, isReassign := m.(lease.Reassign); !isReassign && pre.Exists() {
			return fmt.Errorf("generation changed by %s", m.Kind())
		}
	default:
		if post.ProgressSequence < pre.ProgressSequence {
			return fmt.Errorf("progress sequence went back %d -> %d", pre.ProgressSequence, post.ProgressSequence)
		}
		if post.RenewSequence < pre.RenewSequence {
			return fmt.Errorf("renew sequence went back %d -> %d", pre.RenewSequence, post.RenewSequence)
		}
		if pre.State == lease.StateExpired && post.State != lease.StateExpired && post.State != lease.StateTerminal {
			return fmt.Errorf("expired generation %d became %s", pre.Generation, post.State)
		}
		if pre.Exists() && !post.ExpiresAt.Equal(pre.ExpiresAt) && d.Outcome == lease.OutcomeAccepted {
			switch m.(type) {
			case lease.Ack, lease.Renew, lease.Recover:
			default:
				return fmt.Errorf("%s changed expires_at", m.Kind())
			}
		}
	}
	if _, isProgress := m.(lease.Progress); isProgress &&
		(!post.ExpiresAt.Equal(pre.ExpiresAt) || !post.RenewTime.Equal(pre.RenewTime) || post.RenewSequence != pre.RenewSequence) {
		return errors.New("progress renewed the lease")
	}

	// Final results never change; UNRESOLVED only becomes a final one.
	if pre.TerminalResult.Final() && (post.TerminalResult != pre.TerminalResult || post.State != lease.StateTerminal) {
		return fmt.Errorf("final result %s became %s (%s)", pre.TerminalResult, post.TerminalResult, post.State)
	}
	if pre.TerminalResult == lease.ResultUnresolved && post.TerminalResult != lease.ResultUnresolved &&
		post.TerminalResult != lease.ResultFailed && post.TerminalResult != lease.ResultCancelled {
		return fmt.Errorf("UNRESOLVED became %s", post.TerminalResult)
	}
	if (post.State == lease.StateTerminal) != (post.TerminalResult != lease.ResultUnspecified) {
		return fmt.Errorf("state %s with result %s", post.State, post.TerminalResult)
	}

	// Success comes only from the active holder's Complete within its lease.
	if post.TerminalResult == lease.ResultSuccess && pre.TerminalResult != lease.ResultSuccess {
		c, ok := m.(lease.Complete)
		if !ok || pre.State != lease.StateActive || !now.Before(pre.ExpiresAt) ||
			c.Generation != pre.Generation || c.HolderIdentity != pre.HolderIdentity || pre.CancelRequested || pre.OwnershipConflict {
			return fmt.Errorf("SUCCESS by %s from %s", m.Kind(), pre.State)
		}
	}

	// The state reflects the clock after every judged message.
	if !unjudged {
		if post.State == lease.StateActive && !now.Before(post.ExpiresAt) {
			return fmt.Errorf("ACTIVE at %s with expiry %s", now, post.ExpiresAt)
		}
		if post.State == lease.StateOffered && !now.Before(post.AckDeadline) {
			return fmt.Errorf("OFFERED at %s with ACK deadline %s", now, post.AckDeadline)
		}
	}

	// A conflict is cleared only by the coordinator, explicitly.
	if pre.OwnershipConflict && !post.OwnershipConflict {
		switch m := m.(type) {
		case lease.Reassign:
			if !m.ResolveConflict {
				return errors.New("reassign cleared a conflict without ResolveConflict")
			}
		case lease.Resolve:
			if !m.Result.Final() {
				return errors.New("UNRESOLVED cleared a conflict")
			}
		default:
			return fmt.Errorf("%s cleared an ownership conflict", m.Kind())
		}
	}
	// Evidence flags are sticky within the job.
	if (pre.StaleGeneration && !post.StaleGeneration) || (pre.LateProgress && !post.LateProgress) {
		return errors.New("an evidence flag was cleared")
	}
	return nil
}

// authorityView is a lease without its evidence flags: what a rejected
// message must never change.
type authorityView struct {
	lease.Lease
}

func authority(l lease.Lease) authorityView {
	l.StaleGeneration = false
	l.LateProgress = false
	l.OwnershipConflict = false
	l.ConflictHolder = ""
	return authorityView{l}
}
