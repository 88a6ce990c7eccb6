package lease

import (
	"fmt"
	"time"

	"github.com/tetherhq/tether/internal/enumname"
)

// AckMissPolicy says what follows a missed ACK deadline.
type AckMissPolicy int32

const (
	// AckMissExpire: the generation expires and stays EXPIRED until the
	// coordinator reassigns or resolves the job.
	AckMissExpire AckMissPolicy = iota
	// AckMissReassign: the generation expires, and ReassignDue tells the
	// shell to issue an automatic Reassign (generation + 1) — unless an
	// ownership conflict or a cancel request is recorded, or the job has
	// already been reassigned automatically Policy.MaxAutoReassigns times
	// in a row; then the ACK miss leaves it EXPIRED, as under
	// AckMissExpire.
	AckMissReassign
)

func (a AckMissPolicy) String() string {
	return enumname.Of([]string{"expire", "reassign"}, a, "UNKNOWN")
}

// RestartPolicy says what a coordinator restart does to pending deadlines.
type RestartPolicy int32

const (
	// RestartExtend: a deadline that fell while the coordinator was down is
	// extended to at least RestartGrace after the restart, spread over
	// RestartSpread (see PlanRestart), because the holder had no coordinator
	// to renew or ACK with. Deadlines that passed while it was still up
	// expire as usual. An EXPIRED generation is never revived.
	RestartExtend RestartPolicy = iota
	// RestartStrict: deadlines are absolute; everything that fell during
	// the downtime expires on the first Tick after the restart.
	RestartStrict
)

func (r RestartPolicy) String() string {
	return enumname.Of([]string{"extend", "strict"}, r, "UNKNOWN")
}

// Policy is the coordinator's declared time policy. Every time-dependent
// decision in Step follows from it and from the now passed in; it is
// published (GetPolicy) so a reviewer can re-derive each decision.
type Policy struct {
	// ClockSource names where now comes from. Expiry is decided on this
	// clock only, never on a worker's sent_at.
	ClockSource string
	// SkewAllowance is how far a worker's sent_at may differ from the
	// coordinator's clock before the decision reason notes it. It never
	// extends or shortens authority.
	SkewAllowance time.Duration
	// DefaultLeaseDuration is what the RPC layer offers when a request
	// leaves the duration out; MaxLeaseDuration bounds any lease duration
	// and any ACK timeout.
	DefaultLeaseDuration time.Duration
	MaxLeaseDuration     time.Duration
	// DefaultAckTimeout applies when an offer leaves the ACK timeout at 0.
	DefaultAckTimeout time.Duration
	// MaxUnresolvedBound bounds an UNRESOLVED result; when it elapses the
	// job is closed as FAILED (it never proved success).
	MaxUnresolvedBound time.Duration
	AckMiss            AckMissPolicy
	// MaxAutoReassigns bounds the automatic reassignments of AckMissReassign
	// in a row (Lease.AutoReassigns): when a job has had this many and its
	// generation misses the ACK deadline again, it stays EXPIRED until the
	// coordinator reassigns or resolves it. A holder that never ACKs thus
	// costs at most MaxAutoReassigns+1 generations and 2·MaxAutoReassigns+1
	// evidence rows, not a row pair per ACK timeout for ever.
	MaxAutoReassigns uint64
	Restart          RestartPolicy
	// RestartGrace is the minimum remaining window a restart leaves to a
	// lease whose deadline fell during the downtime; RestartSpread is the
	// window over which those extended deadlines are spread so they do not
	// all fall at once.
	RestartGrace  time.Duration
	RestartSpread time.Duration
}

// DefaultPolicy is the policy Tether runs with unless configured otherwise:
//
//	clock source            coordinator wall clock (UTC), read by the lease owner per decision
//	skew allowance          2s
//	default lease duration  30s
//	max lease duration      10m
//	default ack timeout     10s
//	max unresolved bound    24h
//	ack miss                expire (a scheduler decides who gets the job next)
//	max auto reassigns      3 (used only under ack miss reassign)
//	restart                 extend: grace 30s, spread over 15s
func DefaultPolicy() Policy {
	return Policy{
		ClockSource:          "coordinator wall clock (UTC), read by the lease owner once per decision",
		SkewAllowance:        2 * time.Second,
		DefaultLeaseDuration: 30 * time.Second,
		MaxLeaseDuration:     10 * time.Minute,
		DefaultAckTimeout:    10 * time.Second,
		MaxUnresolvedBound:   24 * time.Hour,
		AckMiss:              AckMissExpire,
		MaxAutoReassigns:     DefaultMaxAutoReassigns,
		Restart:              RestartExtend,
		RestartGrace:         30 * time.Second,
		RestartSpread:        15 * time.Second,
	}
}

// DefaultMaxAutoReassigns is DefaultPolicy's MaxAutoReassigns;
// MaxAutoReassignsLimit is the largest Validate accepts.
const (
	DefaultMaxAutoReassigns uint64 = 3
	MaxAutoReassignsLimit   uint64 = 100
)

