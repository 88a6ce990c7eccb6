package controlplane_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// An independent acceptance pass over the job-lease seed ("Lease Protocol:
// Ack, Renew, Cancel, Progress"), black box through the real server. The
// seed's concrete promises, in English, with where they are held:
//
//  §1  Delivery is not ownership. ACK, active authority, renew, progress,
//      cancel, expiry and terminal result are separate, auditable states.
//  §3  A lease records job_id, lease_id, lease_generation, holder_identity,
//      issued_at, lease_duration, expires_at. A holder has authority only
//      for that generation and that bounded window; a lease id never
//      repeats without a generation, a worker's name is never ownership.
//  §4  Duration is measured from the last observed renew time
//      (Kubernetes' renewTime); leaseTransitions counts handovers.
//  §5  Delivery is an offer; ACK means accepted before ack_deadline, never
//      success: OFFERED -> ACKED -> ACTIVE. A missed ACK deadline lets the
//      coordinator expire or reassign per policy. ACK never becomes
//      COMPLETED.
//  §6  A renew is bound to lease_id + generation + holder + renew_sequence;
//      it is valid only before expiry, from the current holder/generation,
//      and must advance the accepted sequence; then renew_time and expiry
//      are recomputed. A late renew of generation 7 never extends 7 once 8
//      is active.
//  §7  Expiry is the authority boundary; old messages are kept for audit
//      but never revive ownership; expiry is decided on the coordinator's
//      declared time policy, not the worker's clock.
//  §8  Progress is bound to the active generation with a progress_sequence;
//      accepted only if the generation is current and the sequence
//      advances; 12 after 14 keeps 14 and records 12. Progress never
//      renews.
//  §9  cancel_requested is the coordinator's intent, cancel_ack the
//      worker's acknowledgement; neither proves the work stopped. Late
//      progress during a disconnect is kept as late evidence, the
//      cancellation/expiry policy stays authoritative, and the job ends by
//      an explicit terminal reconciliation: CANCELLED, FAILED or a bounded
//      unresolved state.
//  §10 A terminal result is bound to the active lease identity/generation
//      and accepted only within the contract; SUCCESS, FAILED, CANCELLED
//      differ from the delivery ACK; a lease ACKed but expired before a
//      valid result is not success.
//  §11 Evidence is never dropped silently nor read as current:
//      stale_generation, late_progress, duplicate renew and duplicate
//      terminal attempt get explicit audit events. Only an idempotent
//      duplicate of the same accepted message may be ignored without
//      mutation; a lower generation or a contradicting holder never changes
//      the active lease.
//  §12 Two holders claiming one active generation (or two contradictory
//      holders in the coordinator's state) is an ownership_conflict that
//      is kept and stops auto-promotion; no further execution is trusted
//      until the authoritative record is resolved; a strong heartbeat does
//      not clear it.
//  §13 The evidence matrix keeps, per case: Job ID, Lease ID, Generation,
//      Holder Identity, Issued At, Lease Duration, Expires At, ACK
//      Deadline/State, Renew Sequence/Time, Progress Sequence/Value, Cancel
//      Requested/ACK, Terminal Result, Stale Generation, Late Progress,
//      Lease Expired, Ownership Conflict, Decision, Reason; a reviewer must
//      rebuild every transition from it without hidden reasoning.
//  §14 The four probes (late renew of 7 with 8 active; ACK without result;
//      progress 12 after 14; cancel + late progress during disconnect).
//  §15 On a reordering stream every message is judged on its own identity,
//      generation, sequence and timestamp; arrival order is not authority.
//
// Where each is held through the server (earlier passes):
//
//	§3, §4      TestGetLeaseShowsKubernetesStyleFields, TestSeed2AuthorityBeginsWithTheAckAndEndsAtTheInstantDeclared
//	§5          TestSeedLeaseAckDeadlineIsTheCoordinators, TestSeed2AnAcknowledgementAfterTheAckTimeoutIsRefused, TestLeaseProbeAckIsNotCompletion
//	§6          TestLeaseProbeLateRenewFromAnExpiredGeneration, TestSeed2AReplayedRenewExtendsNothing, TestLeaseFormerHolderLateRenewIsRecordedStale
//	§7          TestSeed1EveryTimeInTheMatrixIsTheCoordinators, TestSeedLeaseProgressDatedInTheFutureDecidesNothing, TestSeed2ARestartNeverRevivesAnExpiredGeneration
//	§8          TestLeaseProbeProgressNeverRegresses
//	§9          TestLeaseProbeCancelDuringDisconnect, TestSeedLeaseCancelAckNeedsARequestAndEndsNothing, TestSeedLeaseUnresolvedIsBoundedOnTheCoordinatorsClock
//	§10         TestSeed2ATerminalResultIsFinalWhoeverSpeaksAfterIt, TestSeed1AStaleGenerationsResultIsRefusedWhenItsHolderHoldsTheNext
//	§11         TestLeaseBadInputChangesNothing, TestLeaseStrangerCannotJamAnotherTreesJob, and this file
//	§12         TestLeaseRecordedConflictHaltsUntilResolved, TestLeaseConflictSurvivesKill9, TestRolloutDoesNotHandOverAConflictedLease
//	§13         TestSeed2TheEvidenceMatrixRebuildsEveryTransition, TestSeed1ACoordinatorCannotWriteTheHoldersEvidence, TestLeaseEvidencePages
//	§15         TestLeaseChannelReorderingKeepsStateAndAuthority, TestSeed1AReorderedStreamCannotOutrunACancellation
//
// The earlier passes (lease_ext, lease_rogue_ext, seed_lease_ext,
// seed1_ext, seed2_ext, evidence_ext) hold most of these through the
// server. This pass found four places where the record could say
// something that did not happen, or leave out who said what, both read the way a hostile acceptance tester
// would (docs/leases.md, "Terminal results"):
//
//   - §11: a holder that had reported its result sent the same result
//     again in other words ("disk full at row 100", then "nothing was
//     written"), or a result after the coordinator's own resolution; it was
//     answered DUPLICATE and its row read "repeats the terminal result
//     recorded", a repeat the holder never made. Only an exact repeat is an
//     idempotent duplicate now; the rest is a refused DUPLICATE_TERMINAL.
//   - §9/§13: the coordinating lineage could resolve a job CANCELLED that
//     nobody had asked to cancel (the holder's own Complete could not), so
//     the matrix read CANCELLED with "Cancel Requested" false in every row:
//     a cancellation no reviewer can rebuild. CANCELLED now needs the
//     request, whoever reconciles.
//   - §11/§13: a refused or duplicate cancel request, reassignment or
//     resolution wrote a row naming nobody; it now carries its signed
//     reason.
//   - §7/§11: a stale generation's late result kept only "result SUCCESS
//     is stale", not what it claimed; a completion's row quotes its
//     detail.

