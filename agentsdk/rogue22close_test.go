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

// The operator cancels a job and the agent shuts down: it closes its
// LeaseWorker from the job's OnCancel. OnCancel runs on the job's renew
// loop, and Close waited for that loop to end, which it could not until
// OnCancel returned: every such Close stalled for the whole closeWait
// (10 s), and on the worker's manual clock here, for ever. Close now
// waits for the worker's other jobs and not for the one whose OnCancel
// runs (it may be what called Close).
func TestRogue22LeaseWorkerClosedFromItsCancelCallback(t *testing.T) {
	s := newLeaseSetup(t)
	w, err := agentsdk.NewLeaseWorker(agentsdk.LeaseWorkerConfig{Conn: s.worker, SpoolDir: t.TempDir(), Clock: s.clock, RenewEvery: loopRenewEvery})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	ctx := context.Background()
	other, d, err := w.Accept(ctx, s.offer(t, "rogue22-other", time.Minute), agentsdk.JobOptions{})
	accepted(t, "accept the other job", d, err)
	type closed struct {
		err       error
		otherDone bool
	}
	result := make(chan closed, 1)
	job, d, err := w.Accept(ctx, s.offer(t, "rogue22-cancelled", time.Minute), agentsdk.JobOptions{OnCancel: func(*tetherv1.Lease) {
		err := w.Close()
		var c closed
		c.err = err
		select {
		case <-other.Done():
			c.otherDone = true
		default:
		}
		result <- c
	}})
	accepted(t, "accept", d, err)
	if _, err := s.planner.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: "rogue22-cancelled", Reason: "shut down"})); err != nil {
		t.Fatal(err)
	}
	// The worker's clock never moves: a Close that waits for the job whose
	// OnCancel called it returns only at its closeWait on that clock, never.
	// The bound below guards against that hang; it is not a timing.
	var c closed
	select {
	case c = <-result:
	case <-time.After(2 * time.Minute):
		t.Fatal("Close called from OnCancel had not returned after two minutes: it waits for the renew loop that runs the OnCancel calling it")
	}
	if c.err != nil {
		t.Fatalf("Close from OnCancel: %v", c.err)
	}
	if !c.otherDone {
		t.Fatal("Close from OnCancel returned before the worker's other job's renew loop ended")
	}
	select {
	case <-job.Done():
	case <-time.After(2 * time.Minute):
		t.Fatal("the cancelled job's renew loop never ended after its OnCancel returned")
	}
	if cause := context.Cause(job.Context()); !errors.Is(cause, agentsdk.ErrLeaseCancelled) {
		t.Fatalf("the cancelled job's cause: %v, want ErrLeaseCancelled", cause)
	}
	if cause := context.Cause(other.Context()); !errors.Is(cause, agentsdk.ErrWorkerClosed) {
		t.Fatalf("the other job's cause: %v, want ErrWorkerClosed", cause)
	}
	if _, err := other.Progress(ctx, "after close"); !errors.Is(err, agentsdk.ErrWorkerClosed) {
		t.Fatalf("Progress after a Close from OnCancel: %v, want ErrWorkerClosed", err)
	}
}
