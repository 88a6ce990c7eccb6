package crash

import (
	"fmt"

	"github.com/anishathalye/porcupine"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// LeaseOp is the kind of a lease operation in a history.
type LeaseOp int

// The operations the model knows: the worker messages, the coordinator's
// messages and a read.
const (
	OpOffer LeaseOp = iota + 1
	OpAck
	OpRenew
	OpProgress
	OpCancelAck
	OpComplete
	OpRequestCancel
	OpReassign
	OpResolve
	OpGet
)

func (o LeaseOp) String() string {
	switch o {
	case OpOffer:
		return "offer"
	case OpAck:
		return "ack"
	case OpRenew:
		return "renew"
	case OpProgress:
		return "progress"
	case OpCancelAck:
		return "cancel_ack"
	case OpComplete:
		return "complete"
	case OpRequestCancel:
		return "request_cancel"
	case OpReassign:
		return "reassign"
	case OpResolve:
		return "resolve"
	case OpGet:
		return "get"
	}
	return fmt.Sprintf("op(%d)", int(o))
}

// LeaseInput is what a client sent.
type LeaseInput struct {
	Op  LeaseOp
	Job string
	// Holder is the holder offered to (Offer, Reassign) or the
	// authenticated worker that sent a worker message.
	Holder string
	// The claim of a worker message.
	LeaseID    string
	Generation uint64
	// Sequence is the renew or progress sequence; Value the progress value.
	Sequence uint64
	Value    string
	// Result is Complete's or Resolve's (SUCCESS, FAILED or CANCELLED;
	// a Resolve's UNRESOLVED is not modelled: its bound elapses on the
	// clock; the UNRESOLVED the clock gives a generation that ended with
	// a cancel request standing is, as an answer shows it).
	Result tetherv1.TerminalResult
}

// LeaseView is a job's authority as the model tracks it and as an answer
// shows it. It is comparable, so the model's states compare with ==.
type LeaseView struct {
	Exists           bool
	Generation       uint64
	LeaseID          string
	Holder           string
	State            tetherv1.LeaseState
	RenewSequence    uint64
	ProgressSequence uint64
	ProgressValue    string
	CancelRequested  bool
	CancelAck        bool
	Result           tetherv1.TerminalResult
	Conflict         bool
	// ClosedByResolve is the model's own note (no answer shows it, and
	// comparisons with an answer take the model's): the coordinator's
	// Resolve, not the holder's Complete, made the job terminal. Only an
	// exact repeat of a terminal result, detail included, is a DUPLICATE;
	// the holder's Completes all carry the same detail (none, signed with
	// its principal on the server), and a Resolve's reason becomes the
	// detail (the model's Resolves all carry one reason), so a Complete
	// repeats only a Complete and a Resolve only a Resolve.
	ClosedByResolve bool
	// Acked and Lapsed are the model's own notes too: the current
	// generation was ACKed; an answer showed it EXPIRED (its authority
	// ended by the clock, the lease's LeaseExpired). A holder's CancelAck
	// after a FAILED result is recorded only for a generation that was
	// ACKed and had not lapsed (and whose expiry is still ahead, which
	// the model, without a clock, takes to hold: its leases run for
	// minutes).
	Acked, Lapsed bool
}

// unknownLeaseID stands for the lease id of a generation whose Offer or
// Reassign got no answer: the server chose it, and the first answer that
// shows the generation tells the model what it is.
const unknownLeaseID = "?"

// ViewOf is the authority an answer's lease shows (nil: no lease).
func ViewOf(l *tetherv1.Lease) LeaseView {
	if l == nil || l.LeaseGeneration == 0 {
		return LeaseView{}
	}
	return LeaseView{
		Exists: true, Generation: l.LeaseGeneration, LeaseID: l.LeaseId, Holder: l.HolderIdentity, State: l.State,
		RenewSequence: l.RenewSequence, ProgressSequence: l.ProgressSequence, ProgressValue: l.ProgressValue,
		CancelRequested: l.CancelRequested, CancelAck: l.CancelAck, Result: l.TerminalResult, Conflict: l.OwnershipConflict,
	}
}

func (v LeaseView) String() string {
	if !v.Exists {
		return "(no lease)"
	}
	s := fmt.Sprintf("gen %d %s holder %s %s renew %d progress %d/%q", v.Generation, v.LeaseID, v.Holder, v.State, v.RenewSequence, v.ProgressSequence, v.ProgressValue)
	if v.CancelRequested {
		s += fmt.Sprintf(" cancel(ack=%v)", v.CancelAck)
	}
	if v.Result != tetherv1.TerminalResult_TERMINAL_RESULT_UNSPECIFIED {
		s += " " + v.Result.String()
	}
	if v.Conflict {
		s += " conflict"
	}
	return s
}

// LeaseOutput is what the client got back.
type LeaseOutput struct {
	// Answered is false when the call got no answer (the server was
	// killed, the connection broke): the message may or may not have been
	// judged and made durable before the server died.
	Answered bool
	// Outcome of a mutation (unset for OpGet).
	Outcome tetherv1.Outcome
	// Lease after the message, or as read; Exists is false when the job
	// has no lease (OpGet answered not_found).
	Lease LeaseView
}

// LeaseModel is the sequential specification the harness checks lease
// histories against, partitioned by job. A call without an answer may or
// may not have taken effect, so the model is nondeterministic for it.
func LeaseModel() porcupine.Model {
	model := &porcupine.NondeterministicModel{
		Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
			byJob := map[string][]porcupine.Operation{}
			var order []string
			for _, op := range history {
				job := op.Input.(LeaseInput).Job
				if _, ok := byJob[job]; !ok {
					order = append(order, job)
				}
				byJob[job] = append(byJob[job], op)
			}
			out := make([][]porcupine.Operation, 0, len(order))
			for _, job := range order {
				out = append(out, byJob[job])
			}
			return out
		},
		Init: func() []any { return []any{LeaseView{}} },
		Step: func(state, input, output any) []any {
			return StepLease(state.(LeaseView), input.(LeaseInput), output.(LeaseOutput))
		},
		Equal: func(a, b any) bool { return a.(LeaseView) == b.(LeaseView) },
		DescribeOperation: func(input, output any) string {
			in, out := input.(LeaseInput), output.(LeaseOutput)
			call := fmt.Sprintf("%s(%s holder=%s", in.Op, in.Job, in.Holder)
			switch in.Op {
			case OpAck, OpRenew, OpProgress, OpCancelAck, OpComplete:
				call += fmt.Sprintf(" claim=%s/%d", in.LeaseID, in.Generation)
			}
			switch in.Op {
			case OpRenew, OpProgress:
				call += fmt.Sprintf(" seq=%d", in.Sequence)
			case OpComplete, OpResolve:
				call += " " + in.Result.String()
			}
			call += ")"
			if !out.Answered {
				return call + " -> no answer"
			}
			return fmt.Sprintf("%s -> %s %s", call, out.Outcome, out.Lease)
		},
		DescribeState: func(state any) string { return state.(LeaseView).String() },
	}
	return model.ToModel()
}

