package lease_test

import (
	"fmt"
	"sort"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/tetherhq/tether/supervisor/lease"
)

const propertyDuration = 30 * time.Second

// stamped is a message with the coordinator time it was received at.
type stamped struct {
	m  lease.Message
	at time.Time
}

// activeLease offers job j1 to w1 at epoch and ACKs it one second later:
// generation 1, ACTIVE until epoch + 31s.
func activeLease(t interface{ Fatalf(string, ...any) }, p lease.Policy) lease.Lease {
	l, d, _ := lease.Step(lease.Lease{}, lease.Offer{JobID: "j1", LeaseID: "L1", HolderIdentity: "w1", LeaseDuration: propertyDuration}, epoch, p)
	if d.Outcome != lease.OutcomeAccepted {
		t.Fatalf("offer: %s", d)
	}
	l, d, _ = lease.Step(l, lease.Ack{Claim: claimW1()}, epoch.Add(time.Second), p)
	if d.Outcome != lease.OutcomeAccepted {
		t.Fatalf("ack: %s", d)
	}
	return l
}

func claimW1() lease.Claim {
	return lease.Claim{JobID: "j1", LeaseID: "L1", Generation: 1, HolderIdentity: "w1"}
}

// workerHistory draws one generation's valid worker traffic in send order:
// renews and progress with increasing sequences (progress possibly resent),
// optionally ending in a terminal result. Receipt times increase along the
// send order and all fall inside the lease window the ACK granted
// [epoch+1s, epoch+31s), so no message can be late on the clock whatever
// the order.
func workerHistory(t *rapid.T) (history []stamped, renews, progress int, terminal lease.TerminalResult) {
	renews = rapid.IntRange(0, 8).Draw(t, "renews")
	progress = rapid.IntRange(0, 8).Draw(t, "progress")
	var msgs []lease.Message
	nextRenew, nextProgress := 1, 1
	for nextRenew <= renews || nextProgress <= progress {
		sendRenew := nextProgress > progress || (nextRenew <= renews && rapid.Bool().Draw(t, "renewNext"))
		if sendRenew {
			msgs = append(msgs, lease.Renew{Claim: claimW1(), RenewSequence: uint64(nextRenew)})
			nextRenew++
			continue
		}
		p := lease.Progress{Claim: claimW1(), ProgressSequence: uint64(nextProgress), ProgressValue: fmt.Sprintf("p%d", nextProgress)}
		msgs = append(msgs, p)
		if rapid.IntRange(0, 3).Draw(t, "resend") == 0 {
			msgs = append(msgs, p) // the stream may deliver a progress frame twice
		}
		nextProgress++
	}
	if rapid.Bool().Draw(t, "complete") {
		terminal = rapid.SampledFrom([]lease.TerminalResult{lease.ResultSuccess, lease.ResultFailed}).Draw(t, "result")
		msgs = append(msgs, lease.Complete{Claim: claimW1(), Result: terminal})
	}
	times := rapid.SliceOfNDistinct(rapid.Int64Range(0, int64(propertyDuration/time.Millisecond)-1), len(msgs), len(msgs), rapid.ID[int64]).Draw(t, "times")
	sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
	for i, m := range msgs {
		history = append(history, stamped{m: m, at: epoch.Add(time.Second + time.Duration(times[i])*time.Millisecond)})
	}
	return history, renews, progress, terminal
}

// authorityOf is what reordering must not change.
type authorityOf struct {
	State            lease.State
	Generation       uint64
	LeaseID          string
	Holder           string
	TerminalResult   lease.TerminalResult
	RenewSequence    uint64
	RenewTime        time.Time
	ExpiresAt        time.Time
	ProgressSequence uint64
	ProgressValue    string
}

func authorityFields(l lease.Lease, withSequences bool) authorityOf {
	a := authorityOf{State: l.State, Generation: l.Generation, LeaseID: l.LeaseID, Holder: l.HolderIdentity, TerminalResult: l.TerminalResult}
	if withSequences {
		a.RenewSequence, a.RenewTime, a.ExpiresAt = l.RenewSequence, l.RenewTime, l.ExpiresAt
		a.ProgressSequence, a.ProgressValue = l.ProgressSequence, l.ProgressValue
	}
	return a
}