// completeSaying is complete with a detail.
func completeSaying(l *tetherv1.Lease, result tetherv1.TerminalResult, detail string) *tetherv1.ChannelRequest {
	m := complete(l, result)
	m.GetComplete().Detail = detail
	return m
}

// Seed §11: only an idempotent duplicate may pass without mutation. A
// holder reports FAILED "disk full at row 100", then FAILED again in other
// words: that is another account of the end, not a repeat of it, so it is
// a refused duplicate terminal attempt whose row says so, the record's
// result and detail untouched. The exact repeat stays a DUPLICATE. And the
// holder's result after the coordinator reconciled the job is not a repeat
// either, even with the same result: the record must not read as if the
// holder had reported what the coordinator decided.
func TestSeed4ATerminalResultInOtherWordsIsNoRepeat(t *testing.T) {
	transports(t, func(t *testing.T, w *leaseWorld, via func(*testserver.Clients) transport) {
		w1 := via(w.w1C)
		job := w.job()
		l, _ := w1.send(t, ack(w.offer(t, job, w.w1, time.Minute)))
		done, d := w1.send(t, completeSaying(l, tetherv1.TerminalResult_TERMINAL_RESULT_FAILED, "disk full at row 100"))
		wantDecision(t, "FAILED", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_TERMINAL_ACCEPTED)
		_, d = w1.send(t, completeSaying(l, tetherv1.TerminalResult_TERMINAL_RESULT_FAILED, "disk full at row 100"))
		wantDecision(t, "the exact repeat", d, tetherv1.Outcome_OUTCOME_DUPLICATE, tetherv1.AuditEvent_AUDIT_EVENT_DUPLICATE_TERMINAL)

		_, d = w1.send(t, completeSaying(l, tetherv1.TerminalResult_TERMINAL_RESULT_FAILED, "nothing was written"))
		wantDecision(t, "FAILED in other words", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_DUPLICATE_TERMINAL)
		if strings.Contains(d.Reason, "repeats") || !strings.Contains(d.Reason, "different detail") {
			t.Fatalf("the refusal reads as a repeat, or does not say what differs: %q", d.Reason)
		}
		w.sameLease(t, "FAILED in other words", done)
		ev := w.evidence(t, job)
		last := ev[len(ev)-1]
		if last.Message != "complete" || last.Decision.GetOutcome() != tetherv1.Outcome_OUTCOME_REJECTED || strings.Contains(last.Reason, "repeats") {
			t.Fatalf("the evidence row of the second account: %v", last)
		}

		// The coordinator's reconciliation, then the holder's CANCELLED.
		other := w.job()
		lo, _ := w1.send(t, ack(w.offer(t, other, w.w1, time.Minute)))
		if _, err := w.plannerC.Lease.RequestCancel(context.Background(), connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: other, Reason: "budget"})); err != nil {
			t.Fatal(err)
		}
		r, err := w.plannerC.Lease.Resolve(context.Background(), connect.NewRequest(&tetherv1.ResolveRequest{JobId: other, Result: tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED, Reason: "stopped it myself"}))
		if err != nil {
			t.Fatal(err)
		}
		wantDecision(t, "the planner's CANCELLED", r.Msg.Decision, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RESOLVED)
		resolved := w.get(t, other)
		_, d = w1.send(t, completeSaying(lo, tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED, "I stopped"))
		wantDecision(t, "the holder's CANCELLED after the planner's", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_DUPLICATE_TERMINAL)
		if strings.Contains(d.Reason, "repeats") {
			t.Fatalf("the holder's late result reads as a repeat of the planner's: %q", d.Reason)
		}
		w.sameLease(t, "the holder's CANCELLED after the planner's", resolved)
	})
}

