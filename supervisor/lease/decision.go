package lease

import (
	"fmt"
	"time"

	"github.com/tetherhq/tether/internal/enumname"
)

// Outcome is the answer to one message. Values equal tether.v1.Outcome.
type Outcome int32

const (
	OutcomeUnspecified Outcome = 0
	// OutcomeAccepted: the message changed the lease.
	OutcomeAccepted Outcome = 1
	// OutcomeDuplicate: the message repeats one already applied; nothing
	// changed and nothing needed to.
	OutcomeDuplicate Outcome = 2
	// OutcomeRejected: the message was refused. Its authority fields were
	// not applied; evidence flags may have been set.
	OutcomeRejected Outcome = 3
)

var outcomeNames = [...]string{"UNSPECIFIED", "ACCEPTED", "DUPLICATE", "REJECTED"}

func (o Outcome) String() string { return enumname.Of(outcomeNames[:], o, "UNKNOWN") }

// AuditEvent names what a decision did or why it refused. Values and names
// equal tether.v1.AuditEvent without the AUDIT_EVENT_ prefix.
type AuditEvent int32

const (
	EventUnspecified       AuditEvent = 0
	EventOffered           AuditEvent = 1
	EventAcked             AuditEvent = 2
	EventRenewed           AuditEvent = 3
	EventProgressRecorded  AuditEvent = 4
	EventCancelRequested   AuditEvent = 5
	EventCancelAcked       AuditEvent = 6
	EventTerminalAccepted  AuditEvent = 7
	EventReassigned        AuditEvent = 8
	EventResolved          AuditEvent = 9
	EventStaleGeneration   AuditEvent = 10
	EventLateProgress      AuditEvent = 11
	EventDuplicateRenew    AuditEvent = 12
	EventDuplicateTerminal AuditEvent = 13
	EventLeaseExpired      AuditEvent = 14
	EventOwnershipConflict AuditEvent = 15
	EventHolderMismatch    AuditEvent = 16
	EventAckDeadlineMissed AuditEvent = 17
	EventDuplicateAck      AuditEvent = 18
	EventDuplicateProgress AuditEvent = 19
	EventFutureGeneration  AuditEvent = 20
	EventInvalidTransition AuditEvent = 21
	EventUnknownLease      AuditEvent = 22
	EventStaleRenew        AuditEvent = 23
	EventDuplicateCancel   AuditEvent = 24
)

var auditEventNames = [...]string{
	"UNSPECIFIED", "OFFERED", "ACKED", "RENEWED", "PROGRESS_RECORDED",
	"CANCEL_REQUESTED", "CANCEL_ACKED", "TERMINAL_ACCEPTED", "REASSIGNED",
	"RESOLVED", "STALE_GENERATION", "LATE_PROGRESS", "DUPLICATE_RENEW",
	"DUPLICATE_TERMINAL", "LEASE_EXPIRED", "OWNERSHIP_CONFLICT",
	"HOLDER_MISMATCH", "ACK_DEADLINE_MISSED", "DUPLICATE_ACK",
	"DUPLICATE_PROGRESS", "FUTURE_GENERATION", "INVALID_TRANSITION",
	"UNKNOWN_LEASE", "STALE_RENEW", "DUPLICATE_CANCEL",
}

func (e AuditEvent) String() string { return enumname.Of(auditEventNames[:], e, "UNKNOWN") }

// Decision is the answer to one message: the outcome, the audit event it
// produced and a reason a reviewer can read without other context (it names
// the message's identity, generation and sequence and the state it was
// judged against).
type Decision struct {
	Outcome Outcome
	Event   AuditEvent
	Reason  string

	// cause is the sentinel behind a rejection, exposed through Err.
	cause error
}

// String renders the decision as "OUTCOME EVENT: reason".
func (d Decision) String() string {
	return fmt.Sprintf("%s %s: %s", d.Outcome, d.Event, d.Reason)
}

// Err is nil unless the message was rejected; then it wraps one of the
// package's sentinel errors (ErrStaleGeneration, ErrHolderMismatch, …) with
// the reason; the sentinel's category (internal/fault) picks the status
// code a caller that returns it as an error would answer with. A
// rejection is still an answered message: the caller persists its evidence
// row either way.
func (d Decision) Err() error {
	if d.Outcome != OutcomeRejected {
		return nil
	}
	cause := d.cause
	if cause == nil {
		cause = ErrInvalidTransition
	}
	return fmt.Errorf("%w: %s", cause, d.Reason)
}

// Event is one thing that happened while Step judged a message, in order.
// Transition events are edges of the lifecycle (CanTransition(From, To));
// the others record a judgement without changing state, with From == To.
// Events chain: the first starts at the lease's old state, each starts
// where the previous ended, the last ends at the new state. The last event
// carries the decision's own audit event. Earlier ones are what the
// coordinator's clock forced before the message was judged (an expiry
// observed on its arrival), or the first edge of a two-edge decision
// (OFFERED -> ACKED -> ACTIVE).
type Event struct {
	Audit      AuditEvent
	Generation uint64
	From, To   State
	Transition bool
	At         time.Time
}

func (e Event) String() string {
	if !e.Transition {
		return fmt.Sprintf("%s gen %d (%s)", e.Audit, e.Generation, e.From)
	}
	return fmt.Sprintf("%s gen %d %s->%s", e.Audit, e.Generation, e.From, e.To)
}
