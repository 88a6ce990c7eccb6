package lease

import (
	"fmt"
	"math"
	"strings"
	"time"
	"unicode/utf8"
)

// Step judges one message against a job's lease at coordinator time now,
// under policy p, and returns the new lease, the decision and the events
// that led to it. It is the only way a lease changes.
//
// Step is a pure function: the same inputs always give the same outputs,
// and it reads no clock, store or global. Before judging, it applies what
// the clock already decided — an OFFERED lease past its ACK deadline or an
// ACTIVE lease past ExpiresAt is EXPIRED, an UNRESOLVED result past its
// bound is FAILED — so a message is always judged against now, whether or
// not a Tick ran. now is the coordinator's time for the message (the time
// the server received it); the worker's SentAt is evidence only.
//
// Every message gets a decision, rejected ones included; a rejection never
// applies the message's authority fields, but may set evidence flags
// (StaleGeneration, LateProgress, OwnershipConflict). A DUPLICATE changes
// nothing beyond what the clock forced.
//
// Step refuses illegal edges: every state change goes through CanTransition,
// and the result is checked against the lease's invariants (generation never
// decreases, a final result never changes, an expired generation never comes
// back). A violation — a bug, never an input — returns the lease unchanged
// with REJECTED INVALID_TRANSITION.
func Step(l Lease, m Message, now time.Time, p Policy) (Lease, Decision, []Event) {
	j := judge{l: l, now: now, p: p}
	d := j.run(m)
	if j.illegal == nil {
		j.illegal = guard(l, j.l)
	}
	if j.illegal != nil {
		d = reject(EventInvalidTransition, ErrInvalidTransition,
			"%s refused: it would take the lease through an illegal edge (%v); nothing changed", describeSafe(m), j.illegal)
		return l, d, []Event{{Audit: d.Event, Generation: l.Generation, From: l.State, To: l.State, At: now}}
	}
	d.Reason = j.compose(m, d.Reason)
	if d.Outcome != OutcomeAccepted {
		// A refused or repeated coordinator message is evidence too: its
		// row says who sent it and why (the RPC layer begins the reason
		// with the sender's principal), as an accepted one's does.
		if why := coordinatorReason(m); why != "" {
			d.Reason += fmt.Sprintf("; the %s's reason: %q", m.Kind(), clip(why))
		}
	}
	if len(j.events) == j.observed && !j.tickOwnsObserved {
		// The message itself changed no state: record its judgement.
		j.events = append(j.events, Event{Audit: d.Event, Generation: j.l.Generation, From: j.l.State, To: j.l.State, At: now})
	}
	return j.l, d, j.events
}

// CanTransition reports whether the lifecycle has an edge from one state to
// another:
//
//	(none)   -> OFFERED                       Offer
//	OFFERED  -> ACKED -> ACTIVE               Ack before the deadline
//	OFFERED  -> EXPIRED                       ACK deadline missed
//	ACTIVE   -> EXPIRED                       lease expired
//	OFFERED, ACTIVE, EXPIRED -> OFFERED       Reassign (generation + 1)
//	ACTIVE   -> TERMINAL                      Complete
//	OFFERED, ACTIVE, EXPIRED -> TERMINAL      Resolve
//	TERMINAL -> TERMINAL                      UNRESOLVED replaced by a final result
//
// ACKED never goes to TERMINAL: an ACK is never completion.
func CanTransition(from, to State) bool {
	switch from {
	case StateUnspecified:
		return to == StateOffered
	case StateOffered:
		return to == StateAcked || to == StateExpired || to == StateOffered || to == StateTerminal
	case StateAcked:
		return to == StateActive
	case StateActive:
		return to == StateExpired || to == StateOffered || to == StateTerminal
	case StateExpired:
		return to == StateOffered || to == StateTerminal
	case StateTerminal:
		return to == StateTerminal
	}
	return false
}

// guard checks the invariants that hold across every step, whatever the
// message.
func guard(pre, post Lease) error {
	switch {
	case post.Generation < pre.Generation:
		return fmt.Errorf("generation %d would go back to %d", pre.Generation, post.Generation)
	case pre.TerminalResult.Final() && (post.TerminalResult != pre.TerminalResult || post.State != StateTerminal):
		return fmt.Errorf("final result %s would change to %s (%s)", pre.TerminalResult, post.TerminalResult, post.State)
	case pre.State == StateExpired && post.Generation == pre.Generation && post.State != StateExpired && post.State != StateTerminal:
		return fmt.Errorf("expired generation %d would become %s", pre.Generation, post.State)
	case post.Generation == pre.Generation && pre.Exists() &&
		(post.ProgressSequence < pre.ProgressSequence || post.RenewSequence < pre.RenewSequence):
		return fmt.Errorf("sequences of generation %d would go back", pre.Generation)
	}
	return nil
}

// judge carries one Step's working state.
type judge struct {
	l       Lease
	now     time.Time
	p       Policy
	events  []Event
	notes   []string // what the clock forced before the message was judged
	illegal error
	// msg is the message being judged.
	msg Message
	// observed counts the events the clock forced; tickOwnsObserved says a
	// Tick's decision is that forced transition itself.
	observed         int
	tickOwnsObserved bool
}