// Seed §9 and §13: cancellation is a request, an acknowledgement and a
// reconciliation, and the matrix must let a reviewer rebuild it. The
// holder cannot report CANCELLED without a request; neither may the
// coordinating lineage resolve a job CANCELLED that nobody asked to stop —
// directly, or by first parking it as UNRESOLVED. Each attempt is refused
// with a reason saying why, changes nothing, and is one evidence row; after
// the request, the same reconciliation is accepted and its row shows the
// request.
func TestSeed4CancelledNeedsACancelRequestWhoeverReconciles(t *testing.T) {
	w := newLeaseWorld(t)
	ctx := context.Background()
	resolve := func(job string, result tetherv1.TerminalResult, why string) *tetherv1.Decision {
		t.Helper()
		r, err := w.plannerC.Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{JobId: job, Result: result, Reason: why}))
		if err != nil {
			t.Fatal(err)
		}
		return r.Msg.Decision
	}

	job := w.job()
	l, _ := unary{w.w1C}.send(t, ack(w.offer(t, job, w.w1, time.Minute)))
	before := w.get(t, job)
	rows := len(w.evidence(t, job))
	d := resolve(job, tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED, "nobody asked")
	wantDecision(t, "CANCELLED without a request", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_INVALID_TRANSITION)
	if !strings.Contains(d.Reason, "no cancellation was requested") {
		t.Fatalf("the refusal does not say why: %q", d.Reason)
	}
	w.sameLease(t, "CANCELLED without a request", before)
	ev := w.evidence(t, job)
	if len(ev) != rows+1 || ev[rows].Message != "resolve" || ev[rows].TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_UNSPECIFIED {
		t.Fatalf("evidence after the refused reconciliation (%d rows, want %d): %v", len(ev), rows+1, ev[len(ev)-1])
	}
	// The holder still holds its authority: its renew is judged as usual.
	if _, d := (unary{w.w1C}).send(t, renew(l, 1)); d.Outcome != tetherv1.Outcome_OUTCOME_ACCEPTED {
		t.Fatalf("the holder's renew after the refused reconciliation: %v", d)
	}

	// Parking it as UNRESOLVED is no way round.
	parked := w.job()
	unary{w.w1C}.send(t, ack(w.offer(t, parked, w.w1, time.Minute)))
	wantDecision(t, "UNRESOLVED", resolve(parked, tetherv1.TerminalResult_TERMINAL_RESULT_UNRESOLVED, "host unreachable"), tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RESOLVED)
	unresolved := w.get(t, parked)
	wantDecision(t, "UNRESOLVED then CANCELLED without a request", resolve(parked, tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED, "it stopped, we think"),
		tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_INVALID_TRANSITION)
	w.sameLease(t, "UNRESOLVED then CANCELLED without a request", unresolved)

	// With the request, the reconciliation stands, and its row shows it.
	if _, err := w.plannerC.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: job, Reason: "budget"})); err != nil {
		t.Fatal(err)
	}
	wantDecision(t, "CANCELLED after the request", resolve(job, tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED, "stopped"), tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RESOLVED)
	ev = w.evidence(t, job)
	if last := ev[len(ev)-1]; last.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED || !last.CancelRequested {
		t.Fatalf("the CANCELLED row does not show the request: %v", last)
	}
	for _, r := range ev {
		if r.TerminalResult == tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED && !r.CancelRequested {
			t.Fatalf("a CANCELLED row without the request: %v", r)
		}
	}
}