func replay(t *rapid.T, l lease.Lease, msgs []stamped, p lease.Policy) lease.Lease {
	for _, s := range msgs {
		post, d, events := lease.Step(l, s.m, s.at, p)
		if err := checkStep(l, s.m, s.at, post, d, events); err != nil {
			t.Fatalf("%s at %s: %v (%s)", s.m.Kind(), s.at, err, d)
		}
		l = post
	}
	return l
}

// TestReorderedDeliveryKeepsAuthority is the transport-transfer property:
// each message carries its coordinator receipt time, and delivering a valid
// history in any order yields the same final authority as in-order
// delivery. Without a terminal result that includes the sequences and the
// expiry, which is anchored to the receipt of the highest renew; with one,
// the owner, generation and result. Audit (which messages were DUPLICATE or
// LATE_PROGRESS, the LateProgress flag) may differ.
func TestReorderedDeliveryKeepsAuthority(t *testing.T) {
	p := lease.DefaultPolicy()
	rapid.Check(t, func(t *rapid.T) {
		start := activeLease(t, p)
		history, renews, progress, terminal := workerHistory(t)
		shuffled := rapid.Permutation(history).Draw(t, "order")

		inOrder := replay(t, start, history, p)
		reordered := replay(t, start, shuffled, p)

		withSequences := terminal == lease.ResultUnspecified
		if got, want := authorityFields(reordered, withSequences), authorityFields(inOrder, withSequences); got != want {
			t.Fatalf("reordered delivery changed authority:\n got  %+v\n want %+v", got, want)
		}

		// And the common answer is the right one, not merely the same one.
		want := authorityOf{State: lease.StateActive, Generation: 1, LeaseID: "L1", Holder: "w1", ExpiresAt: start.ExpiresAt}
		if terminal != lease.ResultUnspecified {
			want.State, want.TerminalResult = lease.StateTerminal, terminal
		}
		if withSequences {
			for _, s := range history {
				if r, ok := s.m.(lease.Renew); ok && r.RenewSequence == uint64(renews) {
					want.RenewSequence, want.RenewTime, want.ExpiresAt = r.RenewSequence, s.at, s.at.Add(propertyDuration)
				}
			}
			if progress > 0 {
				want.ProgressSequence, want.ProgressValue = uint64(progress), fmt.Sprintf("p%d", progress)
			}
		} else {
			want.ExpiresAt = time.Time{}
		}
		if got := authorityFields(reordered, withSequences); got != want {
			t.Fatalf("final authority:\n got  %+v\n want %+v", got, want)
		}
	})
}

// TestReorderedDeliveryOnLiveClock replays the same kind of history with a
// clock that only moves forward: whatever order the stream delivers in,
// the k-th message processed is received at the k-th time. Owner and
// sequences are order-independent; the expiry is always one lease duration
// after the receipt of the highest renew sequence, wherever it landed.
func TestReorderedDeliveryOnLiveClock(t *testing.T) {
	p := lease.DefaultPolicy()
	rapid.Check(t, func(t *rapid.T) {
		start := activeLease(t, p)
		history, renews, progress, terminal := workerHistory(t)
		if terminal != lease.ResultUnspecified {
			history = history[:len(history)-1]
		}
		order := rapid.Permutation(history).Draw(t, "order")
		var highestRenewAt time.Time
		for i := range order {
			order[i].at = history[i].at // receipt times stay increasing
			if r, ok := order[i].m.(lease.Renew); ok && r.RenewSequence == uint64(renews) {
				highestRenewAt = order[i].at
			}
		}
		final := replay(t, start, order, p)
		want := authorityOf{State: lease.StateActive, Generation: 1, LeaseID: "L1", Holder: "w1",
			RenewSequence: uint64(renews), RenewTime: highestRenewAt, ExpiresAt: start.ExpiresAt}
		if renews > 0 {
			want.ExpiresAt = highestRenewAt.Add(propertyDuration)
		}
		if progress > 0 {
			want.ProgressSequence, want.ProgressValue = uint64(progress), fmt.Sprintf("p%d", progress)
		}
		if got := authorityFields(final, true); got != want {
			t.Fatalf("final authority:\n got  %+v\n want %+v", got, want)
		}
	})
}