func (j *judge) run(m Message) Decision {
	j.msg = m
	if err := j.p.Validate(); err != nil {
		return rejectErr(ErrInvalidPolicy, "%s not judged: %v", describeSafe(m), err)
	}
	if err := Validate(m, j.p); err != nil {
		return rejectErr(ErrInvalidMessage, "%s not judged: %v", describeSafe(m), err)
	}
	if j.l.Exists() && j.l.JobID != m.Job() {
		return reject(EventUnknownLease, ErrUnknownLease, "%s names job %q but the lease record is for job %q", describe(m), m.Job(), j.l.JobID)
	}
	if r, ok := m.(Recover); ok && j.l.Exists() {
		// Recovery decides for itself whether the clock already ended the
		// lease before the coordinator stopped.
		return j.recover(r)
	}
	if o, ok := m.(Offer); ok {
		if j.l.Exists() {
			j.observe()
		}
		return j.offer(o)
	}
	if !j.l.Exists() {
		return reject(EventUnknownLease, ErrUnknownLease, "%s: job %q has no lease", describe(m), m.Job())
	}
	j.observe()
	if d, ok := j.checkDecided(m); !ok {
		return d
	}
	switch m := m.(type) {
	case Ack:
		return j.ack(m)
	case Renew:
		return j.renew(m)
	case Progress:
		return j.progress(m)
	case CancelAck:
		return j.cancelAck(m)
	case Complete:
		return j.complete(m)
	case RequestCancel:
		return j.requestCancel(m)
	case Reassign:
		return j.reassign(m)
	case Resolve:
		return j.resolve(m)
	case Tick:
		return j.tick()
	}
	return rejectErr(ErrInvalidMessage, "unknown message type %T", m)
}

// move changes state along a legal edge and records the event.
func (j *judge) move(to State, audit AuditEvent) {
	from := j.l.State
	if !CanTransition(from, to) {
		if j.illegal == nil {
			j.illegal = fmt.Errorf("%s -> %s", from, to)
		}
		return
	}
	j.l.State = to
	j.events = append(j.events, Event{Audit: audit, Generation: j.l.Generation, From: from, To: to, Transition: true, At: j.now})
}

// observe applies what the coordinator's clock has already decided.
func (j *judge) observe() {
	l := &j.l
	switch l.State {
	case StateOffered:
		if !j.now.Before(l.AckDeadline) {
			l.AckState = AckMissed
			l.LeaseExpired = true
			j.move(StateExpired, EventAckDeadlineMissed)
			j.note("generation %d (lease %q, holder %q) missed its ACK deadline %s (observed at %s) and expired",
				l.Generation, l.LeaseID, l.HolderIdentity, ts(l.AckDeadline), ts(j.now))
			if AutoReassignsExhausted(*l, j.p) && !l.OwnershipConflict && !l.CancelRequested {
				j.note("no automatic reassignment: the job was already reassigned automatically %d times in a row (the ack-miss policy's maximum is %d); it stays EXPIRED until the coordinator reassigns or resolves it",
					l.AutoReassigns, j.p.MaxAutoReassigns)
			}
		}
	case StateActive:
		if !j.now.Before(l.ExpiresAt) {
			l.LeaseExpired = true
			j.move(StateExpired, EventLeaseExpired)
			j.note("generation %d (lease %q, holder %q) expired at %s (observed at %s); its authority ended",
				l.Generation, l.LeaseID, l.HolderIdentity, ts(l.ExpiresAt), ts(j.now))
		}
	}
	if l.State == StateExpired && l.CancelRequested {
		// The authority ended with the cancel request standing (or a
		// record stored before the close existed reads so).
		j.closeCancelLapsed(l.CancelRequestedAt)
	}
	j.boundUnresolved()
	j.observed = len(j.events)
}

// boundUnresolved closes an UNRESOLVED result whose bound the clock has
// reached as FAILED.
func (j *judge) boundUnresolved() {
	l := &j.l
	if l.State != StateTerminal || l.TerminalResult != ResultUnresolved || j.now.Before(l.UnresolvedUntil) {
		return
	}
	l.TerminalResult = ResultFailed
	l.TerminalAt = l.UnresolvedUntil
	l.TerminalDetail = fmt.Sprintf("unresolved bound elapsed without reconciliation; closed as FAILED, success was never proven (unresolved because: %s)", l.TerminalDetail)
	j.move(StateTerminal, EventResolved)
	j.note("UNRESOLVED bound %s elapsed (observed at %s); the job is FAILED", ts(l.UnresolvedUntil), ts(j.now))
}

// closeCancelLapsed is the explicit terminal reconciliation of an EXPIRED
// generation whose cancel request stands (seed §9: a cancellation ends in
// CANCELLED, FAILED or a bounded unresolved state, and the cancellation
// and expiry policy is authoritative). Nothing is left to decide but how
// the job ended: it can never be reassigned while the request stands, and
// its holder can no longer acknowledge or report a result. Left EXPIRED
// it stayed open for ever — counted in its holder's and lineage's bounds
// on open leases — unless someone resolved it, so a holder that never
// answered a cancel kept the job's place (thirty-eighth pass). It is
// closed UNRESOLVED, by the coordinator (ResolvedByCoordinator), from
// the later of the generation's end and the request, bounded by
// MaxUnresolvedBound, after which it is FAILED; the coordinator may
// reconcile it CANCELLED or FAILED meanwhile. requested is when the
// cancel was requested.
func (j *judge) closeCancelLapsed(requested time.Time) {
	l := &j.l
	at := l.ExpiresAt
	if l.AckState == AckMissed || at.IsZero() {
		at = l.AckDeadline
	}
	if requested.After(at) {
		at = requested
	}
	if at.After(j.now) {
		at = j.now
	}
	answered := "never acknowledged it nor reported a terminal result"
	if l.CancelAck {
		answered = fmt.Sprintf("acknowledged it at %s but reported no terminal result", ts(l.CancelAckedAt))
	}
	l.TerminalResult = ResultUnresolved
	l.TerminalAt = at
	l.UnresolvedUntil = at.Add(j.p.MaxUnresolvedBound)
	l.ResolvedByCoordinator = true
	l.TerminalDetail = fmt.Sprintf("cancellation was requested at %s and generation %d (holder %q) %s before its authority ended; whether the work stopped cannot be told: UNRESOLVED until %s, then FAILED, unless the coordinator reconciles it as CANCELLED or FAILED",
		ts(l.CancelRequestedAt), l.Generation, l.HolderIdentity, answered, ts(l.UnresolvedUntil))
	j.move(StateTerminal, EventResolved)
	j.note("the job is closed UNRESOLVED as of %s (observed at %s): %s", ts(at), ts(j.now), l.TerminalDetail)
}

