package lease

import (
	"time"

	"github.com/tetherhq/tether/internal/enumname"
)

// State is where a job's lease is in its lifecycle. The numeric values are
// those of tether.v1.LeaseState, so the RPC layer converts with a cast.
type State int32

const (
	// StateUnspecified is the zero value: no lease exists for the job yet.
	StateUnspecified State = 0
	// StateOffered: the job was delivered to a holder, who has no authority
	// until it ACKs before the ACK deadline.
	StateOffered State = 1
	// StateAcked: the holder accepted the offer. Step passes through ACKED
	// and lands in ACTIVE within the same decision; it is recorded as an
	// event, never persisted on its own.
	StateAcked State = 2
	// StateActive: the holder has execution authority for this generation
	// until ExpiresAt on the coordinator's clock.
	StateActive State = 3
	// StateExpired: the generation's authority ended (lease expired or ACK
	// deadline missed). An expired generation is never revived; the job
	// continues only through Reassign (a new generation) or Resolve.
	StateExpired State = 4
	// StateTerminal: the job has a terminal result. SUCCESS, FAILED and
	// CANCELLED never change; UNRESOLVED is a bounded, provisional
	// reconciliation that can only be replaced by FAILED or CANCELLED.
	StateTerminal State = 5
)

var stateNames = [...]string{"UNSPECIFIED", "OFFERED", "ACKED", "ACTIVE", "EXPIRED", "TERMINAL"}

func (s State) String() string { return enumname.Of(stateNames[:], s, "UNKNOWN") }

// AckState records whether the holder of the current generation accepted the
// offer. Values equal tether.v1.AckState.
type AckState int32

const (
	AckUnspecified AckState = 0
	// AckPending: offered, waiting for the ACK.
	AckPending AckState = 1
	// AckAcked: the ACK arrived before the deadline. It means "accepted",
	// never "done".
	AckAcked AckState = 2
	// AckMissed: the deadline passed without an ACK.
	AckMissed AckState = 3
)

var ackStateNames = [...]string{"UNSPECIFIED", "PENDING", "ACKED", "MISSED"}

func (a AckState) String() string { return enumname.Of(ackStateNames[:], a, "UNKNOWN") }

// TerminalResult is how a job ended. Values equal tether.v1.TerminalResult.
type TerminalResult int32

const (
	// ResultUnspecified: the job has no terminal result.
	ResultUnspecified TerminalResult = 0
	// ResultSuccess is only ever reported by the holder of the active
	// generation (Complete); the coordinator cannot declare success.
	ResultSuccess TerminalResult = 1
	ResultFailed  TerminalResult = 2
	// ResultCancelled needs a cancel request: the holder confirms it
	// stopped (Complete), or the coordinator reconciles (Resolve).
	ResultCancelled TerminalResult = 3
	// ResultUnresolved is the coordinator's bounded "we cannot tell yet":
	// it holds until UnresolvedUntil, after which the job is FAILED.
	ResultUnresolved TerminalResult = 4
)

var resultNames = [...]string{"UNSPECIFIED", "SUCCESS", "FAILED", "CANCELLED", "UNRESOLVED"}

func (r TerminalResult) String() string { return enumname.Of(resultNames[:], r, "UNKNOWN") }

// Final reports whether r is a result that can never change again.
func (r TerminalResult) Final() bool {
	return r == ResultSuccess || r == ResultFailed || r == ResultCancelled
}

