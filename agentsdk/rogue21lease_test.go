package agentsdk_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tetherhq/tether/agentsdk"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// A framework author closes its LeaseWorker at shutdown: Close closed the
// spool and nothing else, so every job's renew loop went on renewing (for
// as long as the process lived), its context never ended, and its
// Complete still reached the coordinator after Close. Close now ends every
// job (ErrWorkerClosed, wrapping ErrJobEnded), returns once their renew
// loops ended, and the worker sends nothing after it.
func TestRogue21LeaseWorkerCloseEndsTheJobsItRuns(t *testing.T) {
	s := newLeaseSetup(t)
	w, err := agentsdk.NewLeaseWorker(agentsdk.LeaseWorkerConfig{Conn: s.worker, SpoolDir: t.TempDir(), Clock: s.clock, RenewEvery: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	job, d, err := w.Accept(ctx, s.offer(t, "rogue21-close", time.Minute), agentsdk.JobOptions{})
	accepted(t, "accept", d, err)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-job.Done():
	default:
		t.Fatal("Close returned while the job's renew loop still ran: it renews on after Close")
	}
	if cause := context.Cause(job.Context()); !errors.Is(cause, agentsdk.ErrWorkerClosed) || !errors.Is(cause, agentsdk.ErrJobEnded) {
		t.Fatalf("the job's context after Close: %v, want ErrWorkerClosed (an ErrJobEnded)", cause)
	}
	renewed := s.get(t, "rogue21-close").RenewSequence

	if _, err := job.Progress(ctx, "after close"); !errors.Is(err, agentsdk.ErrWorkerClosed) {
		t.Fatalf("Progress after Close: %v, want ErrWorkerClosed", err)
	}
	if _, err := job.Complete(ctx, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS, "after close"); !errors.Is(err, agentsdk.ErrWorkerClosed) {
		t.Fatalf("Complete after Close: %v, want ErrWorkerClosed", err)
	}
	if _, err := job.Renew(ctx); !errors.Is(err, agentsdk.ErrWorkerClosed) {
		t.Fatalf("Renew after Close: %v, want ErrWorkerClosed", err)
	}
	if l := s.get(t, "rogue21-close"); l.State != tetherv1.LeaseState_LEASE_STATE_ACTIVE || l.RenewSequence != renewed || l.ProgressSequence != 0 {
		t.Fatalf("after Close the worker still reached the coordinator: %v %s renew %d (was %d) progress %d", l.State, l.TerminalResult, l.RenewSequence, renewed, l.ProgressSequence)
	}
	if _, _, err := w.Accept(ctx, s.offer(t, "rogue21-close-2", time.Minute), agentsdk.JobOptions{}); !errors.Is(err, agentsdk.ErrWorkerClosed) {
		t.Fatalf("Accept after Close: %v, want ErrWorkerClosed", err)
	}
	if l := s.get(t, "rogue21-close-2"); l.State != tetherv1.LeaseState_LEASE_STATE_OFFERED {
		t.Fatalf("a closed worker acknowledged an offer: %v", l.State)
	}
	if err := w.Close(); err != nil {
		t.Fatalf("a second Close: %v", err)
	}
}