// CancelLapsed reports whether l's UNRESOLVED result is the one the
// clock gave a generation whose authority ended with a cancel request
// standing (closeCancelLapsed): the job ended on no one's word, and a
// reconciliation that would have found the generation EXPIRED (a
// termination of its holder) may still decide it as it would have then.
func CancelLapsed(l Lease) bool {
	return l.State == StateTerminal && l.TerminalResult == ResultUnresolved && l.CancelRequested && l.LeaseExpired
}

func (j *judge) note(format string, args ...any) {
	j.notes = append(j.notes, fmt.Sprintf(format, args...))
}

// compose builds the final reason: what the clock forced, the judgement,
// and any note on the worker's clock.
func (j *judge) compose(m Message, reason string) string {
	var clockNote string
	if w, ok := m.(workerMessage); ok {
		if sent := w.claimed().SentAt; !sent.IsZero() {
			// Sub saturates for dates centuries off, and negating the
			// most negative Duration overflows: compare without negating.
			skew := j.now.Sub(sent)
			if skew > j.p.SkewAllowance || skew < -j.p.SkewAllowance {
				by := skew.String()
				if skew == math.MinInt64 || skew == math.MaxInt64 {
					by = "more than 290 years"
				}
				clockNote = fmt.Sprintf("worker sent_at %s differs from the coordinator clock by %s (allowance %s); sent_at is evidence only",
					ts(sent), by, j.p.SkewAllowance)
			}
		}
	}
	if len(j.notes) == 0 && clockNote == "" {
		return reason // what joining the one part gives, without the slice
	}
	parts := append(append([]string(nil), j.notes...), reason)
	if clockNote != "" {
		parts = append(parts, clockNote)
	}
	return strings.Join(parts, "; ")
}

// current describes the lease a message is judged against.
func (j *judge) current() string {
	l := j.l
	return fmt.Sprintf("generation %d (lease %q, holder %q) is %s", l.Generation, l.LeaseID, l.HolderIdentity, l.State)
}

// checkClaim rejects a worker message that does not speak for the current
// generation's lease and holder. It records stale traffic and ownership
// conflicts on the lease as evidence.
//
// c is the message's claim, and the message itself is j.msg: taking the
// message as an interface again here boxed every renewal a second time.
func (j *judge) checkClaim(c Claim) (Decision, bool) {
	m, l := j.msg, &j.l
	switch {
	case c.Generation < l.Generation:
		l.StaleGeneration = true
		return reject(EventStaleGeneration, ErrStaleGeneration,
			"%s is stale: %s; an older generation never regains authority, the message is kept as evidence only", describe(m), j.current()), false
	case c.Generation > l.Generation:
		return reject(EventFutureGeneration, ErrFutureGeneration,
			"%s names a generation never issued: %s", describe(m), j.current()), false
	case c.LeaseID != l.LeaseID:
		return reject(EventUnknownLease, ErrUnknownLease,
			"%s: lease %q is not generation %d's lease (%q)", describe(m), c.LeaseID, l.Generation, l.LeaseID), false
	case c.HolderIdentity != l.HolderIdentity:
		if l.State == StateActive {
			first := !l.OwnershipConflict
			l.OwnershipConflict = true
			if l.ConflictHolder == "" {
				l.ConflictHolder = c.HolderIdentity
			}
			how := "recorded"
			if !first {
				how = fmt.Sprintf("already recorded (first claimant %q)", l.ConflictHolder)
			}
			return reject(EventOwnershipConflict, ErrOwnershipConflict,
				"%s claims active generation %d held by %q: ownership conflict %s; execution halts: renewals no longer extend authority, progress is not applied, completion and automatic reassignment are refused until the coordinator resolves it",
				describe(m), l.Generation, l.HolderIdentity, how), false
		}
		return reject(EventHolderMismatch, ErrHolderMismatch,
			"%s: caller is not the holder; %s", describe(m), j.current()), false
	}
	return Decision{}, true
}

// checkDecided rejects a coordinator's decision (RequestCancel, Reassign,
// Resolve) that names a generation other than the current one: decided
// about a generation since replaced — delayed, or retried after it was
// applied — it must not apply to the one that replaced it. It is kept as
// evidence only and changes nothing, not even the lease's stale-traffic
// flag, which records the workers' traffic. A decision naming no
// generation is about the current one.
func (j *judge) checkDecided(m Message) (Decision, bool) {
	g := decidedGeneration(m)
	switch {
	case g == 0 || g == j.l.Generation:
		return Decision{}, true
	case g < j.l.Generation:
		return reject(EventStaleGeneration, ErrStaleGeneration,
			"%s decided about generation %d, which was replaced: %s; a decision about an earlier generation never applies to a later one, it is kept as evidence and changes nothing", describe(m), g, j.current()), false
	}
	return reject(EventFutureGeneration, ErrFutureGeneration,
		"%s names generation %d, never issued: %s; nothing changed", describe(m), g, j.current()), false
}

// decidedGeneration is the generation a coordinator's decision names (0:
// none, and for every other message).
func decidedGeneration(m Message) uint64 {
	switch m := m.(type) {
	case RequestCancel:
		return m.Generation
	case Reassign:
		return m.Generation
	case Resolve:
		return m.Generation
	}
	return 0
}

func (j *judge) offer(m Offer) Decision {
	if j.l.Exists() {
		return reject(EventInvalidTransition, ErrInvalidTransition,
			"%s refused: job %q already has a lease (%s); later generations come from Reassign", describe(m), m.JobID, j.current())
	}
	ackTimeout := m.AckTimeout
	if ackTimeout == 0 {
		ackTimeout = j.p.DefaultAckTimeout
	}
	j.l = Lease{
		JobID:          m.JobID,
		LeaseID:        m.LeaseID,
		Generation:     1,
		HolderIdentity: m.HolderIdentity,
		IssuedAt:       j.now,
		LeaseDuration:  m.LeaseDuration,
		AckDeadline:    j.now.Add(ackTimeout),
		AckState:       AckPending,
		Owner:          m.Owner,
	}
	j.move(StateOffered, EventOffered)
	return accept(EventOffered, "%s: generation 1 OFFERED; the holder has no authority until it ACKs by %s", describe(m), ts(j.l.AckDeadline))
}

