package agentsdk_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// Seed 000 §1 and §7, read from the document alone: delivery is not
// ownership, a partition must not make two apparent owners, and once the
// lease has expired its former holder has no execution authority. The
// probe partitions a holder that renews on schedule: nothing it sends
// reaches the coordinator, whose clock then passes the expiry it granted
// with the holder's last accepted renewal. The job went on regardless:
// the worker learnt of expiry only from an answer it could not get, so
// its job's context stayed alive (its work ran on, its fencing header
// still claimed the generation) while the coordinator could already hand
// the job to another holder. The worker now ends the job when its own
// clock passes the last accepted renewal's send time plus the lease
// duration: the coordinator counted that window from its receipt, no
// earlier, so the worker stops at or before the expiry and never extends
// authority on its own clock. Progress does not count (it renews
// nothing).
func TestSeedProbeAPartitionedHolderStopsByTheExpiryItWasGranted(t *testing.T) {
	s := newLeaseSetup(t)
	// The loop renews on every tick; the tick is also each renewal's
	// deadline, so a guard, not a time a busy machine's answers exceed
	// (loopRenewEvery).
	w := s.newWorker(t, t.TempDir(), loopRenewEvery)
	ctx := context.Background()
	job, d, err := w.Accept(ctx, s.offer(t, "job-1", 30*time.Second), agentsdk.JobOptions{})
	accepted(t, "accept", d, err)

	// The worker's loop renews at 20s; the coordinator's window then runs
	// to 50s. Then the partition: nothing reaches the coordinator.
	s.clock.Advance(20 * time.Second)
	renewedAt := s.clock.Now()
	testserver.WaitFor(t, 20*time.Second, "the worker to hear the answer to a renewal sent at 20s", func() bool {
		return s.heldFrom(t, job, renewedAt)
	})
	s.net.disconnect()
	s.clock.Advance(29 * time.Second)
	if err := job.Context().Err(); err != nil {
		t.Fatalf("the job ended at 49s, within the window its renewal at 20s was granted: %v", context.Cause(job.Context()))
	}

	s.clock.Advance(time.Second) // 50s: the expiry the coordinator granted
	select {
	case <-job.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("the partitioned holder's job still runs past the expiry of its last accepted renewal")
	}
	cause := context.Cause(job.Context())
	if !errors.Is(cause, agentsdk.ErrLeaseUnconfirmed) || !errors.Is(cause, agentsdk.ErrLeaseLost) {
		t.Fatalf("the job ended with %v, want ErrLeaseUnconfirmed (an ErrLeaseLost)", cause)
	}

	// The coordinator agrees: the generation expired, and another holder
	// can be given the job without two owners.
	s.net.cut.Store(false)
	if l := s.get(t, "job-1"); !l.ExpiresAt.AsTime().Equal(leaseEpoch.Add(50 * time.Second)) {
		t.Fatalf("the coordinator's expiry %s, want 50s: the worker stopped at it", l.ExpiresAt.AsTime())
	}
	testserver.WaitFor(t, 20*time.Second, "the coordinator's expiry", func() bool {
		return s.get(t, "job-1").State == tetherv1.LeaseState_LEASE_STATE_EXPIRED
	})
}

// heldFrom reports whether the worker holds job's answer to a renewal it
// sent at the clock's time at, accepted then. The coordinator's state is
// not enough: a renewal on the way when the test moved the clock is
// accepted at the new time too but was sent before it, and one whose
// answer came after the worker's deadline for it was accepted without the
// worker knowing; the worker bounds its authority by the send time of the
// answers it got. So: the renewal the job last heard of (its sequence),
// found in the evidence accepted at at, with no note that the worker's
// sent_at differed.
func (s *leaseSetup) heldFrom(t *testing.T, job *agentsdk.Job, at time.Time) bool {
	t.Helper()
	heard := job.Lease()
	if !heard.RenewTime.AsTime().Equal(at) {
		return false
	}
	req := &tetherv1.EvidenceRequest{JobId: heard.JobId}
	for {
		resp, err := s.planner.Lease.Evidence(context.Background(), connect.NewRequest(req))
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range resp.Msg.Rows {
			if r.Message == "renew" && r.RenewSequence == heard.RenewSequence && r.Decision.GetOutcome() == tetherv1.Outcome_OUTCOME_ACCEPTED {
				return r.DecidedAt.AsTime().Equal(at) && !strings.Contains(r.Reason, "sent_at")
			}
		}
		if resp.Msg.NextPageToken == "" {
			return false
		}
		req.PageToken = resp.Msg.NextPageToken
	}
}