// StepLease returns the states the job may be in after the operation,
// given the answer: none when the answer is impossible from state.
func StepLease(state LeaseView, in LeaseInput, out LeaseOutput) []any {
	if !out.Answered {
		if in.Op == OpGet {
			return []any{state}
		}
		applied, _ := judge(state, in, unknownLeaseID)
		if applied == state {
			return []any{state}
		}
		return []any{applied, state} // judged and durable, or never judged
	}
	s := state
	seen := out.Lease
	if seen.Exists && seen.Holder == "" {
		// The answer to a former holder's (stale) message withholds the
		// lease that replaced its own: it shows the generation and its
		// state only (controlplane's forParty).
		if seen.Generation == s.Generation {
			s = lapsed(s, seen, in.Op)
		}
		next, outcome := judge(s, in, unknownLeaseID)
		if outcome != out.Outcome || next.Generation != seen.Generation || next.State != seen.State {
			return nil
		}
		return []any{next}
	}
	if s.Exists && seen.Exists && seen.Generation == s.Generation {
		// The answer names the lease id the server chose for a
		// generation whose own answer was lost.
		if s.LeaseID == unknownLeaseID {
			s.LeaseID = seen.LeaseID
		}
		// Only the coordinator's clock moves a generation to EXPIRED,
		// and the model has no clock: an answer that shows it tells it.
		// Once expired, a generation never comes back (the model keeps
		// it EXPIRED, so a later answer showing it live is impossible).
		s = lapsed(s, seen, in.Op)
	}
	seen.ClosedByResolve, seen.Acked, seen.Lapsed = s.ClosedByResolve, s.Acked, s.Lapsed
	if in.Op == OpGet {
		if seen == s {
			return []any{s}
		}
		return nil
	}
	newLeaseID := unknownLeaseID
	if seen.Exists {
		newLeaseID = seen.LeaseID
	}
	next, outcome := judge(s, in, newLeaseID)
	seen.ClosedByResolve, seen.Acked, seen.Lapsed = next.ClosedByResolve, next.Acked, next.Lapsed
	if outcome != out.Outcome || next != seen {
		return nil
	}
	return []any{next}
}