func (j *judge) ack(m Ack) Decision {
	if d, ok := j.checkClaim(m.Claim); !ok {
		return d
	}
	l := &j.l
	switch l.State {
	case StateOffered:
		if l.CancelRequested {
			return reject(EventInvalidTransition, ErrCancelRequested,
				"%s refused: cancellation was requested at %s before the ACK; the job needs Resolve", describe(m), ts(l.CancelRequestedAt))
		}
		l.AckState = AckAcked
		j.move(StateAcked, EventAcked)
		l.AcquireTime = j.now
		l.LastRenewTime = j.now
		l.ExpiresAt = j.now.Add(l.LeaseDuration)
		j.move(StateActive, EventAcked)
		return accept(EventAcked, "%s accepted at %s (deadline %s): ACTIVE until %s; an ACK is acceptance, not completion",
			describe(m), ts(j.now), ts(l.AckDeadline), ts(l.ExpiresAt))
	case StateActive:
		return duplicate(EventDuplicateAck, "%s repeats the accepted ACK of %s; nothing changed", describe(m), ts(l.AcquireTime))
	case StateExpired:
		if l.AckState == AckMissed {
			return reject(EventAckDeadlineMissed, ErrAckDeadlineMissed,
				"%s at %s is after the ACK deadline %s; the generation expired and is never revived", describe(m), ts(j.now), ts(l.AckDeadline))
		}
		return reject(EventLeaseExpired, ErrLeaseExpired, "%s: %s since %s", describe(m), j.current(), ts(l.ExpiresAt))
	}
	return j.terminalRefusal(m)
}

func (j *judge) renew(m Renew) Decision {
	if d, ok := j.checkClaim(m.Claim); !ok {
		return d
	}
	l := &j.l
	if (l.State == StateExpired || l.State == StateTerminal) && l.RenewSequence != 0 && m.RenewSequence <= l.RenewSequence {
		// A repeat of the accepted renewal, or one behind it (a
		// retransmission, or a stream that reordered the message past
		// the end), asks for nothing new: a duplicate or a stale renew,
		// as it is before the end (seed §6, §11, §15), never a holder
		// asking to extend authority after its job ended.
		ended := j.current()
		if l.State == StateTerminal {
			ended = fmt.Sprintf("the job is terminal as %s since %s", l.TerminalResult, ts(l.TerminalAt))
		}
		if m.RenewSequence < l.RenewSequence {
			return reject(EventStaleRenew, ErrStaleSequence,
				"%s is behind the accepted renew sequence %d (of %s); %s; nothing changed, an ended generation is never extended", describe(m), l.RenewSequence, ts(l.RenewTime), ended)
		}
		return duplicate(EventDuplicateRenew, "%s repeats the accepted renew of %s; %s; nothing changed, an ended generation is never extended", describe(m), ts(l.RenewTime), ended)
	}
	switch l.State {
	case StateActive:
		switch {
		case m.RenewSequence == l.RenewSequence:
			return duplicate(EventDuplicateRenew, "%s repeats the accepted renew of %s; expiry stays %s", describe(m), ts(l.RenewTime), ts(l.ExpiresAt))
		case m.RenewSequence < l.RenewSequence:
			return reject(EventStaleRenew, ErrStaleSequence,
				"%s is behind the accepted renew sequence %d; expiry stays %s", describe(m), l.RenewSequence, ts(l.ExpiresAt))
		case l.OwnershipConflict:
			return reject(EventOwnershipConflict, ErrOwnershipConflict,
				"%s refused: an ownership conflict over generation %d is recorded, so authority is not extended until the coordinator resolves it (Reassign settling the conflict, or Resolve); it ends at %s", describe(m), l.Generation, ts(l.ExpiresAt))
		case l.CancelRequested:
			return reject(EventInvalidTransition, ErrCancelRequested,
				"%s refused: cancellation was requested at %s, so authority is not extended; it ends at %s", describe(m), ts(l.CancelRequestedAt), ts(l.ExpiresAt))
		}
		previous := l.ExpiresAt
		l.RenewSequence = m.RenewSequence
		l.RenewTime = j.now
		l.LastRenewTime = j.now
		l.ExpiresAt = j.now.Add(l.LeaseDuration)
		return Decision{Outcome: OutcomeAccepted, Event: EventRenewed, Reason: renewAccepted(m, j.now, previous, l.ExpiresAt)}
	case StateExpired:
		return reject(EventLeaseExpired, ErrLeaseExpired,
			"%s at %s: %s; an expired generation is never revived", describe(m), ts(j.now), j.current())
	case StateOffered:
		return reject(EventInvalidTransition, ErrInvalidTransition, "%s refused: generation %d is not ACKed yet", describe(m), l.Generation)
	}
	return j.terminalRefusal(m)
}

