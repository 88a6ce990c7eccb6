package controlplane_test

import (
	"testing"
	"time"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue44FRetransmittedRenewAfterTheEndIsADuplicate: seed 000 §11
// and §15 on a real server — a duplicate renew gets an explicit outcome,
// a repeat of the accepted sequence is ignored without mutation, and a
// message is judged by its own generation and sequence, not by when the
// network delivered it. A holder renewed (seq 1, accepted), then reported
// SUCCESS; its stream delivered the renew again after the result (and,
// for a second job, after the lease expired). Before, the evidence row of
// the repeat read REJECTED (INVALID_TRANSITION "the job is terminal",
// LEASE_EXPIRED "never revived"): the matrix said the holder asked to
// extend its authority after the job ended, where the same copy delivered
// before the end reads DUPLICATE DUPLICATE_RENEW. Now it is DUPLICATE
// after the end too, the lease unchanged; a renew with a sequence the
// record never accepted is still refused.
func TestRogue44FRetransmittedRenewAfterTheEndIsADuplicate(t *testing.T) {
	transports(t, func(t *testing.T, w *leaseWorld, via func(*testserver.Clients) transport) {
		w1 := via(w.w1C)
		dup := 0
		lastRow := func(job string) *tetherv1.EvidenceRow {
			rows := w.evidence(t, job)
			return rows[len(rows)-1]
		}

		// After the holder's SUCCESS.
		l, _ := w1.send(t, ack(w.offer(t, w.job(), w.w1, time.Minute)))
		l, d := w1.send(t, renew(l, 1))
		wantDecision(t, "renew 1", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RENEWED)
		ended, d := w1.send(t, complete(l, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS))
		wantDecision(t, "the holder's SUCCESS", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_TERMINAL_ACCEPTED)
		after, d := w1.send(t, renew(l, 1))
		row := lastRow(l.JobId)
		t.Logf("after SUCCESS: the repeat is %s %s; its row %s %s", d.GetOutcome(), d.GetAuditEvent(), row.GetDecision().GetOutcome(), row.GetDecision().GetAuditEvent())
		if d.GetOutcome() == tetherv1.Outcome_OUTCOME_DUPLICATE && d.GetAuditEvent() == tetherv1.AuditEvent_AUDIT_EVENT_DUPLICATE_RENEW &&
			row.GetDecision().GetOutcome() == tetherv1.Outcome_OUTCOME_DUPLICATE {
			dup++
		}
		if row.GetReason() != d.GetReason() {
			t.Errorf("the row's reason %q is not the answer's %q", row.GetReason(), d.GetReason())
		}
		if after.State != ended.State || after.TerminalResult != ended.TerminalResult || after.RenewSequence != 1 || !after.ExpiresAt.AsTime().Equal(ended.ExpiresAt.AsTime()) {
			t.Fatalf("the repeat changed the record: %v", after)
		}

		// After the expiry.
		l2, _ := w1.send(t, ack(w.offer(t, w.job(), w.w1, time.Minute)))
		l2, _ = w1.send(t, renew(l2, 1))
		w.clock.Advance(2 * time.Minute)
		if got := w.get(t, l2.JobId); got.State != tetherv1.LeaseState_LEASE_STATE_EXPIRED {
			t.Fatalf("the lease past its expiry reads %s", got.State)
		}
		after, d = w1.send(t, renew(l2, 1))
		row = lastRow(l2.JobId)
		t.Logf("after the expiry: the repeat is %s %s; its row %s %s", d.GetOutcome(), d.GetAuditEvent(), row.GetDecision().GetOutcome(), row.GetDecision().GetAuditEvent())
		if d.GetOutcome() == tetherv1.Outcome_OUTCOME_DUPLICATE && d.GetAuditEvent() == tetherv1.AuditEvent_AUDIT_EVENT_DUPLICATE_RENEW &&
			row.GetDecision().GetOutcome() == tetherv1.Outcome_OUTCOME_DUPLICATE {
			dup++
		}
		if row.GetReason() != d.GetReason() {
			t.Errorf("the row's reason %q is not the answer's %q", row.GetReason(), d.GetReason())
		}
		if after.State != tetherv1.LeaseState_LEASE_STATE_EXPIRED || after.RenewSequence != 1 {
			t.Fatalf("the repeat changed the record: %v", after)
		}
		if dup != 2 {
			t.Errorf("%d of 2 repeats of the accepted renew after the end read DUPLICATE DUPLICATE_RENEW, want 2", dup)
		}

		// A renew the record never accepted is still refused after the end.
		_, d = w1.send(t, renew(l, 2))
		wantDecision(t, "new renew after SUCCESS", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_INVALID_TRANSITION)
		_, d = w1.send(t, renew(l2, 2))
		wantDecision(t, "new renew after the expiry", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_LEASE_EXPIRED)
	})
}
