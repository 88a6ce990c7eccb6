package controlplane_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// Acceptance probes of the job-lease seed through the real server, clause
// by clause, for what the other lease tests leave out: the cooperative path
// and what a rogue holder could do to fake, delay or dodge it.

// sameLease fails unless the job's durable lease is exactly before.
func (w *leaseWorld) sameLease(t *testing.T, what string, before *tetherv1.Lease) {
	t.Helper()
	if after := w.get(t, before.JobId); !proto.Equal(before, after) {
		t.Fatalf("%s changed the lease:\nbefore %v\nafter  %v", what, before, after)
	}
}

// Seed §9 and §11: an acknowledgement answers a cancel request. A holder
// that acknowledges a cancel nobody requested (to make the record read as
// an orderly stop) is refused with a reason in the seed's words, the
// lease unchanged, the attempt kept as one evidence row. The cooperative
// path then: the cancel ACK is recorded but is not the end (the job stays
// ACTIVE without a result), success is refused, CANCELLED closes the job,
// and the holder cannot flip the result afterwards — a repeat is an
// explicit DUPLICATE_TERMINAL, a different result a refused one.
func TestSeedLeaseCancelAckNeedsARequestAndEndsNothing(t *testing.T) {
	transports(t, func(t *testing.T, w *leaseWorld, via func(*testserver.Clients) transport) {
		w1 := via(w.w1C)
		job := w.job()
		l, _ := w1.send(t, ack(w.offer(t, job, w.w1, time.Minute)))
		rows := len(w.evidence(t, job))

		before := w.get(t, job)
		_, d := w1.send(t, cancelAck(l))
		wantDecision(t, "an ack of a cancel never sent", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_INVALID_TRANSITION)
		if !strings.Contains(d.Reason, "no cancellation was requested") {
			t.Fatalf("the refusal does not say why: %q", d.Reason)
		}
		w.sameLease(t, "an ack of a cancel never sent", before)
		ev := w.evidence(t, job)
		if len(ev) != rows+1 || ev[len(ev)-1].Message != "cancel_ack" || ev[len(ev)-1].CancelAck || ev[len(ev)-1].CancelRequested {
			t.Fatalf("evidence after the refused cancel ack (%d rows, want %d): %v", len(ev), rows+1, ev[len(ev)-1])
		}

		if _, err := w.plannerC.Lease.RequestCancel(context.Background(), connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: job, Reason: "budget"})); err != nil {
			t.Fatal(err)
		}
		acked, d := w1.send(t, cancelAck(l))
		wantDecision(t, "the cancel ack", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_CANCEL_ACKED)
		if !acked.CancelAck || acked.State != tetherv1.LeaseState_LEASE_STATE_ACTIVE || acked.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_UNSPECIFIED {
			t.Fatalf("a cancel ack is an acknowledgement, not the end: %v", acked)
		}
		_, d = w1.send(t, cancelAck(l))
		wantDecision(t, "the cancel ack again", d, tetherv1.Outcome_OUTCOME_DUPLICATE, tetherv1.AuditEvent_AUDIT_EVENT_DUPLICATE_CANCEL)
		w.sameLease(t, "a repeated cancel ack", acked)

		_, d = w1.send(t, complete(l, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS))
		wantDecision(t, "success after the cancel", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_INVALID_TRANSITION)
		w.sameLease(t, "success after the cancel", acked)
		done, d := w1.send(t, complete(l, tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED))
		wantDecision(t, "CANCELLED", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_TERMINAL_ACCEPTED)
		if done.State != tetherv1.LeaseState_LEASE_STATE_TERMINAL || done.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED {
			t.Fatalf("after CANCELLED: %v", done)
		}
		_, d = w1.send(t, complete(l, tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED))
		wantDecision(t, "CANCELLED again", d, tetherv1.Outcome_OUTCOME_DUPLICATE, tetherv1.AuditEvent_AUDIT_EVENT_DUPLICATE_TERMINAL)
		_, d = w1.send(t, complete(l, tetherv1.TerminalResult_TERMINAL_RESULT_FAILED))
		wantDecision(t, "FAILED after CANCELLED", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_DUPLICATE_TERMINAL)
		w.sameLease(t, "the terminal attempts after the result", done)
	})
}

