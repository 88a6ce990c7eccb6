package controlplane_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue29DAFailedResultLeavesTheCancelAckToRecordInAnyOrder: seed §9
// and §15. A cancellation is a request, the holder's acknowledgement and a
// terminal reconciliation — CANCELLED, FAILED or a bounded UNRESOLVED. An
// honest holder whose job failed while a cancel was pending acknowledges
// the request and reports FAILED; a reordering transport may deliver the
// result first. Before, the reordered job's record read "Cancel
// Requested/ACK true / false" beside FAILED — the acknowledgement it did
// send refused because the job had ended — while the same messages in
// order read "true / true". Now the acknowledgement is recorded either
// way, at its own time, and the FAILED stands; its repeat is a DUPLICATE.
func TestRogue29DAFailedResultLeavesTheCancelAckToRecordInAnyOrder(t *testing.T) {
	transports(t, func(t *testing.T, w *leaseWorld, via func(*testserver.Clients) transport) {
		w1 := via(w.w1C)
		end := func(reordered bool) (*tetherv1.Lease, []*tetherv1.EvidenceRow) {
			job := w.job()
			l, _ := w1.send(t, ack(w.offer(t, job, w.w1, time.Minute)))
			if _, err := w.plannerC.Lease.RequestCancel(context.Background(), connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: job, Reason: "budget"})); err != nil {
				t.Fatal(err)
			}
			msgs := []*tetherv1.ChannelRequest{cancelAck(l), complete(l, tetherv1.TerminalResult_TERMINAL_RESULT_FAILED)}
			if reordered {
				msgs[0], msgs[1] = msgs[1], msgs[0]
			}
			for _, m := range msgs {
				w1.send(t, m)
			}
			return w.get(t, job), w.evidence(t, job)
		}
		inOrder, inOrderRows := end(false)
		reordered, reorderedRows := end(true)
		for _, c := range []struct {
			name string
			l    *tetherv1.Lease
			rows []*tetherv1.EvidenceRow
		}{{"in order", inOrder, inOrderRows}, {"reordered", reordered, reorderedRows}} {
			if c.l.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_FAILED || !c.l.CancelRequested || !c.l.CancelAck {
				t.Errorf("%s: result %s, cancel requested %v, cancel ACK %v; want FAILED, true, true", c.name, c.l.TerminalResult, c.l.CancelRequested, c.l.CancelAck)
			}
			last := c.rows[len(c.rows)-1]
			if !last.CancelRequested || !last.CancelAck || last.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_FAILED {
				t.Errorf("%s: the last evidence row (%s %s) reads Cancel Requested/ACK %v / %v, result %s; want true / true, FAILED",
					c.name, last.Message, last.Decision.GetAuditEvent(), last.CancelRequested, last.CancelAck, last.TerminalResult)
			}
		}
		// The acknowledgement after the result is the holder's own,
		// recorded at its own time after the result's.
		last := reorderedRows[len(reorderedRows)-1]
		if got := last.Decision; got.GetOutcome() != tetherv1.Outcome_OUTCOME_ACCEPTED || got.GetAuditEvent() != tetherv1.AuditEvent_AUDIT_EVENT_CANCEL_ACKED {
			t.Errorf("the cancel ACK after the FAILED result: %s %s (%s); want ACCEPTED CANCEL_ACKED", got.GetOutcome(), got.GetAuditEvent(), got.GetReason())
		}
		if reordered.CancelAckedAt.AsTime().Before(reordered.TerminalAt.AsTime()) {
			t.Errorf("the acknowledgement after the result reads acknowledged at %s, before the result at %s", reordered.CancelAckedAt.AsTime(), reordered.TerminalAt.AsTime())
		}
		// Its repeat (the SDK retrying) is a DUPLICATE and changes nothing.
		again, d := w1.send(t, cancelAck(reordered))
		if d.GetOutcome() != tetherv1.Outcome_OUTCOME_DUPLICATE || d.GetAuditEvent() != tetherv1.AuditEvent_AUDIT_EVENT_DUPLICATE_CANCEL {
			t.Errorf("the repeated cancel ACK: %s %s (%s); want DUPLICATE DUPLICATE_CANCEL", d.GetOutcome(), d.GetAuditEvent(), d.GetReason())
		}
		if !again.CancelAckedAt.AsTime().Equal(reordered.CancelAckedAt.AsTime()) || again.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_FAILED {
			t.Errorf("the repeated cancel ACK changed the lease: acknowledged %s (was %s), result %s", again.CancelAckedAt.AsTime(), reordered.CancelAckedAt.AsTime(), again.TerminalResult)
		}
	})
}