func (j *judge) progress(m Progress) Decision {
	if d, ok := j.checkClaim(m.Claim); !ok {
		return d
	}
	l := &j.l
	late := func(cause error, why string) Decision {
		l.LateProgress = true
		return reject(EventLateProgress, cause, "%s recorded as late evidence, not applied: %s; progress stays at seq %d", describe(m), why, l.ProgressSequence)
	}
	if l.State == StateExpired || l.State == StateTerminal {
		if l.ProgressSequence != 0 && m.ProgressSequence == l.ProgressSequence && m.ProgressValue == l.ProgressValue {
			// A repeat of the accepted progress (a retransmission, or a
			// stream that reordered it after the end) reports nothing new:
			// a duplicate, as it is before the end (seed §11, §15), never
			// late progress the worker did not send.
			return duplicate(EventDuplicateProgress, "%s repeats the accepted progress (%s); nothing changed", describe(m), j.current())
		}
	}
	switch l.State {
	case StateActive:
		switch {
		case m.ProgressSequence == l.ProgressSequence && m.ProgressValue == l.ProgressValue:
			return duplicate(EventDuplicateProgress, "%s repeats the accepted progress; nothing changed", describe(m))
		case m.ProgressSequence == l.ProgressSequence:
			return reject(EventDuplicateProgress, ErrConflictingDuplicate,
				"%s reuses accepted seq %d with a different value (accepted %q); not applied", describe(m), l.ProgressSequence, l.ProgressValue)
		case m.ProgressSequence < l.ProgressSequence:
			return late(ErrLateProgress, fmt.Sprintf("seq %d is behind the accepted seq %d", m.ProgressSequence, l.ProgressSequence))
		case l.OwnershipConflict:
			return reject(EventOwnershipConflict, ErrOwnershipConflict,
				"%s not applied: an ownership conflict over generation %d is recorded, and work done under it is not trusted until the coordinator resolves it; progress stays at seq %d", describe(m), l.Generation, l.ProgressSequence)
		case l.CancelRequested:
			return late(ErrCancelRequested, "it arrived after cancellation was requested at "+ts(l.CancelRequestedAt))
		}
		l.ProgressSequence = m.ProgressSequence
		l.ProgressValue = m.ProgressValue
		return accept(EventProgressRecorded, "%s accepted; progress does not renew, expiry stays %s", describe(m), ts(l.ExpiresAt))
	case StateExpired:
		return late(ErrLeaseExpired, fmt.Sprintf("generation %d is EXPIRED", l.Generation))
	case StateTerminal:
		return late(ErrTerminal, "the job is terminal ("+l.TerminalResult.String()+")")
	}
	return reject(EventInvalidTransition, ErrInvalidTransition, "%s refused: generation %d is not ACKed yet", describe(m), l.Generation)
}

func (j *judge) cancelAck(m CancelAck) Decision {
	if d, ok := j.checkClaim(m.Claim); !ok {
		return d
	}
	l := &j.l
	switch l.State {
	case StateOffered, StateActive:
		switch {
		case !l.CancelRequested:
			return reject(EventInvalidTransition, ErrInvalidTransition, "%s refused: no cancellation was requested", describe(m))
		case l.CancelAck:
			return duplicate(EventDuplicateCancel, "%s repeats the cancel ACK of %s; nothing changed", describe(m), ts(l.CancelAckedAt))
		}
		l.CancelAck = true
		l.CancelAckedAt = j.now
		return accept(EventCancelAcked, "%s accepted: the holder acknowledged the cancel request; that does not prove the work stopped, and the job still needs a terminal result", describe(m))
	case StateExpired:
		return reject(EventLeaseExpired, ErrLeaseExpired, "%s: %s; the job needs Resolve", describe(m), j.current())
	case StateTerminal:
		switch {
		case l.CancelAck && l.TerminalResult == ResultCancelled:
			// Acknowledged already, by an earlier CancelAck or by the
			// holder's CANCELLED result that overtook this one.
			return duplicate(EventDuplicateCancel, "%s repeats the cancel acknowledgement of %s (the job is CANCELLED); nothing changed", describe(m), ts(l.CancelAckedAt))
		case l.CancelAck:
			return duplicate(EventDuplicateCancel, "%s repeats the cancel ACK of %s (the job is terminal as %s); nothing changed", describe(m), ts(l.CancelAckedAt), l.TerminalResult)
		case l.CancelRequested && l.TerminalResult == ResultFailed && !l.ResolvedByCoordinator && l.UnresolvedUntil.IsZero() && l.AckState == AckAcked && !l.LeaseExpired && j.now.Before(l.ExpiresAt):
			// Seed §9 and §15: a cancellation is a request, the holder's
			// acknowledgement and a terminal reconciliation, which may be
			// FAILED; over a reordering transport the holder's FAILED
			// may arrive before the acknowledgement it sent first. The
			// record must not depend on that order: the acknowledgement
			// of a generation that held the job — ACKed, its authority
			// not lapsed when the job ended, its expiry still ahead — is
			// recorded, at its own time, and changes no result, as it
			// would have been had it come first. Past the expiry it
			// would have found the lease EXPIRED and been refused, and
			// so it is after the result; a generation only offered never
			// took the job. A FAILED that closed an UNRESOLVED is not
			// the holder's result overtaking its acknowledgement: the
			// coordinator reconciled the job as unable to tell, and the
			// acknowledgement refused while it was UNRESOLVED stays
			// refused once the bound or the coordinator made it FAILED.
			// Nor is a FAILED the coordinator resolved directly: it
			// closed the job without the acknowledgement, and one that
			// comes after it is the holder's word after the end
			// (ResolvedByCoordinator; a record stored before the field
			// existed reads false, and its UNRESOLVED bound still tells).
			l.CancelAck = true
			l.CancelAckedAt = j.now
			return accept(EventCancelAcked, "%s accepted after the job ended as %s at %s: the holder acknowledged the cancel request requested at %s; the result stands, and the acknowledgement does not prove the work stopped",
				describe(m), l.TerminalResult, ts(l.TerminalAt), ts(l.CancelRequestedAt))
		}
	}
	return j.terminalRefusal(m)
}