// Seed §5 and §7: the ACK deadline is the coordinator's. The holder of an
// offer it never ACKed in time finds the generation expired by the
// coordinator's own deadline (nobody else sent anything); its late ACK,
// dated before the deadline, is refused ACK_DEADLINE_MISSED, as are a
// renew and a completion: nothing it sends revives the generation.
func TestSeedLeaseAckDeadlineIsTheCoordinators(t *testing.T) {
	w := newLeaseWorld(t)
	ctx := context.Background()
	job := w.job()
	resp, err := w.admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: w.w1,
		LeaseDuration: durationpb.New(time.Minute), AckTimeout: durationpb.New(5 * time.Second)}))
	if err != nil {
		t.Fatal(err)
	}
	l := resp.Msg.Lease
	deadline := l.AckDeadline.AsTime()
	w.clock.Advance(5 * time.Second)
	testserver.WaitFor(t, 20*time.Second, "the coordinator to expire the unacknowledged offer", func() bool {
		return w.get(t, job).State == tetherv1.LeaseState_LEASE_STATE_EXPIRED
	})
	expired := w.get(t, job)
	if expired.AckState != tetherv1.AckState_ACK_STATE_MISSED || !expired.LeaseExpired || expired.ExpiresAt != nil {
		t.Fatalf("the expired offer: %v", expired)
	}
	ev := w.evidence(t, job)
	if last := ev[len(ev)-1]; last.Message != "tick" || last.Decision.AuditEvent != tetherv1.AuditEvent_AUDIT_EVENT_ACK_DEADLINE_MISSED {
		t.Fatalf("the coordinator's own expiry is not in the evidence: %v", last)
	}

	a, err := w.w1C.Lease.Ack(ctx, connect.NewRequest(&tetherv1.AckRequest{JobId: job, LeaseId: l.LeaseId, LeaseGeneration: 1,
		SentAt: timestamppb.New(deadline.Add(-time.Second))}))
	if err != nil {
		t.Fatal(err)
	}
	wantDecision(t, "an ack after the deadline dated before it", a.Msg.Decision, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_ACK_DEADLINE_MISSED)
	w1 := unary{w.w1C}
	_, d := w1.send(t, renew(l, 1))
	wantDecision(t, "a renew of the missed offer", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_LEASE_EXPIRED)
	_, d = w1.send(t, complete(l, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS))
	wantDecision(t, "success on the missed offer", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_LEASE_EXPIRED)
	w.sameLease(t, "the late messages", expired)
}

// Seed §7, §8 and §15: progress is ordered by its sequence, never by the
// time the worker writes on it. A holder dates its progress hours ahead to
// look newer, then sends an earlier sequence dated later still: the first
// is accepted on its sequence (and renews nothing), the second is late
// evidence; the worker's dates decide nothing, and the skew is noted.
func TestSeedLeaseProgressDatedInTheFutureDecidesNothing(t *testing.T) {
	w := newLeaseWorld(t)
	ctx := context.Background()
	job := w.job()
	l, _ := unary{w.w1C}.send(t, ack(w.offer(t, job, w.w1, time.Minute)))
	send := func(seq uint64, value string, sent time.Time) *tetherv1.ProgressResponse {
		t.Helper()
		r, err := w.w1C.Lease.Progress(ctx, connect.NewRequest(&tetherv1.ProgressRequest{JobId: job, LeaseId: l.LeaseId, LeaseGeneration: 1,
			ProgressSequence: seq, ProgressValue: value, SentAt: timestamppb.New(sent)}))
		if err != nil {
			t.Fatal(err)
		}
		return r.Msg
	}
	now := w.clock.Now()
	r := send(5, "50%", now.Add(5*time.Hour))
	wantDecision(t, "progress dated five hours ahead", r.Decision, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_PROGRESS_RECORDED)
	if !strings.Contains(r.Decision.Reason, "evidence only") {
		t.Fatalf("the skew is not noted: %q", r.Decision.Reason)
	}
	if !r.Lease.ExpiresAt.AsTime().Equal(l.ExpiresAt.AsTime()) {
		t.Fatalf("progress from the future moved the expiry %s -> %s", l.ExpiresAt.AsTime(), r.Lease.ExpiresAt.AsTime())
	}
	accepted := r.Lease
	r = send(4, "99%", now.Add(10*time.Hour))
	wantDecision(t, "an earlier sequence dated later", r.Decision, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_LATE_PROGRESS)
	if got := w.get(t, job); got.ProgressSequence != 5 || got.ProgressValue != "50%" || !got.LateProgress ||
		!got.ExpiresAt.AsTime().Equal(accepted.ExpiresAt.AsTime()) {
		t.Fatalf("after the late progress: %v", got)
	}
	// And a higher sequence dated in the past is simply the next one.
	r = send(6, "60%", now.Add(-10*time.Hour))
	wantDecision(t, "the next sequence dated in the past", r.Decision, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_PROGRESS_RECORDED)
	// The last second the wire allows: the skew used to go unnoted (the
	// difference saturates and its negation overflowed).
	r = send(7, "70%", time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC))
	wantDecision(t, "progress dated in the year 9999", r.Decision, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_PROGRESS_RECORDED)
	const note = "sent_at 9999-12-31T23:59:59Z differs from the coordinator clock by more than 290 years"
	if !strings.Contains(r.Decision.Reason, note) {
		t.Fatalf("the skew of a date in the year 9999 is not noted: %q", r.Decision.Reason)
	}
	if ev := w.evidence(t, job); !strings.Contains(ev[len(ev)-1].Reason, note) || !r.Lease.ExpiresAt.AsTime().Equal(l.ExpiresAt.AsTime()) {
		t.Fatalf("the evidence row does not keep the note, or the expiry moved: %v", ev[len(ev)-1])
	}
}