// lapsed is s after the coordinator's clock ended its generation, as an
// answer showing seen (the same generation) tells: EXPIRED, and, with a
// cancel request standing, closed UNRESOLVED on the coordinator's word
// (the thirty-eighth pass). Once expired, a generation never comes back
// (the model keeps it EXPIRED, so a later answer showing it live is
// impossible). A cancel request (op) answered with the generation closed
// UNRESOLVED came after its clock ended it: the request closes it (judge).
func lapsed(s, seen LeaseView, op LeaseOp) LeaseView {
	live := s.State == offered || s.State == active
	switch {
	case seen.State == expired && live:
		s.State, s.Lapsed = expired, true
	case seen.State == terminal && seen.Result == unresolved && op == OpRequestCancel && !s.CancelRequested && live:
		s.State, s.Lapsed = expired, true
	case seen.State == terminal && seen.Result == unresolved && s.CancelRequested && (live || s.State == expired):
		s.State, s.Lapsed = expired, true
		s = closeLapsed(s)
	}
	return s
}

// closeLapsed is the close of an EXPIRED generation whose cancel request
// stands: UNRESOLVED, the coordinator's.
func closeLapsed(s LeaseView) LeaseView {
	s.State, s.Result, s.ClosedByResolve = terminal, unresolved, true
	return s
}

const (
	accepted  = tetherv1.Outcome_OUTCOME_ACCEPTED
	duplicate = tetherv1.Outcome_OUTCOME_DUPLICATE
	rejected  = tetherv1.Outcome_OUTCOME_REJECTED

	offered  = tetherv1.LeaseState_LEASE_STATE_OFFERED
	active   = tetherv1.LeaseState_LEASE_STATE_ACTIVE
	expired  = tetherv1.LeaseState_LEASE_STATE_EXPIRED
	terminal = tetherv1.LeaseState_LEASE_STATE_TERMINAL

	success    = tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS
	cancelled  = tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED
	unresolved = tetherv1.TerminalResult_TERMINAL_RESULT_UNRESOLVED
)