// model is a deliberately naive statement of who holds authority, written
// from the protocol rules rather than from Step's code. It tracks the
// current generation, holder, expiry, highest progress and terminal result.
type model struct {
	policy          lease.Policy
	exists          bool
	gen             uint64
	leaseID, holder string
	state           lease.State
	duration        time.Duration
	ackDeadline     time.Time
	expires         time.Time
	ackMissed       bool
	renewSeq        uint64
	progressSeq     uint64
	progressValue   string
	cancel          bool
	cancelAcked     bool
	result          lease.TerminalResult
	unresolvedUntil time.Time
	// resolved: the result is the coordinator's (Resolve), not the
	// holder's Complete.
	resolved bool
	conflict bool
	// lapsed: the current generation's authority ended by the clock
	// (the lease's LeaseExpired), at endedAt.
	lapsed  bool
	endedAt time.Time
}

// clock applies what time alone decides and reports whether it did.
func (m *model) clock(now time.Time) bool {
	changed := true
	switch {
	case m.state == lease.StateOffered && !now.Before(m.ackDeadline):
		m.state, m.ackMissed, m.lapsed, m.endedAt = lease.StateExpired, true, true, m.ackDeadline
	case m.state == lease.StateActive && !now.Before(m.expires):
		m.state, m.lapsed, m.endedAt = lease.StateExpired, true, m.expires
	default:
		changed = false
	}
	// An ended generation with a cancel request standing has nothing
	// left to decide but how the job ended: UNRESOLVED from its end,
	// bounded.
	if m.state == lease.StateExpired && m.cancel {
		m.closeLapsed(m.endedAt)
		changed = true
	}
	if m.state == lease.StateTerminal && m.result == lease.ResultUnresolved && !now.Before(m.unresolvedUntil) {
		m.result = lease.ResultFailed
		changed = true
	}
	return changed
}

// closeLapsed closes the job UNRESOLVED as of at, on the coordinator's
// word.
func (m *model) closeLapsed(at time.Time) {
	m.state, m.result, m.resolved = lease.StateTerminal, lease.ResultUnresolved, true
	m.unresolvedUntil = at.Add(m.policy.MaxUnresolvedBound)
}

func (m *model) offer(leaseID, holder string, duration time.Duration, now time.Time) {
	m.exists = true
	m.gen++
	m.leaseID, m.holder, m.duration = leaseID, holder, duration
	m.state = lease.StateOffered
	m.ackDeadline = now.Add(m.policy.DefaultAckTimeout)
	m.expires = time.Time{}
	m.ackMissed, m.lapsed = false, false
	m.renewSeq, m.progressSeq, m.progressValue = 0, 0, ""
	m.cancelAcked = false
	m.conflict = false
}

