package agentsdk_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tetherhq/tether/agentsdk"
)

// TestFlakeNothingIsSentAfterALeaseWorkersCloseReturns: Close's promise is
// that the worker sends nothing after it (an agent closes its worker, then
// claims its exit: a lease message after the claim is kept as evidence
// against it). A send checked that the worker was open and then sent; a
// Close between the two returned, and the send went out after it — a
// Progress or Complete of the agent's own, or a renewal. Close now waits
// for the sends under way (within closeWait) before it returns. The next
// send here is held, once it has found the worker open, while Close runs.
func TestFlakeNothingIsSentAfterALeaseWorkersCloseReturns(t *testing.T) {
	s := newLeaseSetup(t)
	w, err := agentsdk.NewLeaseWorker(agentsdk.LeaseWorkerConfig{Conn: s.worker, SpoolDir: t.TempDir(), Clock: s.clock, RenewEvery: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	ctx := context.Background()
	job, d, err := w.Accept(ctx, s.offer(t, "flake28-close", time.Minute), agentsdk.JobOptions{})
	accepted(t, "accept", d, err)
	closedFirst, undo := agentsdk.CloseDuringTheNextSend(w)
	t.Cleanup(undo)
	_, err = job.Progress(ctx, "as the worker closes")
	if err == nil && closedFirst() {
		t.Fatal("the progress was sent after the worker's Close had returned")
	}
	if err != nil && !errors.Is(err, agentsdk.ErrWorkerClosed) {
		t.Fatalf("Progress as the worker closes: %v, want it sent before Close returns, or ErrWorkerClosed", err)
	}
	if _, err := job.Progress(ctx, "after close"); !errors.Is(err, agentsdk.ErrWorkerClosed) {
		t.Fatalf("Progress after Close: %v, want ErrWorkerClosed", err)
	}
}
