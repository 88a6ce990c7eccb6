package lease_test

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tetherhq/tether/supervisor/lease"
)

// TestEnumsMatchProto keeps the Go enums 1:1 with tether.v1 (numbers and
// names) without importing the generated code: it reads lease.proto.
func TestEnumsMatchProto(t *testing.T) {
	src, err := os.ReadFile("../../proto/tether/v1/lease.proto")
	if err != nil {
		t.Fatal(err)
	}
	goNames := map[string]func(int32) string{
		"LeaseState":     func(v int32) string { return lease.State(v).String() },
		"AckState":       func(v int32) string { return lease.AckState(v).String() },
		"TerminalResult": func(v int32) string { return lease.TerminalResult(v).String() },
		"Outcome":        func(v int32) string { return lease.Outcome(v).String() },
		"AuditEvent":     func(v int32) string { return lease.AuditEvent(v).String() },
	}
	prefixes := map[string]string{
		"LeaseState": "LEASE_STATE_", "AckState": "ACK_STATE_", "TerminalResult": "TERMINAL_RESULT_",
		"Outcome": "OUTCOME_", "AuditEvent": "AUDIT_EVENT_",
	}
	enumRe := regexp.MustCompile(`(?s)enum (\w+) \{(.*?)\}`)
	valueRe := regexp.MustCompile(`(\w+) = (\d+);`)
	seen := 0
	for _, match := range enumRe.FindAllStringSubmatch(string(src), -1) {
		name, body := match[1], match[2]
		goName, ok := goNames[name]
		if !ok {
			continue
		}
		seen++
		count := int32(0)
		for _, v := range valueRe.FindAllStringSubmatch(body, -1) {
			n, _ := strconv.Atoi(v[2])
			want := strings.TrimPrefix(v[1], prefixes[name])
			if got := goName(int32(n)); got != want {
				t.Errorf("%s %d: Go says %q, proto says %q", name, n, got, want)
			}
			count++
		}
		if extra := goName(count); !strings.HasPrefix(extra, "UNKNOWN") {
			t.Errorf("%s: Go has a value %d (%s) the proto lacks", name, count, extra)
		}
	}
	if seen != len(goNames) {
		t.Fatalf("found %d of %d enums in lease.proto", seen, len(goNames))
	}
}

func TestCanTransition(t *testing.T) {
	states := []lease.State{lease.StateUnspecified, lease.StateOffered, lease.StateAcked, lease.StateActive, lease.StateExpired, lease.StateTerminal}
	legal := map[string]bool{
		"UNSPECIFIED->OFFERED": true,
		"OFFERED->ACKED":       true, "OFFERED->EXPIRED": true, "OFFERED->OFFERED": true, "OFFERED->TERMINAL": true,
		"ACKED->ACTIVE":   true,
		"ACTIVE->EXPIRED": true, "ACTIVE->OFFERED": true, "ACTIVE->TERMINAL": true,
		"EXPIRED->OFFERED": true, "EXPIRED->TERMINAL": true,
		"TERMINAL->TERMINAL": true,
	}
	for _, from := range states {
		for _, to := range states {
			edge := from.String() + "->" + to.String()
			if got := lease.CanTransition(from, to); got != legal[edge] {
				t.Errorf("CanTransition(%s) = %v", edge, got)
			}
		}
	}
	// In particular: an ACK never leads to completion, and nothing leaves
	// TERMINAL or brings EXPIRED back to ACTIVE.
	for _, edge := range [][2]lease.State{
		{lease.StateAcked, lease.StateTerminal},
		{lease.StateExpired, lease.StateActive},
		{lease.StateTerminal, lease.StateActive},
		{lease.StateTerminal, lease.StateOffered},
	} {
		if lease.CanTransition(edge[0], edge[1]) {
			t.Errorf("%s -> %s must be illegal", edge[0], edge[1])
		}
	}
}

