package controlplane_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue32CTheCoordinatorsFailedRefusesTheHoldersLateAck: over the
// API, unary and on a Channel, a holder that ignored a cancel request has
// its acknowledgement refused once its lineage resolved the job FAILED
// (before, accepted while its expiry was ahead), the lease and the
// evidence read cancel_ack false, and the lease says the result is the
// coordinator's (resolved_by_coordinator), where the holder's own FAILED
// says it is not.
func TestRogue32CTheCoordinatorsFailedRefusesTheHoldersLateAck(t *testing.T) {
	transports(t, func(t *testing.T, w *leaseWorld, via func(*testserver.Clients) transport) {
		w1 := via(w.w1C)
		job := w.job()
		l, _ := w1.send(t, ack(w.offer(t, job, w.w1, time.Minute)))
		ctx := context.Background()
		if _, err := w.plannerC.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: job, Reason: "budget"})); err != nil {
			t.Fatal(err)
		}
		resolved, err := w.plannerC.Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{JobId: job, Result: tetherv1.TerminalResult_TERMINAL_RESULT_FAILED, Reason: "ignored the cancel"}))
		if err != nil {
			t.Fatal(err)
		}
		if !resolved.Msg.Lease.ResolvedByCoordinator {
			t.Errorf("the coordinator's FAILED reads resolved_by_coordinator false")
		}
		w.clock.Advance(time.Second)
		after, d := w1.send(t, cancelAck(l))
		wantDecision(t, "the acknowledgement after the coordinator's FAILED", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_INVALID_TRANSITION)
		if after.CancelAck || w.get(t, job).CancelAck {
			t.Errorf("the refused acknowledgement left cancel_ack true")
		}
		rows := w.evidence(t, job)
		if last := rows[len(rows)-1]; last.Message != "cancel_ack" || last.CancelAck {
			t.Errorf("the last evidence row is %s with cancel_ack %v; want the refused cancel_ack, false", last.Message, last.CancelAck)
		}

		// The holder's own FAILED is not the coordinator's.
		other := w.job()
		l2, _ := w1.send(t, ack(w.offer(t, other, w.w1, time.Minute)))
		own, _ := w1.send(t, complete(l2, tetherv1.TerminalResult_TERMINAL_RESULT_FAILED))
		if own.ResolvedByCoordinator || own.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_FAILED {
			t.Errorf("the holder's own FAILED reads %s, resolved_by_coordinator %v", own.TerminalResult, own.ResolvedByCoordinator)
		}
	})
}