// Lease is the complete record of one job's lease: its current generation,
// the authority window, the sequences accepted so far, cancellation, the
// terminal result and the evidence flags. It is a plain value with no
// references, so Step can take and return it by value and stay pure. Field
// names mirror tether.v1.Lease.
type Lease struct {
	JobID string
	// LeaseID identifies one generation's lease; a new generation always
	// gets a new id.
	LeaseID string
	// Generation is the fencing token: it only ever increases, and a
	// message from a lower generation never changes authority.
	Generation     uint64
	HolderIdentity string
	// IssuedAt is when the current generation was offered.
	IssuedAt      time.Time
	LeaseDuration time.Duration
	// ExpiresAt is the authority boundary on the coordinator's clock. It is
	// zero while the generation is only offered: an offer carries no
	// execution authority.
	ExpiresAt   time.Time
	AckDeadline time.Time
	AckState    AckState
	State       State

	// RenewSequence is the highest renew sequence accepted for this
	// generation, RenewTime the coordinator time at which it was accepted.
	RenewSequence uint64
	RenewTime     time.Time
	// ProgressSequence is the highest progress sequence accepted for this
	// generation, ProgressValue the value it carried.
	ProgressSequence uint64
	ProgressValue    string

	CancelRequested   bool
	CancelRequestedAt time.Time
	CancelAck         bool
	CancelAckedAt     time.Time

	TerminalResult TerminalResult
	TerminalAt     time.Time
	TerminalDetail string
	// UnresolvedUntil bounds an UNRESOLVED result.
	UnresolvedUntil time.Time

	// Evidence flags. StaleGeneration and LateProgress are sticky for the
	// job: once stale or late traffic was seen, the record says so.
	// LeaseExpired describes the current generation. OwnershipConflict
	// stays set until the coordinator explicitly resolves it.
	StaleGeneration   bool
	LateProgress      bool
	LeaseExpired      bool
	OwnershipConflict bool
	// ConflictHolder is the first other identity that claimed the active
	// generation.
	ConflictHolder string

	// Kubernetes-style views. AcquireTime: when the current holder's ACK
	// made the generation active. LastRenewTime: when the current authority
	// window last started (the ACK, a renew, or a restart extension).
	// Transitions: how many times the job passed to a new generation.
	AcquireTime   time.Time
	LastRenewTime time.Time
	Transitions   uint64
	// AutoReassigns counts the automatic reassignments (ack-miss policy
	// reassign) since the job's last offer or explicit reassignment; see
	// Policy.MaxAutoReassigns.
	AutoReassigns uint64

	// Owner is the agent that offered the job (its node id), or "" when an
	// operator did. It is recorded by the first Offer and never changes:
	// the shell lets the owner and its ancestors coordinate the job while
	// its holder is an agent of the owner's tree (once an operator moves
	// the job to another tree, the owner's tree is a stranger to it).
	Owner string
	// FormerHolders are the most recent earlier holders of the job (up to
	// MaxFormerHolders, oldest first, never the current holder). They
	// stay parties to the job: their late traffic is judged and recorded
	// as stale evidence rather than refused as a stranger's. A fixed array
	// keeps Lease a comparable value with no references.
	FormerHolders [MaxFormerHolders]string

	// ResolvedByCoordinator says the terminal result is the coordinator's
	// (Resolve, or the FAILED an UNRESOLVED's bound closed as), not the
	// holder's Complete: the job was closed on the coordinator's word,
	// and a cancel acknowledgement the holder sends after it is refused
	// (only the holder's own FAILED can overtake an acknowledgement it
	// sent first).
	ResolvedByCoordinator bool
}

// MaxFormerHolders bounds Lease.FormerHolders. A holder more than this many
// holders back is a stranger to the job again.
const MaxFormerHolders = 8

// Party reports whether a worker message from identity claiming
// generation should reach Step without further authorisation: it comes
// from the current holder (any generation: its own stale traffic is
// evidence), or from a former holder about an earlier generation (its late
// traffic is stale evidence). A former holder claiming the current
// generation is not a party: it does not hold it, and letting its claim
// through would let any earlier holder record an ownership conflict and
// halt the job. It is O(1) for the current holder (the renew hot path).
func (l Lease) Party(identity string, generation uint64) bool {
	if identity == "" || !l.Exists() {
		return false
	}
	if identity == l.HolderIdentity {
		return true
	}
	if generation >= l.Generation {
		return false
	}
	for _, h := range l.FormerHolders {
		if h == identity {
			return true
		}
	}
	return false
}

// rememberHolder adds the outgoing holder to FormerHolders when the job
// passes to next, dropping the oldest when the list is full.
func (l *Lease) rememberHolder(outgoing, next string) {
	if outgoing == "" || outgoing == next {
		return
	}
	kept := l.FormerHolders[:0:0]
	for _, h := range l.FormerHolders {
		if h != "" && h != outgoing && h != next {
			kept = append(kept, h)
		}
	}
	kept = append(kept, outgoing)
	if len(kept) > MaxFormerHolders {
		kept = kept[len(kept)-MaxFormerHolders:]
	}
	l.FormerHolders = [MaxFormerHolders]string{}
	copy(l.FormerHolders[:], kept)
}

// Exists reports whether the record holds a lease (anything but the zero
// value a store returns for an unknown job).
func (l Lease) Exists() bool { return l.State != StateUnspecified }

// Authority reports who may execute the job at now: the holder and
// generation of an ACTIVE, unexpired lease without an ownership conflict.
// A tool gate or scheduler asks this; it never changes the lease.
func (l Lease) Authority(now time.Time) (holder string, generation uint64, ok bool) {
	if l.State != StateActive || !now.Before(l.ExpiresAt) || l.OwnershipConflict {
		return "", 0, false
	}
	return l.HolderIdentity, l.Generation, true
}

// NextDeadline is the coordinator time at which the lease needs a Tick: the
// ACK deadline of an offer, the expiry of an active lease, or the bound of
// an UNRESOLVED result. ok is false when nothing is pending.
func NextDeadline(l Lease) (at time.Time, ok bool) {
	switch l.State {
	case StateOffered:
		return l.AckDeadline, true
	case StateActive:
		return l.ExpiresAt, true
	case StateTerminal:
		if l.TerminalResult == ResultUnresolved {
			return l.UnresolvedUntil, true
		}
	}
	return time.Time{}, false
}

// Due reports whether the coordinator's clock at now has reached the
// lease's next deadline: the record no longer says what the clock decided
// (an ACTIVE lease past its expiry, an offer past its ACK deadline, an
// UNRESOLVED result past its bound) until a Tick, or any message, is
// judged. A read of such a record must not be answered as it stands.
func Due(l Lease, now time.Time) bool {
	at, ok := NextDeadline(l)
	return ok && !now.Before(at)
}