func (j *judge) complete(m Complete) Decision {
	if d, ok := j.checkClaim(m.Claim); !ok {
		return d
	}
	l := &j.l
	switch l.State {
	case StateTerminal:
		switch {
		case m.Result == l.TerminalResult && m.Detail == l.TerminalDetail:
			return duplicate(EventDuplicateTerminal, "%s repeats the terminal result recorded at %s; nothing changed", describe(m), ts(l.TerminalAt))
		case m.Result == l.TerminalResult:
			// Only an exact repeat is idempotent (seed §11): other words
			// are another account of the end, refused and kept as evidence,
			// never recorded as a repeat of what the record holds.
			return reject(EventDuplicateTerminal, ErrConflictingDuplicate,
				"%s refused: it comes with a different detail; the job is already terminal as %s since %s with detail %q; nothing changed",
				describe(m), l.TerminalResult, ts(l.TerminalAt), clip(l.TerminalDetail))
		}
		return reject(EventDuplicateTerminal, ErrTerminal, "%s refused: the job is already terminal as %s since %s", describe(m), l.TerminalResult, ts(l.TerminalAt))
	case StateExpired:
		return reject(EventLeaseExpired, ErrLeaseExpired,
			"%s refused: %s since %s without a valid terminal result; expiry is authoritative and the job is not successful; it needs Reassign or Resolve",
			describe(m), j.current(), ts(l.ExpiresAt))
	case StateOffered:
		return reject(EventInvalidTransition, ErrInvalidTransition, "%s refused: generation %d is not ACKed, it has no authority to complete", describe(m), l.Generation)
	}
	switch {
	case l.OwnershipConflict:
		return reject(EventOwnershipConflict, ErrOwnershipConflict,
			"%s refused: ownership of generation %d is in conflict with %q; the coordinator must resolve it", describe(m), l.Generation, l.ConflictHolder)
	case m.Result == ResultSuccess && l.CancelRequested:
		return reject(EventInvalidTransition, ErrCancelRequested,
			"%s refused: cancellation was requested at %s and stays authoritative; complete with CANCELLED or FAILED, or the coordinator resolves", describe(m), ts(l.CancelRequestedAt))
	case m.Result == ResultCancelled && !l.CancelRequested:
		return reject(EventInvalidTransition, ErrInvalidTransition, "%s refused: CANCELLED needs a cancel request; report FAILED", describe(m))
	}
	l.TerminalResult = m.Result
	l.TerminalAt = j.now
	l.TerminalDetail = m.Detail
	acked := ""
	if m.Result == ResultCancelled && !l.CancelAck {
		// The holder reporting CANCELLED acknowledges the cancel request
		// it answers: the record must not depend on whether its
		// CancelAck arrived before the result or after (seed §15).
		l.CancelAck = true
		l.CancelAckedAt = j.now
		acked = "; it acknowledges the cancel request"
	}
	j.move(StateTerminal, EventTerminalAccepted)
	return accept(EventTerminalAccepted, "%s accepted at %s within the lease (expiry %s)%s", describe(m), ts(j.now), ts(l.ExpiresAt), acked)
}

// terminalRefusal answers a worker message that only makes sense before a
// terminal result.
func (j *judge) terminalRefusal(m Message) Decision {
	if j.l.State != StateTerminal {
		// Only a record Step never produced (ACKED is never persisted) gets here.
		return reject(EventInvalidTransition, ErrInvalidTransition, "%s refused: %s", describe(m), j.current())
	}
	return reject(EventInvalidTransition, ErrTerminal, "%s refused: the job is terminal as %s since %s", describe(m), j.l.TerminalResult, ts(j.l.TerminalAt))
}

func (j *judge) requestCancel(m RequestCancel) Decision {
	l := &j.l
	switch {
	case l.State == StateTerminal:
		return reject(EventInvalidTransition, ErrTerminal, "cancel request refused: the job is terminal as %s", l.TerminalResult)
	case l.CancelRequested:
		return duplicate(EventDuplicateCancel, "cancel already requested at %s; nothing changed", ts(l.CancelRequestedAt))
	}
	previous := j.current()
	l.CancelRequested = true
	l.CancelRequestedAt = j.now
	if l.State == StateExpired {
		// The generation's authority had ended already: nobody can
		// acknowledge the request or report a result, and the job can
		// never be reassigned while it stands.
		j.closeCancelLapsed(j.now)
		return accept(EventResolved, "cancel requested for %s (reason %q); its authority had ended, so the job is closed UNRESOLVED until %s, then FAILED, unless the coordinator reconciles it as CANCELLED or FAILED",
			previous, m.Reason, ts(l.UnresolvedUntil))
	}
	return accept(EventCancelRequested, "cancel requested for %s (reason %q); this is intent only: the job ends with the holder's Complete(CANCELLED or FAILED) or the coordinator's Resolve, or, if its authority ends first, UNRESOLVED",
		previous, m.Reason)
}