// apply returns whether the model accepts msg at now.
func (m *model) apply(msg lease.Message, now time.Time) bool {
	if o, ok := msg.(lease.Offer); ok {
		if m.exists {
			m.clock(now)
			return false
		}
		m.offer(o.LeaseID, o.HolderIdentity, o.LeaseDuration, now)
		return true
	}
	if !m.exists {
		return false
	}
	ticked := m.clock(now)
	if w, ok := msg.(interface{ Job() string }); ok && w.Job() != "j1" {
		return false
	}
	var claim lease.Claim
	switch msg := msg.(type) {
	case lease.Ack:
		claim = msg.Claim
	case lease.Renew:
		claim = msg.Claim
	case lease.Progress:
		claim = msg.Claim
	case lease.CancelAck:
		claim = msg.Claim
	case lease.Complete:
		claim = msg.Claim
	}
	if claim.JobID != "" {
		holderOK := claim.Generation == m.gen && claim.LeaseID == m.leaseID && claim.HolderIdentity == m.holder
		if !holderOK {
			if claim.Generation == m.gen && claim.LeaseID == m.leaseID && m.state == lease.StateActive {
				m.conflict = true
			}
			return false
		}
	}
	switch msg := msg.(type) {
	case lease.Ack:
		if m.state != lease.StateOffered || m.cancel {
			return false
		}
		m.state, m.expires = lease.StateActive, now.Add(m.duration)
	case lease.Renew:
		if m.state != lease.StateActive || msg.RenewSequence <= m.renewSeq || m.cancel || m.conflict {
			return false
		}
		m.renewSeq, m.expires = msg.RenewSequence, now.Add(m.duration)
	case lease.Progress:
		if m.state != lease.StateActive || msg.ProgressSequence <= m.progressSeq || m.cancel || m.conflict {
			return false
		}
		m.progressSeq, m.progressValue = msg.ProgressSequence, msg.ProgressValue
	case lease.CancelAck:
		// The holder's own FAILED that overtook the acknowledgement of a
		// generation that had authority at the end leaves the
		// acknowledgement to record; the coordinator's does not.
		afterFailed := m.state == lease.StateTerminal && m.result == lease.ResultFailed && !m.resolved && !m.lapsed &&
			!m.expires.IsZero() && now.Before(m.expires)
		if (m.state != lease.StateOffered && m.state != lease.StateActive && !afterFailed) || !m.cancel || m.cancelAcked {
			return false
		}
		m.cancelAcked = true
	case lease.Complete:
		allowed := m.state == lease.StateActive && !m.conflict &&
			(msg.Result == lease.ResultFailed ||
				msg.Result == lease.ResultSuccess && !m.cancel ||
				msg.Result == lease.ResultCancelled && m.cancel)
		if !allowed {
			return false
		}
		m.state, m.result = lease.StateTerminal, msg.Result
		m.resolved = false
	case lease.RequestCancel:
		if m.state == lease.StateTerminal || m.cancel {
			return false
		}
		m.cancel = true
		if m.state == lease.StateExpired {
			m.closeLapsed(now)
		}
	case lease.Reassign:
		allowed := m.state != lease.StateTerminal && !m.cancel && msg.LeaseID != m.leaseID
		if m.conflict && !msg.ResolveConflict {
			allowed = false
		}
		if msg.Automatic && (m.policy.AckMiss != lease.AckMissReassign || m.state != lease.StateExpired || !m.ackMissed || m.conflict) {
			allowed = false
		}
		if !allowed {
			return false
		}
		m.offer(msg.LeaseID, msg.HolderIdentity, msg.LeaseDuration, now)
	case lease.Resolve:
		if m.state == lease.StateTerminal && (m.result != lease.ResultUnresolved || msg.Result == lease.ResultUnresolved) {
			return false
		}
		if msg.Result == lease.ResultCancelled && !m.cancel {
			return false // CANCELLED needs a cancel request
		}
		m.state, m.result, m.resolved = lease.StateTerminal, msg.Result, true
		if msg.Result == lease.ResultUnresolved {
			bound := msg.UnresolvedBound
			if bound == 0 {
				bound = m.policy.MaxUnresolvedBound
			}
			m.unresolvedUntil = now.Add(bound)
		} else {
			m.conflict = false
		}
	case lease.Tick:
		return ticked
	}
	return true
}

func (m *model) view() authorityOf {
	return authorityOf{
		State: m.state, Generation: m.gen, LeaseID: m.leaseID, Holder: m.holder, TerminalResult: m.result,
		RenewSequence: m.renewSeq, ExpiresAt: m.expires, ProgressSequence: m.progressSeq, ProgressValue: m.progressValue,
	}
}

