package lease

import "github.com/tetherhq/tether/internal/fault"

// Sentinel errors. Decision.Err wraps exactly one of them for every
// rejection; Validate and Policy.Validate return wrapped ErrInvalidMessage
// and ErrInvalidPolicy. Check with errors.Is.
var (
	// ErrInvalidMessage: the message is malformed (missing ids, zero
	// generation or sequence, a duration outside the policy, oversized
	// fields). Nothing was judged.
	ErrInvalidMessage = fault.New(fault.Invalid, "lease: invalid message")
	// ErrInvalidPolicy: the policy handed to Step does not validate.
	ErrInvalidPolicy = fault.New(fault.Internal, "lease: invalid policy")
	// ErrUnknownLease: no lease exists for the job, or the lease id does
	// not name the current generation's lease.
	ErrUnknownLease = fault.New(fault.NotFound, "lease: unknown lease")
	// ErrInvalidTransition: the message is well formed but not allowed in
	// the lease's state (renew before ACK, reassign after a terminal, …).
	ErrInvalidTransition = fault.New(fault.Precondition, "lease: invalid transition")
	// ErrStaleGeneration: the message belongs to an older generation.
	ErrStaleGeneration = fault.New(fault.Precondition, "lease: stale generation")
	// ErrFutureGeneration: the message names a generation never issued.
	ErrFutureGeneration = fault.New(fault.Invalid, "lease: future generation")
	// ErrHolderMismatch: the caller is not the holder of the generation.
	ErrHolderMismatch = fault.New(fault.Denied, "lease: holder mismatch")
	// ErrOwnershipConflict: a second holder claimed the active generation,
	// or the operation needs the recorded conflict resolved first.
	ErrOwnershipConflict = fault.New(fault.Precondition, "lease: ownership conflict")
	// ErrLeaseExpired: the generation's authority ended on the coordinator's
	// clock.
	ErrLeaseExpired = fault.New(fault.Precondition, "lease: lease expired")
	// ErrAckDeadlineMissed: the ACK arrived after its deadline.
	ErrAckDeadlineMissed = fault.New(fault.Precondition, "lease: ack deadline missed")
	// ErrStaleSequence: a renew sequence lower than the one accepted.
	ErrStaleSequence = fault.New(fault.Precondition, "lease: stale sequence")
	// ErrLateProgress: progress that cannot advance the record (lower
	// sequence, after cancellation, expiry or a terminal result).
	ErrLateProgress = fault.New(fault.Precondition, "lease: late progress")
	// ErrConflictingDuplicate: a sequence already accepted, resent with
	// different content; or a terminal result the job already has, in
	// other words than the record's (a Complete's detail, a Resolve's
	// reason).
	ErrConflictingDuplicate = fault.New(fault.Invalid, "lease: conflicting duplicate")
	// ErrCancelRequested: the operation is refused because the coordinator
	// asked the job to stop.
	ErrCancelRequested = fault.New(fault.Precondition, "lease: cancel requested")
	// ErrTerminal: the job already has a (different) terminal result.
	ErrTerminal = fault.New(fault.Precondition, "lease: job is terminal")
	// ErrNotDue: a Tick found no deadline that had passed.
	ErrNotDue = fault.New(fault.Internal, "lease: nothing due")
)