// Reading what it should not: a former holder's late traffic is judged (as
// stale evidence), and it may read nothing of the generation that replaced
// its own — GetLease and Evidence refuse it. Its stale renew, progress,
// completion, cancel ack and ACK used to be answered with the successor's
// whole lease (its holder, lease id, progress value) and a reason naming
// them: a read of another worker's job at will. The answer now says only
// that it was fenced off (the job, generation 2, its state); the evidence
// row keeps the whole judgement, and the successor's answers are whole.
func TestSeedLeaseAFormerHolderReadsNothingOfItsSuccessor(t *testing.T) {
	transports(t, func(t *testing.T, w *leaseWorld, via func(*testserver.Clients) transport) {
		w1, w2 := via(w.w1C), via(w.w2C)
		job := w.job()
		l1, _ := w1.send(t, ack(w.offer(t, job, w.w1, time.Minute)))
		w1.send(t, progress(l1, 1, "10%"))
		l2, _ := w2.send(t, ack(w.reassign(t, job, w.w2, time.Minute)))
		l2, _ = w2.send(t, progress(l2, 1, "w2-private-progress"))
		if l2.HolderIdentity != w.w2 || l2.ProgressValue != "w2-private-progress" {
			t.Fatalf("the holder's own answer is not its whole lease: %v", l2)
		}
		secrets := []string{w.w2, l2.LeaseId, "w2-private-progress"}
		for _, m := range []*tetherv1.ChannelRequest{ack(l1), renew(l1, 1), progress(l1, 2, "20%"), cancelAck(l1), complete(l1, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS)} {
			rows := len(w.evidence(t, job))
			got, d := w1.send(t, m)
			what := fmt.Sprintf("%T from the former holder", m.Message)
			wantDecision(t, what, d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_STALE_GENERATION)
			if got.GetLeaseGeneration() != 2 || got.GetState() != tetherv1.LeaseState_LEASE_STATE_ACTIVE || got.GetJobId() != job {
				t.Fatalf("%s: the answer does not say the job went on as generation 2: %v", what, got)
			}
			if leaks := leaseLeaks(got.String()+" "+d.Reason, secrets...); len(leaks) > 0 {
				t.Fatalf("%s: the answer shows the successor's %q:\n%v\n%s", what, leaks, got, d.Reason)
			}
			ev := w.evidence(t, job)
			if last := ev[len(ev)-1]; len(ev) != rows+1 || !strings.Contains(last.Reason, l2.LeaseId) || !last.StaleGeneration || last.HolderIdentity != w.w2 {
				t.Fatalf("%s: the evidence row (%d rows, want %d) does not keep the whole judgement: %v", what, len(ev), rows+1, last)
			}
		}
		ctx := context.Background()
		if _, err := w.w1C.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: job})); connect.CodeOf(err) != connect.CodePermissionDenied {
			t.Fatalf("the former holder's GetLease: %v, want permission_denied", err)
		}
		if _, err := w.w1C.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: job})); connect.CodeOf(err) != connect.CodePermissionDenied {
			t.Fatalf("the former holder's Evidence: %v, want permission_denied", err)
		}
		if got, d := w2.send(t, renew(l2, 1)); d.Outcome != tetherv1.Outcome_OUTCOME_ACCEPTED || got.HolderIdentity != w.w2 || got.ProgressValue != "w2-private-progress" {
			t.Fatalf("the holder's renew: %v %v", d, got)
		}
	})
}