func TestDecisionErr(t *testing.T) {
	p := lease.DefaultPolicy()
	l := activeLease(t, p)
	_, accepted, _ := lease.Step(l, lease.Renew{Claim: claimW1(), RenewSequence: 1}, at(5), p)
	if accepted.Err() != nil {
		t.Fatalf("accepted decision has error %v", accepted.Err())
	}
	stale := claimW1()
	stale.Generation = 0
	_, invalid, _ := lease.Step(l, lease.Renew{Claim: stale, RenewSequence: 1}, at(5), p)
	if !errors.Is(invalid.Err(), lease.ErrInvalidMessage) || !strings.HasPrefix(invalid.Err().Error(), "lease: invalid message: ") {
		t.Fatalf("invalid message error %v", invalid.Err())
	}
	other := claimW1()
	other.HolderIdentity = "w2"
	_, conflict, _ := lease.Step(l, lease.Progress{Claim: other, ProgressSequence: 1}, at(5), p)
	if !errors.Is(conflict.Err(), lease.ErrOwnershipConflict) || errors.Is(conflict.Err(), lease.ErrHolderMismatch) {
		t.Fatalf("conflict error %v", conflict.Err())
	}
	if s := conflict.String(); !strings.HasPrefix(s, "REJECTED OWNERSHIP_CONFLICT: ") {
		t.Fatalf("String() = %q", s)
	}
}

func TestStepRejectsNilMessage(t *testing.T) {
	l := activeLease(t, lease.DefaultPolicy())
	post, d, events := lease.Step(l, nil, at(5), lease.DefaultPolicy())
	if post != l || !errors.Is(d.Err(), lease.ErrInvalidMessage) || len(events) != 1 {
		t.Fatalf("nil message: %s %v", d, events)
	}
}

func TestValidateLimits(t *testing.T) {
	p := lease.DefaultPolicy()
	long := strings.Repeat("x", lease.MaxIDBytes+1)
	for name, m := range map[string]lease.Message{
		"long job id":      lease.Tick{JobID: long},
		"long holder":      lease.Ack{Claim: lease.Claim{JobID: "j1", LeaseID: "L1", Generation: 1, HolderIdentity: long}},
		"bad utf8 lease":   lease.Ack{Claim: lease.Claim{JobID: "j1", LeaseID: "L\xff", Generation: 1, HolderIdentity: "w1"}},
		"long value":       lease.Progress{Claim: claimW1(), ProgressSequence: 1, ProgressValue: strings.Repeat("v", lease.MaxValueBytes+1)},
		"negative ack":     lease.Offer{JobID: "j1", LeaseID: "L1", HolderIdentity: "w1", LeaseDuration: time.Second, AckTimeout: -time.Second},
		"bound on FAILED":  lease.Resolve{JobID: "j1", Result: lease.ResultFailed, UnresolvedBound: time.Minute},
		"recover no times": lease.Recover{JobID: "j1"},
	} {
		if err := lease.Validate(m, p); !errors.Is(err, lease.ErrInvalidMessage) {
			t.Errorf("%s: Validate = %v", name, err)
		}
	}
	if err := lease.Validate(lease.Progress{Claim: claimW1(), ProgressSequence: 1, ProgressValue: strings.Repeat("v", lease.MaxValueBytes)}, p); err != nil {
		t.Errorf("a value at the limit is valid: %v", err)
	}
}

func TestAuthorityAndNextDeadline(t *testing.T) {
	p := lease.DefaultPolicy()
	offered, _, _ := lease.Step(lease.Lease{}, lease.Offer{JobID: "j1", LeaseID: "L1", HolderIdentity: "w1", LeaseDuration: 30 * time.Second}, at(0), p)
	if _, _, ok := offered.Authority(at(0)); ok {
		t.Fatal("an offer carries no authority")
	}
	if next, ok := lease.NextDeadline(offered); !ok || !next.Equal(at(10)) {
		t.Fatalf("offered deadline %v %v", next, ok)
	}
	active := activeLease(t, p)
	if holder, gen, ok := active.Authority(at(30)); !ok || holder != "w1" || gen != 1 {
		t.Fatalf("Authority = %q %d %v", holder, gen, ok)
	}
	if _, _, ok := active.Authority(at(31)); ok {
		t.Fatal("authority past ExpiresAt, even before a tick")
	}
	conflicted := active
	conflicted.OwnershipConflict = true
	if _, _, ok := conflicted.Authority(at(5)); ok {
		t.Fatal("authority under an ownership conflict")
	}
	done, _, _ := lease.Step(active, lease.Complete{Claim: claimW1(), Result: lease.ResultSuccess}, at(5), p)
	if _, ok := lease.NextDeadline(done); ok {
		t.Fatal("a final result has no deadline")
	}
	unresolved, _, _ := lease.Step(active, lease.Resolve{JobID: "j1", Result: lease.ResultUnresolved, UnresolvedBound: time.Hour}, at(5), p)
	if next, ok := lease.NextDeadline(unresolved); !ok || !next.Equal(at(3605)) {
		t.Fatalf("unresolved deadline %v %v", next, ok)
	}
}