// A job the worker resumes after a restart (its ACK a DUPLICATE) proves
// its window with a renewal at once, since a repeated ACK grants none;
// without an answer to it, the job ends at once.
func TestSeedProbeAResumedJobRenewsAtOnceToProveItsWindow(t *testing.T) {
	s, credential, limited := newBudgetedSetup(t)
	budget := &limited.budget
	dir := t.TempDir()
	ctx := context.Background()
	offered := s.offer(t, "job-1", 30*time.Second)
	before := s.newWorker(t, dir, time.Hour)
	_, d, err := before.Accept(ctx, offered, agentsdk.JobOptions{})
	accepted(t, "accept", d, err)
	// kill -9; the process restarts 20s later.
	s.clock.Advance(20 * time.Second)
	after := s.newWorker(t, dir, time.Hour)
	job, d, err := after.Accept(ctx, offered, agentsdk.JobOptions{})
	if err != nil || d.Outcome != tetherv1.Outcome_OUTCOME_DUPLICATE {
		t.Fatalf("the restarted worker's ACK: %v %v, want DUPLICATE", d, err)
	}
	if l := s.get(t, "job-1"); l.RenewSequence != 1 || !l.ExpiresAt.AsTime().Equal(leaseEpoch.Add(50*time.Second)) {
		t.Fatalf("after the resumed job's Accept: renew seq %d, expiry %s; want a renewal at 20s (seq 1, expiry 50s)", l.RenewSequence, l.ExpiresAt.AsTime())
	}
	if err := job.Context().Err(); err != nil {
		t.Fatalf("the resumed job ended: %v", context.Cause(job.Context()))
	}

	// A resumed job whose renewal gets no answer has no window it can
	// prove: its context ends at once.
	budget.Store(1) // the ACK goes through, the renewal does not
	third := agentsdk.Dial(s.srv.URL, credential, agentsdk.WithHTTPClient(&http.Client{Transport: limited}))
	w3, err := agentsdk.NewLeaseWorker(agentsdk.LeaseWorkerConfig{Conn: third, SpoolDir: t.TempDir(), Clock: s.clock, RenewEvery: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w3.Close() })
	job, d, err = w3.Accept(ctx, offered, agentsdk.JobOptions{})
	if err != nil || d.Outcome != tetherv1.Outcome_OUTCOME_DUPLICATE {
		t.Fatalf("the third life's ACK: %v %v, want DUPLICATE", d, err)
	}
	if cause := context.Cause(job.Context()); !errors.Is(cause, agentsdk.ErrLeaseUnconfirmed) {
		t.Fatalf("a resumed job whose renewal got no answer goes on (cause %v); want ErrLeaseUnconfirmed", cause)
	}
}

// budgeted is an HTTP transport that lets budget more requests through
// (all when negative) and fails the rest as unreachable.
type budgeted struct {
	next   http.RoundTripper
	budget atomic.Int64
}

func (b *budgeted) RoundTrip(r *http.Request) (*http.Response, error) {
	if b.budget.Load() >= 0 && b.budget.Add(-1) < 0 {
		return nil, errors.New("network unreachable (test)")
	}
	return b.next.RoundTrip(r)
}

// newBudgetedSetup is newLeaseSetup whose worker dials through a
// budgeted transport (unlimited at first); it also returns the worker's
// credential, for another process of the same agent.
func newBudgetedSetup(t *testing.T) (*leaseSetup, string, *budgeted) {
	t.Helper()
	var limited *budgeted
	s, credential := newLeaseSetupVia(t, func(rt http.RoundTripper) http.RoundTripper {
		limited = &budgeted{next: rt}
		limited.budget.Store(-1)
		return limited
	})
	return s, credential, limited
}

// On the wall clock (the default) nothing but a timer is there to end the
// job at its bound when no renewal is due before it: a worker renewing
// hourly on a lease of 2 s, cut off at once, has its job ended by the
// timer with ErrLeaseUnconfirmed. (The lease is long enough that a loaded
// machine's accept is never past it; the test waits 20 s for the end.)
func TestSeedProbeOnTheWallClockATimerEndsTheJobAtItsBound(t *testing.T) {
	s := newLeaseSetup(t)
	w, err := agentsdk.NewLeaseWorker(agentsdk.LeaseWorkerConfig{Conn: s.worker, SpoolDir: t.TempDir(), RenewEvery: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	job, d, err := w.Accept(context.Background(), s.offer(t, "job-1", 2*time.Second), agentsdk.JobOptions{})
	accepted(t, "accept", d, err)
	s.net.disconnect()
	select {
	case <-job.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("the job still runs past its bound on the wall clock")
	}
	if cause := context.Cause(job.Context()); !errors.Is(cause, agentsdk.ErrLeaseUnconfirmed) {
		t.Fatalf("the job ended with %v, want ErrLeaseUnconfirmed", cause)
	}
}