// judge applies one message to a job's authority by the protocol's rules.
// newLeaseID is the lease id of a generation the message creates.
func judge(s LeaseView, in LeaseInput, newLeaseID string) (LeaseView, tetherv1.Outcome) {
	switch in.Op {
	case OpGet:
		return s, tetherv1.Outcome_OUTCOME_UNSPECIFIED
	case OpOffer:
		// Later generations come from Reassign; an Offer never replaces.
		if s.Exists {
			return s, rejected
		}
		return LeaseView{Exists: true, Generation: 1, LeaseID: newLeaseID, Holder: in.Holder, State: offered}, accepted
	}
	if !s.Exists {
		return s, rejected
	}
	switch in.Op {
	case OpRequestCancel:
		switch {
		case s.State == terminal:
			return s, rejected
		case s.CancelRequested:
			return s, duplicate
		}
		s.CancelRequested = true
		if s.State == expired {
			// Nothing is left to decide but how the job ended.
			s = closeLapsed(s)
		}
		return s, accepted
	case OpReassign:
		// Cancellation stays authoritative. A coordinator's reassignment
		// of a conflicted lease settles the conflict: it names the holder.
		if s.State == terminal || s.CancelRequested {
			return s, rejected
		}
		s.Conflict = false
		s.Generation++
		s.LeaseID, s.Holder, s.State, s.Acked, s.Lapsed = newLeaseID, in.Holder, offered, false, false
		s.RenewSequence, s.ProgressSequence, s.ProgressValue = 0, 0, ""
		return s, accepted
	case OpResolve:
		if s.State == terminal && s.Result != unresolved {
			// Only an exact repeat is a DUPLICATE: the model's Resolves
			// all carry one reason, so a Resolve repeats only a Resolve.
			if s.Result == in.Result && s.ClosedByResolve {
				return s, duplicate
			}
			return s, rejected
		}
		if in.Result == cancelled && !s.CancelRequested {
			return s, rejected // nothing was cancelled without a request
		}
		s.State, s.Result, s.ClosedByResolve, s.Conflict = terminal, in.Result, true, false
		return s, accepted
	}

	// A worker message speaks for one generation's lease and holder.
	switch {
	case in.Generation != s.Generation:
		return s, rejected // stale, or a generation never issued
	case in.LeaseID != s.LeaseID && s.LeaseID != unknownLeaseID:
		return s, rejected
	case in.Holder != s.Holder:
		// A second claimant of the active generation is an ownership
		// conflict, kept until the coordinator settles it.
		if s.State == active {
			s.Conflict = true
		}
		return s, rejected
	}
	switch in.Op {
	case OpAck:
		switch s.State {
		case offered:
			if s.CancelRequested {
				return s, rejected
			}
			s.State, s.Acked = active, true
			return s, accepted
		case active:
			return s, duplicate
		}
		return s, rejected
	case OpRenew:
		switch {
		case (s.State == expired || s.State == terminal) && s.RenewSequence != 0 && in.Sequence == s.RenewSequence:
			// A repeat of the accepted renewal after the end asks for
			// nothing new: a duplicate, as before the end (lease.Step since
			// the forty-fourth pass).
			return s, duplicate
		case s.State != active, in.Sequence < s.RenewSequence:
			return s, rejected
		case in.Sequence == s.RenewSequence:
			return s, duplicate
		case s.CancelRequested, s.Conflict:
			// A recorded conflict halts: authority is not extended.
			return s, rejected
		}
		s.RenewSequence = in.Sequence
		return s, accepted
	case OpProgress:
		switch {
		case (s.State == expired || s.State == terminal) && s.ProgressSequence != 0 && in.Sequence == s.ProgressSequence && in.Value == s.ProgressValue:
			// A repeat of the accepted progress after the end reports
			// nothing new: a duplicate (lease.Step since the forty-second
			// pass).
			return s, duplicate
		case s.State != active, in.Sequence < s.ProgressSequence:
			return s, rejected
		case in.Sequence == s.ProgressSequence && in.Value == s.ProgressValue:
			return s, duplicate
		case in.Sequence == s.ProgressSequence, s.CancelRequested, s.Conflict:
			return s, rejected
		}
		s.ProgressSequence, s.ProgressValue = in.Sequence, in.Value
		return s, accepted
	case OpCancelAck:
		switch {
		case s.State == terminal && s.CancelAck && s.Result == cancelled:
			// Acknowledged already: by an earlier CancelAck, or by the
			// holder's CANCELLED that overtook this one.
			return s, duplicate
		case s.State == terminal && s.CancelAck:
			return s, duplicate
		case s.State == terminal && s.Result == tetherv1.TerminalResult_TERMINAL_RESULT_FAILED && s.CancelRequested && s.Acked && !s.Lapsed && !s.ClosedByResolve:
			// A holder's FAILED that overtook the acknowledgement of a
			// generation that had authority at the end leaves it to
			// record (seed §9, §15). A FAILED the coordinator resolved
			// for want of the acknowledgement does not: a late ack would
			// read as though the holder had answered.
		case s.State != offered && s.State != active, !s.CancelRequested:
			return s, rejected
		case s.CancelAck:
			return s, duplicate
		}
		s.CancelAck = true
		return s, accepted
	case OpComplete:
		switch {
		case s.State == terminal && s.Result == in.Result && !s.ClosedByResolve:
			return s, duplicate
		case s.State != active, s.Conflict,
			in.Result == success && s.CancelRequested,
			in.Result == cancelled && !s.CancelRequested:
			return s, rejected
		}
		s.State, s.Result, s.ClosedByResolve = terminal, in.Result, false
		if in.Result == cancelled {
			// The holder's CANCELLED acknowledges the cancel request it
			// answers, whether or not its CancelAck came first.
			s.CancelAck = true
		}
		return s, accepted
	}
	return s, rejected
}
