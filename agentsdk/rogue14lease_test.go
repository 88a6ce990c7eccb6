package agentsdk_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/agentsdk"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// Seed 000 §6, §8, and a restart between a message and its answer: a
// worker process killed (kill -9) after it renewed and reported progress
// comes back — a new LeaseWorker on the same spool — and accepts the job
// it still holds. The coordinator answers its ACK DUPLICATE (the
// generation is ACTIVE and its own). The job used to start its renew and
// progress sequences at 0 again: every renewal up to the sequence its
// earlier life reached was refused STALE_RENEW (expiry stayed, and the
// lease lapsed although its holder renewed in time), and every progress
// report up to the earlier sequence was recorded as late progress — the
// evidence matrix said the holder's fresh reports were stale, and the
// job's progress did not move. A restarted job now goes on from the
// sequences the coordinator accepted.
func TestRogue14ARestartedWorkerGoesOnFromTheAcceptedSequences(t *testing.T) {
	s := newLeaseSetup(t)
	dir := t.TempDir()
	ctx := context.Background()
	offered := s.offer(t, "job-1", time.Minute)
	before := s.newWorker(t, dir, time.Hour) // renewals driven by the test
	job, d, err := before.Accept(ctx, offered, agentsdk.JobOptions{})
	accepted(t, "accept", d, err)
	for i := range 3 {
		s.clock.Advance(10 * time.Second)
		d, err = job.Renew(ctx)
		accepted(t, "renew", d, err)
		d, err = job.Progress(ctx, "step "+string(rune('1'+i)))
		accepted(t, "progress", d, err)
	}
	// kill -9: the process is gone (its job's loop never runs again; it
	// renews only when the test asks).

	after := s.newWorker(t, dir, time.Hour)
	job, d, err = after.Accept(ctx, offered, agentsdk.JobOptions{})
	if err != nil || d.Outcome != tetherv1.Outcome_OUTCOME_DUPLICATE {
		t.Fatalf("the restarted worker's ACK: %v %v, want DUPLICATE", d, err)
	}
	// (Accept renews at once, seq 4: a repeated ACK proves no window.)
	s.clock.Advance(10 * time.Second)
	d, err = job.Renew(ctx)
	accepted(t, "the restarted worker's renew", d, err)
	if l := s.get(t, "job-1"); !l.ExpiresAt.AsTime().Equal(leaseEpoch.Add(100*time.Second)) || l.RenewSequence != 5 {
		t.Fatalf("after the restarted worker's renew the lease expires at %s (renew seq %d), want %s (seq 5)",
			l.ExpiresAt.AsTime(), l.RenewSequence, leaseEpoch.Add(100*time.Second))
	}
	d, err = job.Progress(ctx, "step 4")
	accepted(t, "the restarted worker's progress", d, err)
	if l := s.get(t, "job-1"); l.ProgressValue != "step 4" || l.ProgressSequence != 4 || l.LateProgress {
		t.Fatalf("after the restarted worker's progress: seq %d %q late %v, want seq 4 \"step 4\", nothing late",
			l.ProgressSequence, l.ProgressValue, l.LateProgress)
	}
}

// Seed 000 §9, against the same restart: while the worker process was
// down, the coordinator requested cancellation. The restarted worker's ACK
// is answered DUPLICATE with the lease, cancel_requested set. The job used
// to start work regardless, and learnt of the cancel only from its first
// renewal's answer, a third of the lease later (or never, had it finished
// first): work past a cancel the coordinator had already told it of. The
// job now acts on the ACK's answer as on any other: its context ends
// (ErrLeaseCancelled), OnCancel runs and the cancel is acknowledged.
func TestRogue14ARestartedWorkerLearnsOfACancelFromItsAck(t *testing.T) {
	s := newLeaseSetup(t)
	dir := t.TempDir()
	ctx := context.Background()
	offered := s.offer(t, "job-1", time.Minute)
	before := s.newWorker(t, dir, time.Hour)
	job, d, err := before.Accept(ctx, offered, agentsdk.JobOptions{})
	accepted(t, "accept", d, err)
	// kill -9, and the coordinator cancels while the worker is down.
	if _, err := s.planner.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: "job-1", Reason: "stop"})); err != nil {
		t.Fatal(err)
	}

	after := s.newWorker(t, dir, time.Hour)
	cancelled := 0
	job, d, err = after.Accept(ctx, offered, agentsdk.JobOptions{OnCancel: func(*tetherv1.Lease) { cancelled++ }})
	if err != nil || d.Outcome != tetherv1.Outcome_OUTCOME_DUPLICATE {
		t.Fatalf("the restarted worker's ACK: %v %v, want DUPLICATE", d, err)
	}
	if cause := context.Cause(job.Context()); !errors.Is(cause, agentsdk.ErrLeaseCancelled) || cancelled != 1 {
		t.Fatalf("the restarted job's context: cause %v, OnCancel ran %d times; want cancelled once, from the ACK's answer", cause, cancelled)
	}
	if l := s.get(t, "job-1"); !l.CancelAck {
		t.Fatal("the restarted worker did not acknowledge the cancel request the ACK's answer carried")
	}
}