func (j *judge) reassign(m Reassign) Decision {
	l := &j.l
	switch {
	case l.State == StateTerminal:
		return reject(EventInvalidTransition, ErrTerminal, "%s refused: the job is terminal as %s", describe(m), l.TerminalResult)
	case m.Automatic && l.OwnershipConflict:
		return reject(EventOwnershipConflict, ErrOwnershipConflict,
			"automatic %s refused: an ownership conflict with %q is recorded; only an explicit Reassign or Resolve may settle it", describe(m), l.ConflictHolder)
	case m.Automatic && l.State == StateExpired && l.AckState == AckMissed && AutoReassignsExhausted(*l, j.p):
		return reject(EventInvalidTransition, ErrInvalidTransition,
			"automatic %s refused: the job was already reassigned automatically %d times in a row (the ack-miss policy's maximum is %d); only the coordinator may reassign or resolve it now",
			describe(m), l.AutoReassigns, j.p.MaxAutoReassigns)
	case m.Automatic && !ReassignDue(*l, j.p):
		return reject(EventInvalidTransition, ErrInvalidTransition,
			"automatic %s refused: policy %q allows automatic reassignment only after a missed ACK, and %s", describe(m), j.p.AckMiss, j.current())
	case m.Automatic && m.HolderUnavailable != "":
		return reject(EventInvalidTransition, ErrInvalidTransition,
			"automatic %s withheld: holder %q cannot take work (%q); the job stays EXPIRED, as a missed ACK leaves it under ack-miss policy expire, until the coordinator reassigns or resolves it",
			describe(m), m.HolderIdentity, m.HolderUnavailable)
	case l.CancelRequested:
		return reject(EventInvalidTransition, ErrCancelRequested, "%s refused: cancellation was requested at %s; Resolve the job instead", describe(m), ts(l.CancelRequestedAt))
	case l.OwnershipConflict && !m.ResolveConflict:
		return reject(EventOwnershipConflict, ErrOwnershipConflict,
			"%s refused: an ownership conflict between %q and %q is recorded; reassign with ResolveConflict to settle it", describe(m), l.HolderIdentity, l.ConflictHolder)
	case m.LeaseID == l.LeaseID:
		return reject(EventInvalidTransition, ErrInvalidMessage, "%s refused: lease id %q is generation %d's; a new generation needs a new lease id", describe(m), m.LeaseID, l.Generation)
	}
	previous := j.current()
	l.rememberHolder(l.HolderIdentity, m.HolderIdentity)
	settled := ""
	if l.OwnershipConflict {
		settled = fmt.Sprintf("; the ownership conflict between %q and %q is resolved by this reassignment", l.HolderIdentity, l.ConflictHolder)
		l.OwnershipConflict = false
		l.ConflictHolder = ""
	}
	ackTimeout := m.AckTimeout
	if ackTimeout == 0 {
		ackTimeout = j.p.DefaultAckTimeout
	}
	l.Generation++
	l.LeaseID = m.LeaseID
	l.HolderIdentity = m.HolderIdentity
	l.IssuedAt = j.now
	l.LeaseDuration = m.LeaseDuration
	l.ExpiresAt = time.Time{}
	l.AckDeadline = j.now.Add(ackTimeout)
	l.AckState = AckPending
	l.RenewSequence, l.RenewTime = 0, time.Time{}
	l.ProgressSequence, l.ProgressValue = 0, ""
	l.LeaseExpired = false
	l.AcquireTime, l.LastRenewTime = time.Time{}, time.Time{}
	l.Transitions++
	j.move(StateOffered, EventReassigned)
	how := "by the coordinator"
	if m.Automatic {
		l.AutoReassigns++
		how = fmt.Sprintf("automatically, per ack-miss policy %s (automatic reassignment %d of at most %d in a row)", j.p.AckMiss, l.AutoReassigns, j.p.MaxAutoReassigns)
	} else {
		l.AutoReassigns = 0
	}
	return accept(EventReassigned, "%s %s (reason %q): was %s; generation %d OFFERED, ACK due by %s; every earlier generation is fenced off%s",
		describe(m), how, m.Reason, previous, l.Generation, ts(l.AckDeadline), settled)
}

func (j *judge) resolve(m Resolve) Decision {
	l := &j.l
	if l.State == StateTerminal {
		switch {
		case l.TerminalResult == m.Result && l.TerminalDetail == m.Reason:
			return duplicate(EventDuplicateTerminal, "%s repeats the terminal result recorded at %s; nothing changed", describe(m), ts(l.TerminalAt))
		case l.TerminalResult == m.Result:
			// Only an exact repeat is idempotent (seed §11), for the
			// coordinator as for the holder: the same result in other
			// words, or after the holder reported it (or the clock closed
			// an UNRESOLVED), is no repeat of a resolution this
			// coordinator made, and the record must not read as one.
			return reject(EventDuplicateTerminal, ErrConflictingDuplicate,
				"%s refused: it does not repeat the record word for word; the job is already terminal as %s since %s with detail %q; nothing changed",
				describe(m), l.TerminalResult, ts(l.TerminalAt), clip(l.TerminalDetail))
		case l.TerminalResult != ResultUnresolved:
			return reject(EventDuplicateTerminal, ErrTerminal, "%s refused: the job is already terminal as %s since %s", describe(m), l.TerminalResult, ts(l.TerminalAt))
		}
	}
	if m.Result == ResultCancelled && !l.CancelRequested {
		// Seed §9 and §13: a cancellation is a request, an acknowledgement
		// and a reconciliation. CANCELLED with no request in the record
		// cannot be rebuilt from it, for the coordinator as for the holder.
		return reject(EventInvalidTransition, ErrInvalidTransition,
			"%s refused: no cancellation was requested, so nothing was cancelled; request cancellation first, or resolve FAILED or UNRESOLVED", describe(m))
	}
	previous := j.current()
	l.TerminalResult = m.Result
	l.TerminalAt = j.now
	l.TerminalDetail = m.Reason
	l.ResolvedByCoordinator = true
	extra := ""
	if m.Result == ResultUnresolved {
		bound := m.UnresolvedBound
		if bound == 0 {
			bound = j.p.MaxUnresolvedBound
		}
		l.UnresolvedUntil = j.now.Add(bound)
		extra = fmt.Sprintf("; it must be reconciled by %s or it closes as FAILED", ts(l.UnresolvedUntil))
	} else if l.OwnershipConflict {
		extra = fmt.Sprintf("; the ownership conflict between %q and %q is resolved", l.HolderIdentity, l.ConflictHolder)
		l.OwnershipConflict = false
		l.ConflictHolder = ""
	}
	j.move(StateTerminal, EventResolved)
	return accept(EventResolved, "%s by the coordinator (reason %q): was %s%s", describe(m), m.Reason, previous, extra)
}

func (j *judge) tick() Decision {
	if len(j.events) > 0 {
		last := j.events[len(j.events)-1]
		reason := strings.Join(j.notes, "; ")
		j.notes = nil
		j.tickOwnsObserved = true
		return accept(last.Audit, "%s", reason)
	}
	l := j.l
	switch l.State {
	case StateExpired:
		if l.AckState == AckMissed {
			return duplicate(EventAckDeadlineMissed, "tick: generation %d already expired for a missed ACK (deadline %s)", l.Generation, ts(l.AckDeadline))
		}
		return duplicate(EventLeaseExpired, "tick: generation %d already expired at %s", l.Generation, ts(l.ExpiresAt))
	}
	due := "no deadline pending"
	if at, ok := NextDeadline(l); ok {
		due = "next deadline " + ts(at)
	}
	return reject(EventInvalidTransition, ErrNotDue, "tick at %s: nothing due (%s, %s)", ts(j.now), j.current(), due)
}

