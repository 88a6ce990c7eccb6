package controlplane_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue42MRetransmittedProgressAfterTheEndIsNoLateProgress: seed 000
// §11 and §15 on a real server — a repeat of the accepted progress
// sequence is a duplicate, ignored without mutation, and a message is
// judged by its own generation and sequence, not by when the network
// delivered it. A holder asked to cancel reported progress 1, acknowledged
// the cancel and ended the job CANCELLED; its stream delivered progress 1
// again after the result (and, for a second job, after the expiry ended a
// holder that never answered). Before, the repeat was judged LATE_PROGRESS
// and set the lease's late_progress: the evidence matrix read that the
// worker reported work after its cancellation ended the job — the
// evidence seed §9 keeps for a worker that did not stop — which it never
// did, where the same messages delivered before the result read DUPLICATE.
// Now the repeat is DUPLICATE DUPLICATE_PROGRESS and late_progress stays
// unset; new progress after the end is still late evidence.
func TestRogue42MRetransmittedProgressAfterTheEndIsNoLateProgress(t *testing.T) {
	transports(t, func(t *testing.T, w *leaseWorld, via func(*testserver.Clients) transport) {
		ctx := context.Background()
		w1 := via(w.w1C)
		cancel := func(job string) {
			t.Helper()
			if _, err := w.plannerC.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: job, Reason: "budget"})); err != nil {
				t.Fatal(err)
			}
		}
		clean := 0

		// After the holder's CANCELLED.
		l, _ := w1.send(t, ack(w.offer(t, w.job(), w.w1, time.Minute)))
		l, _ = w1.send(t, progress(l, 1, "10%"))
		cancel(l.JobId)
		w1.send(t, cancelAck(l))
		ended, d := w1.send(t, complete(l, tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED))
		wantDecision(t, "the holder's CANCELLED", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_TERMINAL_ACCEPTED)
		after, d := w1.send(t, progress(l, 1, "10%"))
		if d.GetOutcome() == tetherv1.Outcome_OUTCOME_DUPLICATE && !w.get(t, l.JobId).LateProgress {
			clean++
		}
		t.Logf("after CANCELLED: the repeat is %s %s, late_progress=%v", d.GetOutcome(), d.GetAuditEvent(), w.get(t, l.JobId).LateProgress)
		if after.TerminalResult != ended.TerminalResult || after.ProgressSequence != 1 {
			t.Fatalf("the repeat changed the record: %v", after)
		}

		// After the expiry of a holder that never answered the cancel.
		l2, _ := w1.send(t, ack(w.offer(t, w.job(), w.w1, time.Minute)))
		l2, _ = w1.send(t, progress(l2, 1, "10%"))
		cancel(l2.JobId)
		w.clock.Advance(2 * time.Minute)
		_, d = w1.send(t, progress(l2, 1, "10%"))
		if d.GetOutcome() == tetherv1.Outcome_OUTCOME_DUPLICATE && !w.get(t, l2.JobId).LateProgress {
			clean++
		}
		t.Logf("after the expiry: the repeat is %s %s, late_progress=%v", d.GetOutcome(), d.GetAuditEvent(), w.get(t, l2.JobId).LateProgress)
		if clean != 2 {
			t.Errorf("%d of 2 repeats of accepted progress after the end left the record clean (DUPLICATE, late_progress unset), want 2", clean)
		}

		// New progress after the end is still late evidence.
		late, d := w1.send(t, progress(l, 2, "20%"))
		wantDecision(t, "new progress after CANCELLED", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_LATE_PROGRESS)
		if !late.LateProgress || late.ProgressSequence != 1 {
			t.Fatalf("new progress after the end: %v", late)
		}
	})
}
