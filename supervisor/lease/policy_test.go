package lease_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tetherhq/tether/supervisor/lease"
)

func TestDefaultPolicy(t *testing.T) {
	p := lease.DefaultPolicy()
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	// The documented defaults.
	if p.DefaultLeaseDuration != 30*time.Second || p.MaxLeaseDuration != 10*time.Minute ||
		p.DefaultAckTimeout != 10*time.Second || p.MaxUnresolvedBound != 24*time.Hour ||
		p.SkewAllowance != 2*time.Second || p.AckMiss != lease.AckMissExpire || p.Restart != lease.RestartExtend ||
		p.RestartGrace != 30*time.Second || p.RestartSpread != 15*time.Second || p.ClockSource == "" {
		t.Fatalf("DefaultPolicy changed: %+v", p)
	}
	if !strings.HasPrefix(p.AckMissBehavior(), "expire") || !strings.HasPrefix(p.RestartBehavior(), "extend") {
		t.Fatalf("behaviour descriptions: %q / %q", p.AckMissBehavior(), p.RestartBehavior())
	}
}

func TestPolicyValidate(t *testing.T) {
	cases := map[string]func(*lease.Policy){
		"no clock source":         func(p *lease.Policy) { p.ClockSource = "" },
		"negative skew":           func(p *lease.Policy) { p.SkewAllowance = -time.Second },
		"zero max lease":          func(p *lease.Policy) { p.MaxLeaseDuration = 0 },
		"default above max":       func(p *lease.Policy) { p.DefaultLeaseDuration = 11 * time.Minute },
		"zero default lease":      func(p *lease.Policy) { p.DefaultLeaseDuration = 0 },
		"zero ack timeout":        func(p *lease.Policy) { p.DefaultAckTimeout = 0 },
		"ack timeout above max":   func(p *lease.Policy) { p.DefaultAckTimeout = time.Hour },
		"zero unresolved bound":   func(p *lease.Policy) { p.MaxUnresolvedBound = 0 },
		"unknown ack miss policy": func(p *lease.Policy) { p.AckMiss = 7 },
		"unknown restart policy":  func(p *lease.Policy) { p.Restart = 7 },
		"extend without grace":    func(p *lease.Policy) { p.RestartGrace = 0 },
		"negative restart spread": func(p *lease.Policy) { p.RestartSpread = -time.Second },
	}
	for name, breakIt := range cases {
		t.Run(name, func(t *testing.T) {
			p := lease.DefaultPolicy()
			breakIt(&p)
			err := p.Validate()
			if !errors.Is(err, lease.ErrInvalidPolicy) {
				t.Fatalf("Validate = %v, want ErrInvalidPolicy", err)
			}
			// Step refuses to judge under an invalid policy.
			l := activeLease(t, lease.DefaultPolicy())
			post, d, _ := lease.Step(l, lease.Renew{Claim: claimW1(), RenewSequence: 1}, at(5), p)
			if post != l || !errors.Is(d.Err(), lease.ErrInvalidPolicy) {
				t.Fatalf("Step under invalid policy: %s", d)
			}
		})
	}
	strict := lease.DefaultPolicy()
	strict.Restart, strict.RestartGrace = lease.RestartStrict, 0
	if err := strict.Validate(); err != nil {
		t.Fatalf("strict restarts need no grace: %v", err)
	}
}

func TestReassignDue(t *testing.T) {
	p := lease.DefaultPolicy()
	p.AckMiss = lease.AckMissReassign
	missed := lease.Lease{JobID: "j1", State: lease.StateExpired, AckState: lease.AckMissed}
	if !lease.ReassignDue(missed, p) {
		t.Fatal("a missed ACK under the reassign policy is due")
	}
	for name, l := range map[string]lease.Lease{
		"expired after ACK": {JobID: "j1", State: lease.StateExpired, AckState: lease.AckAcked},
		"conflict":          {JobID: "j1", State: lease.StateExpired, AckState: lease.AckMissed, OwnershipConflict: true},
		"cancel requested":  {JobID: "j1", State: lease.StateExpired, AckState: lease.AckMissed, CancelRequested: true},
		"still offered":     {JobID: "j1", State: lease.StateOffered, AckState: lease.AckPending},
	} {
		if lease.ReassignDue(l, p) {
			t.Errorf("%s: reassignment reported due", name)
		}
	}
	if lease.ReassignDue(missed, lease.DefaultPolicy()) {
		t.Error("the expire policy never reassigns automatically")
	}
}

// The sent_at of a worker is evidence only: far in the past or future, it
// never changes the decision or the expiry, only the reason notes it.
func TestSentAtNeverChangesAuthority(t *testing.T) {
	p := lease.DefaultPolicy()
	l := activeLease(t, p)
	base, want, _ := lease.Step(l, lease.Renew{Claim: claimW1(), RenewSequence: 1}, at(20), p)
	for _, sent := range []time.Time{at(-3600), at(19), at(21), at(3600)} {
		c := claimW1()
		c.SentAt = sent
		got, d, _ := lease.Step(l, lease.Renew{Claim: c, RenewSequence: 1}, at(20), p)
		if got != base || d.Outcome != want.Outcome || d.Event != want.Event {
			t.Fatalf("sent_at %v changed the decision: %s", sent, d)
		}
		noted := strings.Contains(d.Reason, "sent_at is evidence only")
		if far := sent.Sub(at(20)).Abs() > p.SkewAllowance; noted != far {
			t.Fatalf("sent_at %v: skew noted=%v, want %v (%s)", sent, noted, far, d.Reason)
		}
	}
	// A renew whose sent_at predates expiry still fails after it.
	c := claimW1()
	c.SentAt = at(30)
	if _, d, _ := lease.Step(l, lease.Renew{Claim: c, RenewSequence: 1}, at(31), p); d.Event != lease.EventLeaseExpired {
		t.Fatalf("late renew with an early sent_at: %s", d)
	}
}
