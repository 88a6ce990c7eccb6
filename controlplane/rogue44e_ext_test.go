package controlplane_test

import (
	"fmt"
	"testing"
	"time"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// Forty-fourth hostile pass, the supervisor's termination path (letter E).

// TestRogue44EAClaimUnderAStopTakenOverStaysAClaim: an operator drains C
// (its call in flight keeps the drain open, a ten-minute window). C, being
// drained, reports SUCCESS for a job nobody told it anything about: its
// claim under stop. The operator, tired of waiting, aborts C's parent P,
// which takes C over from the drain (abort supersedes drain): the abort
// accounts for C, and its record is the one that lists C's jobs. The
// record flagged a holder's word as its claim under stop only when it came
// after that record's own request, so C's SUCCESS, given while C was being
// drained, read as a result of before any stop — the workload's word
// passed off as a cooperative result, by the operator's own escalation (a
// client's retry of the drain does the same). The flag now starts from
// the instant the holder's node first came under a stop, kept on the node
// by the mark that first reached it and carried by every stop that takes
// it over. P's own SUCCESS, given between the drain of C and the abort of
// P, when P was under no stop, stays the holder's report, not a claim.
func TestRogue44EAClaimUnderAStopTakenOverStaysAClaim(t *testing.T) {
	w := newSeedWorld(t)
	c, p := w.c.Node.NodeId, w.p.Node.NodeId
	coop := w.offerAcked(t, "coop", c, unary{w.cAgent})
	rogue := w.offerAcked(t, "rogue", c, unary{w.cAgent})
	parents := w.offerAcked(t, "parents", p, unary{w.pAgent})

	_, d := unary{w.cAgent}.send(t, complete(coop, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS))
	wantDecision(t, "C's cooperative completion", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_TERMINAL_ACCEPTED)
	if _, err := w.begin(w.gC.token); err != nil {
		t.Fatal(err)
	}
	w.clk.Advance(time.Second)
	drain := terminate(t, w.admin, c, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, 10*time.Minute, time.Second, time.Minute)
	waitState(t, w.srv, drain.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)

	// The rogue, being drained, reports SUCCESS; its parent, under no
	// stop, reports its own job done.
	w.clk.Advance(10 * time.Second)
	_, d = unary{w.cAgent}.send(t, complete(rogue, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS))
	wantDecision(t, "C's completion while it drains", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_TERMINAL_ACCEPTED)
	_, d = unary{w.pAgent}.send(t, complete(parents, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS))
	wantDecision(t, "P's completion under no stop", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_TERMINAL_ACCEPTED)

	// The operator escalates: an abort of P takes C over from the drain.
	w.clk.Advance(10 * time.Second)
	abort := terminate(t, w.admin, p, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, time.Minute, time.Second, time.Minute)
	waitState(t, w.srv, abort.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_ABORTING)
	w.clk.Advance(2 * time.Second) // the gate never acknowledges
	waitState(t, w.srv, abort.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	w.clk.Advance(2 * time.Minute)
	waitState(t, w.srv, abort.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	waitState(t, w.srv, drain.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)

	rec := record(t, w.admin, abort.TerminationId)
	inner := ""
	for _, n := range rec.Nodes {
		if n.NodeId == c {
			inner = n.InnerTerminationId
		}
	}
	if inner != drain.TerminationId {
		t.Fatalf("the abort's record names %q as the stop it took C over from, want the drain %s", inner, drain.TerminationId)
	}
	got := map[string]string{}
	for _, l := range rec.Leases {
		got[l.JobId] = fmt.Sprintf("%s %s node=%q under_stop=%t", l.TerminalResult, l.EndedBy, l.EndedByNodeId, l.ClaimedUnderStop)
	}
	want := map[string]string{
		"coop":    fmt.Sprintf("TERMINAL_RESULT_SUCCESS LEASE_ENDED_BY_HOLDER_REPORT node=%q under_stop=false", c),
		"rogue":   fmt.Sprintf("TERMINAL_RESULT_SUCCESS LEASE_ENDED_BY_HOLDER_REPORT node=%q under_stop=true", c),
		"parents": fmt.Sprintf("TERMINAL_RESULT_SUCCESS LEASE_ENDED_BY_HOLDER_REPORT node=%q under_stop=false", p),
	}
	for _, job := range []string{"coop", "rogue", "parents"} {
		if got[job] != want[job] {
			t.Errorf("the abort's record, lease %s:\n got %s\nwant %s", job, got[job], want[job])
		}
	}
	// The drain's record lists none of them: the abort accounts for C.
	for _, l := range record(t, w.admin, drain.TerminationId).Leases {
		t.Errorf("the drain's record lists lease %s too: each lease is in one record", l.JobId)
	}
}

// TestRogue44EAClaimUnderARetriedDrainStaysAClaim: the same rogue, and the
// operator's client retries the drain of C (a repeat is a new termination
// that takes the node over, keeping the first one's deadlines). The
// retry's record is the one that lists C's jobs; C's SUCCESS, given under
// the first drain, is its claim under stop there too.
func TestRogue44EAClaimUnderARetriedDrainStaysAClaim(t *testing.T) {
	w := newSeedWorld(t)
	c := w.c.Node.NodeId
	rogue := w.offerAcked(t, "rogue", c, unary{w.cAgent})
	if _, err := w.begin(w.gC.token); err != nil {
		t.Fatal(err)
	}
	w.clk.Advance(time.Second)
	first := terminate(t, w.admin, c, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Minute, time.Second, time.Minute)
	waitState(t, w.srv, first.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)
	w.clk.Advance(10 * time.Second)
	_, d := unary{w.cAgent}.send(t, complete(rogue, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS))
	wantDecision(t, "C's completion while it drains", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_TERMINAL_ACCEPTED)

	w.clk.Advance(10 * time.Second)
	retry := terminate(t, w.admin, c, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Minute, time.Second, time.Minute)
	waitState(t, w.srv, retry.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)
	w.clk.Advance(time.Minute) // past the first drain's deadline, which the retry keeps
	waitState(t, w.srv, retry.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_ABORTING)
	w.clk.Advance(2 * time.Second)
	waitState(t, w.srv, retry.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	w.clk.Advance(2 * time.Minute)
	waitState(t, w.srv, retry.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)

	rec := record(t, w.admin, retry.TerminationId)
	if len(rec.Leases) != 1 || rec.Leases[0].JobId != "rogue" {
		t.Fatalf("the retry's record lists leases %v, want C's job", rec.Leases)
	}
	if l := rec.Leases[0]; l.EndedBy != tetherv1.LeaseEndedBy_LEASE_ENDED_BY_HOLDER_REPORT || !l.ClaimedUnderStop {
		t.Fatalf("the retry's record lists C's SUCCESS under the first drain as %s, claimed_under_stop=%t; want the holder's report, its claim under stop", l.EndedBy, l.ClaimedUnderStop)
	}
}