// Seed §11 and §13: a refused or duplicate coordinator message is evidence
// too, and a reviewer must be able to tell from the matrix alone who sent
// it. The planner closes a job FAILED; an operator then tries CANCELLED,
// FAILED again, a cancel request and a reassignment. Each attempt is one
// row, nothing changes — and each row names the operator (and its words),
// as an accepted one does, so the planner's decision and the operator's
// later disagreement cannot be mistaken for each other.
func TestSeed4ARefusedCoordinatorMessageNamesWhoSentIt(t *testing.T) {
	w := newLeaseWorld(t)
	ctx := context.Background()
	job := w.job()
	unary{w.w1C}.send(t, ack(w.offer(t, job, w.w1, time.Minute)))
	if _, err := w.plannerC.Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{JobId: job, Result: tetherv1.TerminalResult_TERMINAL_RESULT_FAILED, Reason: "planner gave up"})); err != nil {
		t.Fatal(err)
	}
	closed := w.get(t, job)
	who, err := w.admin.Auth.WhoAmI(ctx, connect.NewRequest(&tetherv1.WhoAmIRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	attempts := []struct {
		what string
		send func() (*tetherv1.Decision, error)
		want tetherv1.Outcome
	}{
		{"CANCELLED over FAILED", func() (*tetherv1.Decision, error) {
			return decisionOf(w.admin.Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{JobId: job, Result: tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED, Reason: "operator says cancelled"})))
		}, tetherv1.Outcome_OUTCOME_REJECTED},
		// Not the planner's words: no repeat of its resolution (seed6).
		{"FAILED again", func() (*tetherv1.Decision, error) {
			return decisionOf(w.admin.Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{JobId: job, Result: tetherv1.TerminalResult_TERMINAL_RESULT_FAILED, Reason: "operator agrees"})))
		}, tetherv1.Outcome_OUTCOME_REJECTED},
		{"a cancel request after the end", func() (*tetherv1.Decision, error) {
			return decisionOf(w.admin.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: job, Reason: "operator stop"})))
		}, tetherv1.Outcome_OUTCOME_REJECTED},
		{"a reassignment after the end", func() (*tetherv1.Decision, error) {
			return decisionOf(w.admin.Lease.Reassign(ctx, connect.NewRequest(&tetherv1.ReassignRequest{JobId: job, HolderIdentity: w.w2, Reason: "operator retry"})))
		}, tetherv1.Outcome_OUTCOME_REJECTED},
	}
	for _, a := range attempts {
		rows := len(w.evidence(t, job))
		d, err := a.send()
		if err != nil {
			t.Fatalf("%s: %v", a.what, err)
		}
		if d.Outcome != a.want {
			t.Fatalf("%s: %v, want %s", a.what, d, a.want)
		}
		w.sameLease(t, a.what, closed)
		ev := w.evidence(t, job)
		if len(ev) != rows+1 {
			t.Fatalf("%s wrote %d rows, want 1", a.what, len(ev)-rows)
		}
		if r := ev[rows].Reason; !strings.Contains(r, who.Msg.Principal+": operator") {
			t.Fatalf("%s: the row does not say who sent it (%s): %q", a.what, who.Msg.Principal, r)
		}
	}
}

