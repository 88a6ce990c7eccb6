package lease

import "errors"

// Sentinel errors. Decision.Err wraps exactly one of them for every
// rejection; Validate and Policy.Validate return wrapped ErrInvalidMessage
// and ErrInvalidPolicy. Check with errors.Is.
var (
	// ErrInvalidMessage: the message is malformed (missing ids, zero
	// generation or sequence, a duration outside the policy, oversized
	// fields). Nothing was judged.
	ErrInvalidMessage = errors.New("lease: invalid message")
	// ErrInvalidPolicy: the policy handed to Step does not validate.
	ErrInvalidPolicy = errors.New("lease: invalid policy")
	// ErrUnknownLease: no lease exists for the job, or the lease id does
	// not name the current generation's lease.
	ErrUnknownLease = errors.New("lease: unknown lease")
	// ErrInvalidTransition: the message is well formed but not allowed in
	// the lease's state (renew before ACK, reassign after a terminal, …).
	ErrInvalidTransition = errors.New("lease: invalid transition")
	// ErrStaleGeneration: the message belongs to an older generation.
	ErrStaleGeneration = errors.New("lease: stale generation")
	// ErrFutureGeneration: the message names a generation never issued.
	ErrFutureGeneration = errors.New("lease: future generation")
	// ErrHolderMismatch: the caller is not the holder of the generation.
	ErrHolderMismatch = errors.New("lease: holder mismatch")
	// ErrOwnershipConflict: a second holder claimed the active generation,
	// or the operation needs the recorded conflict resolved first.
	ErrOwnershipConflict = errors.New("lease: ownership conflict")
	// ErrLeaseExpired: the generation's authority ended on the coordinator's
	// clock.
	ErrLeaseExpired = errors.New("lease: lease expired")
	// ErrAckDeadlineMissed: the ACK arrived after its deadline.
	ErrAckDeadlineMissed = errors.New("lease: ack deadline missed")
	// ErrStaleSequence: a renew sequence lower than the one accepted.
	ErrStaleSequence = errors.New("lease: stale sequence")
	// ErrLateProgress: progress that cannot advance the record (lower
	// sequence, after cancellation, expiry or a terminal result).
	ErrLateProgress = errors.New("lease: late progress")
	// ErrConflictingDuplicate: a sequence already accepted, resent with
	// different content.
	ErrConflictingDuplicate = errors.New("lease: conflicting duplicate")
	// ErrCancelRequested: the operation is refused because the coordinator
	// asked the job to stop.
	ErrCancelRequested = errors.New("lease: cancel requested")
	// ErrTerminal: the job already has a (different) terminal result.
	ErrTerminal = errors.New("lease: job is terminal")
	// ErrNotDue: a Tick found no deadline that had passed.
	ErrNotDue = errors.New("lease: nothing due")
)
