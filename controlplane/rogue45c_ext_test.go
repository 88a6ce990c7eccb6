package controlplane_test

import (
	"testing"
	"time"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue45CRenewBehindTheAcceptedAfterTheEndIsStale: seed 000 §6, §11
// and §15 on a real server — a renew is judged by its generation and
// sequence, one behind the accepted sequence is stale traffic with an
// explicit outcome, and arrival order is not authority. A holder renewed
// with seq 1 and 2 (both accepted), then reported SUCCESS (and, for a
// second job, let its lease expire); its stream delivered the renew seq 1
// again after that end. Delivered before the end it reads REJECTED
// STALE_RENEW. Before, after the end its answer and evidence row read
// REJECTED INVALID_TRANSITION ("the job is terminal") or LEASE_EXPIRED
// ("never revived"): the matrix said the holder asked to extend its
// authority after the job ended, where the message was one the record had
// already passed. Now it is STALE_RENEW after the end too, the lease
// unchanged; a renew ahead of the accepted one is still refused as an ask
// after the end.
func TestRogue45CRenewBehindTheAcceptedAfterTheEndIsStale(t *testing.T) {
	transports(t, func(t *testing.T, w *leaseWorld, via func(*testserver.Clients) transport) {
		w1 := via(w.w1C)
		stale := 0
		lastRow := func(job string) *tetherv1.EvidenceRow {
			rows := w.evidence(t, job)
			return rows[len(rows)-1]
		}
		renewedTwice := func() *tetherv1.Lease {
			l, _ := w1.send(t, ack(w.offer(t, w.job(), w.w1, time.Minute)))
			_, d := w1.send(t, renew(l, 1))
			wantDecision(t, "renew 1", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RENEWED)
			l, d = w1.send(t, renew(l, 2))
			wantDecision(t, "renew 2", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RENEWED)
			return l
		}
		judged := func(what string, after *tetherv1.Lease, d *tetherv1.Decision, job string) {
			t.Helper()
			row := lastRow(job)
			t.Logf("%s: renew 1, behind the accepted 2, is %s %s; its row %s %s", what, d.GetOutcome(), d.GetAuditEvent(), row.GetDecision().GetOutcome(), row.GetDecision().GetAuditEvent())
			if d.GetOutcome() == tetherv1.Outcome_OUTCOME_REJECTED && d.GetAuditEvent() == tetherv1.AuditEvent_AUDIT_EVENT_STALE_RENEW &&
				row.GetDecision().GetAuditEvent() == tetherv1.AuditEvent_AUDIT_EVENT_STALE_RENEW {
				stale++
			}
			if row.GetReason() != d.GetReason() {
				t.Errorf("the row's reason %q is not the answer's %q", row.GetReason(), d.GetReason())
			}
			if after.RenewSequence != 2 || after.State == tetherv1.LeaseState_LEASE_STATE_ACTIVE {
				t.Fatalf("%s: the stale renew changed the record: %v", what, after)
			}
		}

		// Before the end: stale.
		l := renewedTwice()
		_, d := w1.send(t, renew(l, 1))
		wantDecision(t, "renew 1 behind 2 before the end", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_STALE_RENEW)

		// After the holder's SUCCESS.
		ended, d := w1.send(t, complete(l, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS))
		wantDecision(t, "the holder's SUCCESS", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_TERMINAL_ACCEPTED)
		after, d := w1.send(t, renew(l, 1))
		judged("after SUCCESS", after, d, l.JobId)
		if after.State != ended.State || after.TerminalResult != ended.TerminalResult || !after.ExpiresAt.AsTime().Equal(ended.ExpiresAt.AsTime()) {
			t.Fatalf("the stale renew changed the record: %v", after)
		}

		// After the expiry.
		l2 := renewedTwice()
		w.clock.Advance(2 * time.Minute)
		if got := w.get(t, l2.JobId); got.State != tetherv1.LeaseState_LEASE_STATE_EXPIRED {
			t.Fatalf("the lease past its expiry reads %s", got.State)
		}
		after, d = w1.send(t, renew(l2, 1))
		judged("after the expiry", after, d, l2.JobId)
		if after.State != tetherv1.LeaseState_LEASE_STATE_EXPIRED {
			t.Fatalf("the stale renew changed the record: %v", after)
		}
		if stale != 2 {
			t.Errorf("%d of 2 renewals behind the accepted one after the end read REJECTED STALE_RENEW, want 2", stale)
		}

		// A renew ahead of the accepted one is still refused as an ask
		// after the end.
		_, d = w1.send(t, renew(l, 3))
		wantDecision(t, "new renew after SUCCESS", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_INVALID_TRANSITION)
		_, d = w1.send(t, renew(l2, 3))
		wantDecision(t, "new renew after the expiry", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_LEASE_EXPIRED)
	})
}