// Seed §9 and §10: a job whose end cannot be told is reconciled as
// UNRESOLVED only for a bound, on the coordinator's clock. Meanwhile the
// holder's success, renew and progress change nothing (late evidence);
// the coordinator may still settle it (CANCELLED); if nobody does, the
// coordinator itself closes it as FAILED when the bound elapses — never
// success — and nothing changes it afterwards.
func TestSeedLeaseUnresolvedIsBoundedOnTheCoordinatorsClock(t *testing.T) {
	w := newLeaseWorld(t)
	ctx := context.Background()
	unresolved := func(job string) *tetherv1.Lease {
		t.Helper()
		l, _ := unary{w.w1C}.send(t, ack(w.offer(t, job, w.w1, time.Minute)))
		if _, err := w.plannerC.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: job, Reason: "worker unreachable"})); err != nil {
			t.Fatal(err)
		}
		r, err := w.plannerC.Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{JobId: job, Result: tetherv1.TerminalResult_TERMINAL_RESULT_UNRESOLVED,
			UnresolvedBound: durationpb.New(2 * time.Minute), Reason: "cannot tell whether it stopped"}))
		if err != nil {
			t.Fatal(err)
		}
		wantDecision(t, "resolve as UNRESOLVED", r.Msg.Decision, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RESOLVED)
		if got := r.Msg.Lease; got.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_UNRESOLVED || !got.UnresolvedUntil.AsTime().Equal(w.clock.Now().Add(2*time.Minute)) {
			t.Fatalf("the unresolved lease: %v", got)
		}
		return l
	}
	settled, lapsed := w.job(), w.job()
	ls := unresolved(settled)
	ll := unresolved(lapsed)

	for _, l := range []*tetherv1.Lease{ls, ll} {
		before := w.get(t, l.JobId)
		for _, m := range []*tetherv1.ChannelRequest{complete(l, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS), complete(l, tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED), renew(l, 1)} {
			if _, d := (unary{w.w1C}).send(t, m); d.Outcome != tetherv1.Outcome_OUTCOME_REJECTED {
				t.Fatalf("%T while UNRESOLVED: %v", m.Message, d)
			}
		}
		_, d := unary{w.w1C}.send(t, progress(l, 1, "still going"))
		wantDecision(t, "progress while UNRESOLVED", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_LATE_PROGRESS)
		after := w.get(t, l.JobId)
		if after.TerminalResult != before.TerminalResult || after.State != before.State || after.ProgressSequence != 0 || !after.LateProgress {
			t.Fatalf("the holder changed an UNRESOLVED job:\nbefore %v\nafter  %v", before, after)
		}
	}

	r, err := w.plannerC.Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{JobId: settled, Result: tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED, Reason: "confirmed stopped"}))
	if err != nil {
		t.Fatal(err)
	}
	wantDecision(t, "settling within the bound", r.Msg.Decision, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RESOLVED)

	w.clock.Advance(2 * time.Minute)
	testserver.WaitFor(t, 20*time.Second, "the coordinator to close the lapsed UNRESOLVED job", func() bool {
		return w.get(t, lapsed).TerminalResult == tetherv1.TerminalResult_TERMINAL_RESULT_FAILED
	})
	ev := w.evidence(t, lapsed)
	if last := ev[len(ev)-1]; last.Message != "tick" || last.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_FAILED || !strings.Contains(last.Reason, "FAILED") {
		t.Fatalf("the coordinator's closing row: %v", last)
	}
	closed := w.get(t, lapsed)
	r, err = w.plannerC.Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{JobId: lapsed, Result: tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED, Reason: "too late"}))
	if err != nil {
		t.Fatal(err)
	}
	wantDecision(t, "settling after the bound", r.Msg.Decision, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_DUPLICATE_TERMINAL)
	w.sameLease(t, "settling after the bound", closed)
	if got := w.get(t, settled); got.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED {
		t.Fatalf("the settled job after the bound: %v", got)
	}
}