// Validate reports whether the policy is coherent.
func (p Policy) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidPolicy}, args...)...)
	}
	switch {
	case p.ClockSource == "":
		return bad("clock source must be declared")
	case p.SkewAllowance < 0:
		return bad("negative skew allowance %s", p.SkewAllowance)
	case p.MaxLeaseDuration <= 0:
		return bad("max lease duration %s must be positive", p.MaxLeaseDuration)
	case p.DefaultLeaseDuration <= 0 || p.DefaultLeaseDuration > p.MaxLeaseDuration:
		return bad("default lease duration %s outside (0, %s]", p.DefaultLeaseDuration, p.MaxLeaseDuration)
	case p.DefaultAckTimeout <= 0 || p.DefaultAckTimeout > p.MaxLeaseDuration:
		return bad("default ack timeout %s outside (0, %s]", p.DefaultAckTimeout, p.MaxLeaseDuration)
	case p.MaxUnresolvedBound <= 0:
		return bad("max unresolved bound %s must be positive", p.MaxUnresolvedBound)
	case p.AckMiss != AckMissExpire && p.AckMiss != AckMissReassign:
		return bad("unknown ack miss policy %d", p.AckMiss)
	case p.AckMiss == AckMissReassign && (p.MaxAutoReassigns < 1 || p.MaxAutoReassigns > MaxAutoReassignsLimit):
		return bad("max automatic reassignments %d outside [1, %d] under ack miss policy reassign", p.MaxAutoReassigns, MaxAutoReassignsLimit)
	case p.Restart != RestartExtend && p.Restart != RestartStrict:
		return bad("unknown restart policy %d", p.Restart)
	case p.Restart == RestartExtend && p.RestartGrace <= 0:
		return bad("restart grace %s must be positive when restarts extend leases", p.RestartGrace)
	case p.RestartSpread < 0:
		return bad("negative restart spread %s", p.RestartSpread)
	}
	return nil
}

// AckMissBehavior describes the ACK-miss policy for publication
// (tether.v1.LeasePolicy.ack_miss_policy).
func (p Policy) AckMissBehavior() string {
	if p.AckMiss == AckMissReassign {
		return fmt.Sprintf("reassign: a missed ACK expires the generation and the coordinator automatically offers generation + 1, "+
			"unless an ownership conflict or a cancel request is recorded or the holder cannot take work (being stopped, stopped, its exit claimed), at most %d times in a row; "+
			"after that a missed ACK leaves the job EXPIRED until the coordinator reassigns or resolves it", p.MaxAutoReassigns)
	}
	return "expire: a missed ACK expires the generation; the coordinator reassigns or resolves the job explicitly"
}

// RestartBehavior describes the restart policy for publication
// (tether.v1.LeasePolicy.restart_behavior).
func (p Policy) RestartBehavior() string {
	if p.Restart == RestartStrict {
		return "strict: deadlines are absolute; leases whose deadline fell while the coordinator was down expire on restart"
	}
	return fmt.Sprintf("extend: a deadline that fell while the coordinator was down is moved to at least %s after the restart, "+
		"spread over %s; deadlines that passed before the coordinator stopped expire; expired generations are never revived",
		p.RestartGrace, p.RestartSpread)
}

// ReassignDue reports whether the policy wants the shell to reassign the
// job automatically now: its generation missed the ACK deadline, the policy
// is AckMissReassign, and nothing recorded (an ownership conflict, a cancel
// request, a terminal result) calls for a human instead, and the job has
// had fewer than p.MaxAutoReassigns automatic reassignments in a row. The
// shell then picks a holder and steps AutomaticReassign's message.
func ReassignDue(l Lease, p Policy) bool {
	return p.AckMiss == AckMissReassign &&
		l.State == StateExpired &&
		l.AckState == AckMissed &&
		!l.OwnershipConflict &&
		!l.CancelRequested &&
		!AutoReassignsExhausted(l, p)
}

// AutomaticReassign is the reassignment ReassignDue asks the shell to
// step: generation + 1 of l's job to holder under leaseID, automatic,
// naming l's generation (the one that missed its ACK), for l's lease
// duration within the policy in force — at most p.MaxLeaseDuration. A job
// offered under a policy that allowed longer leases (the coordinator
// restarted with a lower maximum) is reassigned for the maximum: built
// with the lease's own duration, the reassignment was refused as
// malformed, the job stayed due for one, and a shell that stepped it again
// after each refusal never stopped (a rogue holder had only to let its
// ACK deadline pass). A shell steps it once per judgement, never again
// after its refusal.
func AutomaticReassign(l Lease, p Policy, leaseID, holder string) Reassign {
	duration := l.LeaseDuration
	if duration > p.MaxLeaseDuration {
		duration = p.MaxLeaseDuration
	}
	return Reassign{
		JobID:          l.JobID,
		Generation:     l.Generation,
		LeaseID:        leaseID,
		HolderIdentity: holder,
		LeaseDuration:  duration,
		Reason:         fmt.Sprintf("generation %d missed its ACK deadline; policy %s", l.Generation, p.AckMiss),
		Automatic:      true,
	}
}

// AutoReassignsExhausted reports whether the job has used up the automatic
// reassignments the reassign policy allows in a row.
func AutoReassignsExhausted(l Lease, p Policy) bool {
	return p.AckMiss == AckMissReassign && l.AutoReassigns >= p.MaxAutoReassigns
}