// Reassigning a lease that is only OFFERED fences the first offer off: its
// ACK arrives as a stale generation.
func TestReassignOffered(t *testing.T) {
	p := lease.DefaultPolicy()
	l, _, _ := lease.Step(lease.Lease{}, lease.Offer{JobID: "j1", LeaseID: "L1", HolderIdentity: "w1", LeaseDuration: 30 * time.Second}, at(0), p)
	l, d, events := lease.Step(l, lease.Reassign{JobID: "j1", LeaseID: "L2", HolderIdentity: "w2", LeaseDuration: 30 * time.Second}, at(2), p)
	if d.Event != lease.EventReassigned || len(events) != 1 || !events[0].Transition ||
		events[0].From != lease.StateOffered || events[0].To != lease.StateOffered || events[0].Generation != 2 {
		t.Fatalf("reassign: %s %v", d, events)
	}
	_, d, _ = lease.Step(l, lease.Ack{Claim: claimW1()}, at(3), p)
	if d.Event != lease.EventStaleGeneration {
		t.Fatalf("ack of the first offer: %s", d)
	}
}

// Step works on values: the lease passed in is never modified, and equal
// inputs give equal outputs.
func TestStepIsPure(t *testing.T) {
	p := lease.DefaultPolicy()
	l := activeLease(t, p)
	before := l
	m := lease.Renew{Claim: claimW1(), RenewSequence: 1}
	a, da, ea := lease.Step(l, m, at(7), p)
	b, db, eb := lease.Step(l, m, at(7), p)
	if l != before {
		t.Fatal("Step modified its input")
	}
	if a != b || da != db || fmt.Sprint(ea) != fmt.Sprint(eb) {
		t.Fatal("Step is not deterministic")
	}
	c, _, _ := lease.Step(l, m, at(8), p)
	if c.ExpiresAt.Equal(a.ExpiresAt) {
		t.Fatal("the expiry must follow the coordinator time passed in")
	}
}

// Records Step never produces (a persisted ACKED state, a final result on a
// lease that is not TERMINAL) are refused rather than carried further
// through an illegal edge.
func TestStepRefusesIllegalEdges(t *testing.T) {
	p := lease.DefaultPolicy()
	acked := lease.Lease{JobID: "j1", LeaseID: "L1", Generation: 1, HolderIdentity: "w1", State: lease.StateAcked,
		AckState: lease.AckAcked, LeaseDuration: 30 * time.Second, AckDeadline: at(10)}
	for _, m := range []lease.Message{
		lease.Reassign{JobID: "j1", LeaseID: "L2", HolderIdentity: "w2", LeaseDuration: 30 * time.Second},
		lease.Resolve{JobID: "j1", Result: lease.ResultFailed},
	} {
		post, d, events := lease.Step(acked, m, at(5), p)
		if post != acked || d.Event != lease.EventInvalidTransition || !errors.Is(d.Err(), lease.ErrInvalidTransition) ||
			!strings.Contains(d.Reason, "illegal edge") || len(events) != 1 || events[0].Transition {
			t.Fatalf("%s from ACKED: %s %v", m.Kind(), d, events)
		}
	}

	corrupt := activeLease(t, p)
	corrupt.TerminalResult = lease.ResultSuccess // but still ACTIVE
	post, d, _ := lease.Step(corrupt, lease.Renew{Claim: claimW1(), RenewSequence: 1}, at(5), p)
	if post != corrupt || !strings.Contains(d.Reason, "final result SUCCESS") {
		t.Fatalf("renew on a corrupt record: %s", d)
	}
}

// Party admits the holder for any generation, a former holder only for
// earlier generations, and nobody else.
func TestParty(t *testing.T) {
	l := lease.Lease{JobID: "j1", State: lease.StateActive, Generation: 3, HolderIdentity: "w3",
		FormerHolders: [lease.MaxFormerHolders]string{"w1", "w2"}}
	for _, tc := range []struct {
		who  string
		gen  uint64
		want bool
	}{
		{"w3", 3, true}, {"w3", 1, true}, {"w3", 9, true},
		{"w2", 2, true}, {"w1", 1, true},
		{"w2", 3, false}, {"w1", 4, false},
		{"w9", 1, false}, {"w9", 3, false}, {"", 3, false},
	} {
		if got := l.Party(tc.who, tc.gen); got != tc.want {
			t.Errorf("Party(%q, %d) = %v, want %v", tc.who, tc.gen, got, tc.want)
		}
	}
	if (lease.Lease{}).Party("w3", 1) {
		t.Error("a job without a lease has parties")
	}
}