// drawMessage draws a message biased towards the model's current lease, so
// that accepted, stale, duplicate, wrong-holder and conflicting traffic are
// all common.
func drawMessage(t *rapid.T, m *model, fresh *int) lease.Message {
	holders := []string{"w1", "w2", "w3"}
	claim := func() lease.Claim {
		c := lease.Claim{JobID: "j1", LeaseID: m.leaseID, Generation: m.gen, HolderIdentity: m.holder}
		if rapid.IntRange(0, 2).Draw(t, "skewClaim") == 0 {
			switch rapid.IntRange(0, 3).Draw(t, "claimFault") {
			case 0:
				c.Generation = max(1, m.gen-1)
				c.LeaseID = fmt.Sprintf("L%d", c.Generation)
			case 1:
				c.Generation = m.gen + 1
			case 2:
				c.HolderIdentity = rapid.SampledFrom(holders).Draw(t, "otherHolder")
			case 3:
				c.LeaseID = "Lx"
			}
		}
		if c.LeaseID == "" {
			c.LeaseID = "L0"
		}
		if c.Generation == 0 {
			c.Generation = 1
		}
		if c.HolderIdentity == "" {
			c.HolderIdentity = "w1"
		}
		return c
	}
	seq := func(last uint64) uint64 {
		return uint64(max(1, int64(last)+int64(rapid.IntRange(-1, 2).Draw(t, "seqStep"))))
	}
	switch rapid.IntRange(0, 12).Draw(t, "kind") {
	case 0:
		*fresh++
		return lease.Offer{JobID: "j1", LeaseID: fmt.Sprintf("L%d", *fresh), HolderIdentity: rapid.SampledFrom(holders).Draw(t, "holder"), LeaseDuration: 10 * time.Second}
	case 1:
		return lease.Ack{Claim: claim()}
	case 2, 3:
		return lease.Renew{Claim: claim(), RenewSequence: seq(m.renewSeq)}
	case 4, 5:
		return lease.Progress{Claim: claim(), ProgressSequence: seq(m.progressSeq), ProgressValue: rapid.SampledFrom([]string{"a", "b"}).Draw(t, "value")}
	case 6:
		return lease.CancelAck{Claim: claim()}
	case 7:
		return lease.Complete{Claim: claim(), Result: rapid.SampledFrom([]lease.TerminalResult{lease.ResultSuccess, lease.ResultFailed, lease.ResultCancelled}).Draw(t, "result")}
	case 8:
		return lease.RequestCancel{JobID: "j1", Reason: "test"}
	case 9:
		leaseID := m.leaseID
		if rapid.IntRange(0, 4).Draw(t, "newLease") > 0 {
			*fresh++
			leaseID = fmt.Sprintf("L%d", *fresh)
		}
		automatic := rapid.Bool().Draw(t, "automatic")
		return lease.Reassign{JobID: "j1", LeaseID: max(leaseID, "L0"), HolderIdentity: rapid.SampledFrom(holders).Draw(t, "newHolder"),
			LeaseDuration: 10 * time.Second, Automatic: automatic, ResolveConflict: !automatic && rapid.Bool().Draw(t, "resolveConflict")}
	case 10:
		r := lease.Resolve{JobID: "j1", Result: rapid.SampledFrom([]lease.TerminalResult{lease.ResultCancelled, lease.ResultFailed, lease.ResultUnresolved}).Draw(t, "resolution")}
		if r.Result == lease.ResultUnresolved {
			r.UnresolvedBound = time.Duration(rapid.IntRange(0, 60).Draw(t, "bound")) * time.Second
		}
		return r
	default:
		return lease.Tick{JobID: "j1"}
	}
}

// TestStepAgainstModel checks Step against the naive model over random
// message sequences mixing valid, stale, duplicate, wrong-holder and
// coordinator traffic, and checks the step invariants after every message.
func TestStepAgainstModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := lease.DefaultPolicy()
		p.DefaultAckTimeout = 5 * time.Second
		p.MaxUnresolvedBound = time.Minute
		if rapid.Bool().Draw(t, "reassignOnAckMiss") {
			p.AckMiss = lease.AckMissReassign
		}
		ref := &model{policy: p}
		var l lease.Lease
		now, fresh := epoch, 0
		steps := rapid.IntRange(1, 60).Draw(t, "steps")
		for i := 0; i < steps; i++ {
			now = now.Add(time.Duration(rapid.IntRange(0, 6000).Draw(t, "advanceMs")) * time.Millisecond)
			msg := drawMessage(t, ref, &fresh)
			post, d, events := lease.Step(l, msg, now, p)
			if err := checkStep(l, msg, now, post, d, events); err != nil {
				t.Fatalf("step %d %s: invariant: %v\n\t%s", i, msg.Kind(), err, d)
			}
			accepted := ref.apply(msg, now)
			if got := d.Outcome == lease.OutcomeAccepted; got != accepted {
				t.Fatalf("step %d %#v at +%s: Step says %s, model accepted=%v", i, msg, now.Sub(epoch), d, accepted)
			}
			got := authorityFields(post, true)
			got.RenewTime = time.Time{} // the model does not track it
			if want := ref.view(); got != want {
				t.Fatalf("step %d %#v at +%s (%s):\n step  %+v\n model %+v", i, msg, now.Sub(epoch), d, got, want)
			}
			if post.OwnershipConflict != ref.conflict || post.CancelRequested != ref.cancel {
				t.Fatalf("step %d: conflict %v cancel %v, model %v %v", i, post.OwnershipConflict, post.CancelRequested, ref.conflict, ref.cancel)
			}
			l = post
		}
	})
}