func (j *judge) recover(m Recover) Decision {
	l := &j.l
	var deadline time.Time
	switch l.State {
	case StateActive:
		deadline = l.ExpiresAt
	case StateOffered:
		deadline = l.AckDeadline
	}
	switch {
	case j.p.Restart != RestartExtend:
		j.observe()
		return reject(EventInvalidTransition, ErrInvalidTransition, "restart recovery refused: restart policy is %s, deadlines are absolute", j.p.Restart)
	case m.LastAlive.After(j.now):
		return rejectErr(ErrInvalidMessage, "restart recovery refused: last alive %s is after now %s", ts(m.LastAlive), ts(j.now))
	case deadline.IsZero():
		j.observe()
		if j.l.State == StateExpired {
			return reject(EventLeaseExpired, ErrLeaseExpired, "restart recovery refused: %s; an expired generation is never revived", j.current())
		}
		return reject(EventInvalidTransition, ErrInvalidTransition, "restart recovery refused: %s, no deadline to extend", j.current())
	case !deadline.After(m.LastAlive):
		// At its deadline's instant a lease has no authority left, so a
		// deadline at lastAlive passed while the coordinator was up.
		j.observe()
		return reject(EventLeaseExpired, ErrLeaseExpired,
			"restart recovery refused: the deadline %s passed before the coordinator stopped (last alive %s)", ts(deadline), ts(m.LastAlive))
	case l.CancelRequested || l.OwnershipConflict:
		// The grace is for a holder the downtime kept from renewing. After
		// a cancel request, or while an ownership conflict is recorded,
		// renewals are refused: the downtime took nothing from the holder,
		// and its authority ends at the deadline it had.
		why := fmt.Sprintf("cancellation was requested at %s", ts(l.CancelRequestedAt))
		event, cause := EventInvalidTransition, ErrCancelRequested
		if !l.CancelRequested {
			why = fmt.Sprintf("an ownership conflict over generation %d is recorded and unresolved", l.Generation)
			event, cause = EventOwnershipConflict, ErrOwnershipConflict
		}
		j.observe()
		if j.l.State == StateExpired || j.l.State == StateTerminal {
			// Ended by the clock: expired, and closed UNRESOLVED if a
			// cancel request stood (closeCancelLapsed).
			event, cause = EventLeaseExpired, ErrLeaseExpired
		}
		return reject(event, cause, "restart recovery refused: %s, so authority is not extended; it ends at %s (%s)", why, ts(deadline), j.current())
	case m.ExtendTo.After(j.now.Add(j.p.RestartGrace + j.p.RestartSpread)):
		return rejectErr(ErrInvalidMessage, "restart recovery refused: extension to %s exceeds now + grace %s + spread %s",
			ts(m.ExtendTo), j.p.RestartGrace, j.p.RestartSpread)
	case !m.ExtendTo.After(j.now):
		j.observe()
		return reject(EventLeaseExpired, ErrLeaseExpired, "restart recovery: the extension to %s had already elapsed at %s", ts(m.ExtendTo), ts(j.now))
	case !m.ExtendTo.After(deadline):
		return duplicate(EventRenewed, "restart recovery: deadline %s already reaches the extension %s; nothing changed", ts(deadline), ts(m.ExtendTo))
	}
	if l.State == StateActive {
		l.ExpiresAt = m.ExtendTo
		l.LastRenewTime = j.now
	} else {
		l.AckDeadline = m.ExtendTo
	}
	return accept(EventRenewed, "restart recovery per policy %s: the deadline %s fell while the coordinator was down (last alive %s); %s deadline extended to %s",
		j.p.Restart, ts(deadline), ts(m.LastAlive), l.State, ts(m.ExtendTo))
}

func accept(event AuditEvent, format string, args ...any) Decision {
	return Decision{Outcome: OutcomeAccepted, Event: event, Reason: fmt.Sprintf(format, args...)}
}

func duplicate(event AuditEvent, format string, args ...any) Decision {
	return Decision{Outcome: OutcomeDuplicate, Event: event, Reason: fmt.Sprintf(format, args...)}
}

func reject(event AuditEvent, cause error, format string, args ...any) Decision {
	return Decision{Outcome: OutcomeRejected, Event: event, Reason: fmt.Sprintf(format, args...), cause: cause}
}

// rejectErr rejects a message that could not be judged at all.
func rejectErr(cause error, format string, args ...any) Decision {
	return reject(EventInvalidTransition, cause, format, args...)
}

// describeSafe describes a message that may be nil or malformed.
func describeSafe(m Message) string {
	if m == nil {
		return "nil message"
	}
	return m.Kind().String()
}

// coordinatorReason is the reason a coordinator message carries.
func coordinatorReason(m Message) string {
	switch m := m.(type) {
	case RequestCancel:
		return m.Reason
	case Reassign:
		return m.Reason
	case Resolve:
		return m.Reason
	}
	return ""
}

// clip shortens a text quoted in a reason; the evidence row keeps the
// lease, which holds the text in full.
func clip(s string) string {
	const max = 200
	if len(s) <= max {
		return s
	}
	s = s[:max]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "…"
}

// ts renders a coordinator time for reasons and evidence.
func ts(t time.Time) string {
	if t.IsZero() {
		return "(unset)"
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// appendTS appends ts(t).
func appendTS(dst []byte, t time.Time) []byte {
	if t.IsZero() {
		return append(dst, "(unset)"...)
	}
	return t.UTC().AppendFormat(dst, time.RFC3339Nano)
}

// renewAccepted is an accepted renewal's reason, fmt.Sprintf("%s accepted
// at %s: expiry %s -> %s", describe(m), ts(now), ts(was), ts(expires)),
// built in one buffer: every renewal a holder sends is judged here, and
// fmt's reflection and the four strings in between cost more than the
// rest of the judgement.
func renewAccepted(m Renew, now, was, expires time.Time) string {
	var buf [256]byte
	b := appendRenew(buf[:0], m)
	b = appendTS(append(b, " accepted at "...), now)
	b = appendTS(append(b, ": expiry "...), was)
	b = appendTS(append(b, " -> "...), expires)
	return string(b)
}