// Seed §7, §9 and §11: messages from a generation that lost its authority
// are kept for audit, not dropped. A late result is a message like a late
// progress: its row must keep what it claimed, or a reviewer cannot tell a
// stale "SUCCESS: wrote 100 rows" from a stale "FAILED: nothing written".
// Generation 1's holder, fenced off by generation 2, reports SUCCESS with
// a detail: refused, the lease unchanged, and the row quotes the detail
// (as a late progress's row quotes its value). So does an accepted
// result's row: the matrix has no detail column, and the reason is where a
// reviewer reads what the holder said it did.
func TestSeed4AStaleResultKeepsWhatItClaimed(t *testing.T) {
	transports(t, func(t *testing.T, w *leaseWorld, via func(*testserver.Clients) transport) {
		w1, w2 := via(w.w1C), via(w.w2C)
		job := w.job()
		l1, _ := w1.send(t, ack(w.offer(t, job, w.w1, time.Minute)))
		l2, _ := w2.send(t, ack(w.reassign(t, job, w.w2, time.Minute)))
		before := w.get(t, job)
		_, d := w1.send(t, completeSaying(l1, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS, "wrote 100 rows"))
		wantDecision(t, "generation 1's late SUCCESS", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_STALE_GENERATION)
		before.StaleGeneration = true // the evidence flag, and nothing else
		w.sameLease(t, "generation 1's late SUCCESS", before)
		ev := w.evidence(t, job)
		if last := ev[len(ev)-1]; !last.StaleGeneration || !strings.Contains(last.Reason, "wrote 100 rows") {
			t.Fatalf("the stale result's row does not keep what it claimed: %v", last)
		}
		_, d = w2.send(t, completeSaying(l2, tetherv1.TerminalResult_TERMINAL_RESULT_FAILED, "nothing written"))
		wantDecision(t, "generation 2's FAILED", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_TERMINAL_ACCEPTED)
		ev = w.evidence(t, job)
		if last := ev[len(ev)-1]; !strings.Contains(last.Reason, "nothing written") {
			t.Fatalf("the accepted result's row does not say what the holder reported: %v", last)
		}
	})
}
