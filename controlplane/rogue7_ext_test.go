package controlplane_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The seventh rogue pass: what the sixth left open. Each test plays one
// rogue through the real server (Badger on disk, real HTTP, real JWTs, the
// manual clock).

// A rogue holder cannot write its job's terminal detail in an operator's
// or the control plane's words: its Complete detail is signed with its
// principal, on the unary RPC and on the Channel stream alike, as the
// coordinators' reasons are.
func TestARogueHolderCannotPassItsCompletionForTheOperators(t *testing.T) {
	w := newLeaseWorld(t)
	ctx := context.Background()
	forged := "operator:admin: terminated: the operator aborted the subtree"
	want := "agent:" + w.w1 + ": " + forged

	// Unary.
	job := w.job()
	l := w.offer(t, job, w.w1, time.Minute)
	l, d := unary{w.w1C}.send(t, ack(l))
	wantDecision(t, "ack", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_ACKED)
	done, err := w.w1C.Lease.Complete(ctx, connect.NewRequest(&tetherv1.CompleteRequest{JobId: job, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration, Result: tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS, Detail: forged}))
	if err != nil {
		t.Fatal(err)
	}
	wantDecision(t, "the rogue's completion", done.Msg.Decision, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_TERMINAL_ACCEPTED)
	if got := w.get(t, job).TerminalDetail; got != want {
		t.Fatalf("the job's terminal detail = %q, want %q", got, want)
	}
	if got := done.Msg.Lease.GetTerminalDetail(); got != want {
		t.Fatalf("the completion's answer shows the terminal detail %q, want %q", got, want)
	}

	// The Channel stream.
	job2 := w.job()
	l2 := w.offer(t, job2, w.w1, time.Minute)
	l2, d = unary{w.w1C}.send(t, ack(l2))
	wantDecision(t, "ack", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_ACKED)
	stream := w.w1C.Lease.Channel(ctx)
	defer func() { _ = stream.CloseRequest(); _ = stream.CloseResponse() }()
	m := complete(l2, tetherv1.TerminalResult_TERMINAL_RESULT_FAILED)
	m.CorrelationId = 1
	m.GetComplete().Detail = forged
	if err := stream.Send(m); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Receive()
	if err != nil {
		t.Fatal(err)
	}
	if resp.Error != "" {
		t.Fatalf("channel: %s", resp.Error)
	}
	wantDecision(t, "the rogue's completion on the stream", resp.Decision, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_TERMINAL_ACCEPTED)
	if got := w.get(t, job2).TerminalDetail; got != want {
		t.Fatalf("the job's terminal detail (stream) = %q, want %q", got, want)
	}
}
