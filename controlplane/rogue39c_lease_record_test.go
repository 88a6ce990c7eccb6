package controlplane

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	"github.com/tetherhq/tether/supervisor"
	"github.com/tetherhq/tether/supervisor/lease"
	"github.com/tetherhq/tether/supervisor/lease/coordinator"
)

// bytesReadStore counts the bytes its reads hand out (values a Scan
// visits, values a Get returns): what a read decodes and keeps.
type bytesReadStore struct {
	store.Store
	read atomic.Int64
}

type bytesReadTxn struct {
	store.ReadTxn
	s *bytesReadStore
}

func (t bytesReadTxn) Get(k []byte) ([]byte, error) {
	v, err := t.ReadTxn.Get(k)
	t.s.read.Add(int64(len(v)))
	return v, err
}

func (t bytesReadTxn) Scan(prefix, start []byte, fn func(k, v []byte) error) error {
	return t.ReadTxn.Scan(prefix, start, func(k, v []byte) error {
		t.s.read.Add(int64(len(v)))
		return fn(k, v)
	})
}

func (s *bytesReadStore) View(ctx context.Context, fn func(store.ReadTxn) error) error {
	return s.Store.View(ctx, func(tx store.ReadTxn) error { return fn(bytesReadTxn{tx, s}) })
}

// TestRogue39CARoguesLongJobDoesNotMakeItsRecordReadItsWholeHistory: a
// rogue subtree's agent asks for the cancel of a job its descendant holds
// and the holder acknowledges it before the subtree's stop — the case the
// record flags as the subtree's own word, for which it reads who asked
// (RecordLease.CancelRequestedBy). That read took every row of the job's
// evidence into memory (coordinator.Evidence) to find the one request, and
// the holder makes the history as long as it likes: every message it sends
// under its live generation is a row kept for ever (a repeated renewal, a
// progress of up to 4 KiB), and the record reads it for each such job of
// the stopped subtree. Seen failing before the fix: the finalisation read
// about as many bytes as a whole read of the job's evidence (and more: it
// reads the rest of the record's evidence too). The request is now found
// as the job's end is (the first row carrying the cancel request, by the
// anchor rows), reading a few of the job's rows, whatever its length.
func TestRogue39CARoguesLongJobDoesNotMakeItsRecordReadItsWholeHistory(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the rogue's long evidence; make test and CI run them.")
	}
	c, counted, clk, t0 := countedCoordinator(t)

	apply := func(m lease.Message, want lease.Outcome) lease.Lease {
		t.Helper()
		r, err := c.Apply(context.Background(), m)
		if err != nil {
			t.Fatalf("%T: %v", m, err)
		}
		if r.Decision.Outcome != want {
			t.Fatalf("%T: %s, want %s", m, r.Decision, want)
		}
		return r.Lease
	}
	const job, holder, rogue = "job-39c", "n_holder39c", "agent:n_rogue39c"
	apply(lease.Offer{JobID: job, LeaseID: "L1", HolderIdentity: holder, LeaseDuration: 10 * time.Minute, Owner: "n_rogue39c"}, lease.OutcomeAccepted)
	cl := lease.Claim{JobID: job, LeaseID: "L1", Generation: 1, HolderIdentity: holder}
	apply(lease.Ack{Claim: cl}, lease.OutcomeAccepted)
	apply(lease.Renew{Claim: cl, RenewSequence: 1}, lease.OutcomeAccepted)
	// The holder's history: repeated renewals, each a row (sent at once,
	// so that they share a few commits).
	const repeats = 6000
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range repeats {
		wg.Add(1)
		c.Submit(lease.Renew{Claim: cl, RenewSequence: 1}, nil, func(r coordinator.Result, err error) {
			if err != nil || r.Decision.Outcome != lease.OutcomeDuplicate {
				failed.Add(1)
			}
			wg.Done()
		})
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of the holder's repeated renewals were not answered DUPLICATE", n)
	}
	clk.Advance(time.Second)
	apply(lease.RequestCancel{JobID: job, Reason: rogue + ": stop it"}, lease.OutcomeAccepted)
	apply(lease.CancelAck{Claim: cl}, lease.OutcomeAccepted)
	// Other commits since, as a long history has: the job's rows have left
	// the shared evidence log for keys of their own.
	apply(lease.Offer{JobID: "other", LeaseID: "L-other", HolderIdentity: "n_other", LeaseDuration: 10 * time.Minute}, lease.OutcomeAccepted)
	other := lease.Claim{JobID: "other", LeaseID: "L-other", Generation: 1, HolderIdentity: "n_other"}
	apply(lease.Ack{Claim: other}, lease.OutcomeAccepted)
	for seq := range uint64(40) {
		apply(lease.Renew{Claim: other, RenewSequence: seq + 1}, lease.OutcomeAccepted)
	}

	counted.read.Store(0)
	rows, err := c.Evidence(context.Background(), job)
	if err != nil {
		t.Fatal(err)
	}
	whole := counted.read.Load()
	if len(rows) < repeats {
		t.Fatalf("%d rows, want more than %d", len(rows), repeats)
	}

	// The termination finalises the job (its stop asked for after the
	// acknowledgement: the record reads who asked for the cancel). What
	// that read costs is measured against the same finalisation that does
	// not ask (a stop asked for before the acknowledgement), both of the
	// job as the first one left it.
	finalize := func(stop time.Time) (supervisor.RecordLease, int64) {
		t.Helper()
		counted.read.Store(0)
		got, _, err := leaseCanceller{c}.FinalizeHeldBy(context.Background(), []string{holder}, "stopping the subtree", supervisor.LeasePage{StopRequestedAt: stop})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0].TerminalResult != supervisor.LeaseResultCancelled {
			t.Fatalf("record leases %+v; want the job CANCELLED", got)
		}
		return got[0], counted.read.Load()
	}
	clk.Advance(time.Second)
	finalize(t0)
	_, without := finalize(t0)
	got, with := finalize(clk.Now())
	t.Logf("a whole read of the job's %d rows: %d bytes; the record's reads of the finalised job: %d bytes, %d with who asked for the cancel", len(rows), whole, without, with)
	if got.CancelRequestedBy != rogue {
		t.Fatalf("the cancel was asked for by %q, want %s", got.CancelRequestedBy, rogue)
	}
	if (with-without)*4 > whole {
		t.Errorf("reading who asked for the cancel took %d bytes, more than a quarter of a whole read of the job's evidence (%d bytes): the record reads the rogue's whole history", with-without, whole)
	}
}

// TestRogue39CARoguesManyAcknowledgedJobsDoNotReadTheEvidenceLogEach: the
// same record of a stopped subtree whose holder acknowledged, before the
// stop, the cancels its own rogue ancestor asked for on many jobs. Each
// job's requester was read with a read of its own, and a read of one job
// reads the whole shared evidence log (the newest commits' rows of every
// job, up to a quarter of a megabyte): the record read the log once per
// such job — what a job's end had cost before the twenty-third pass. Seen
// failing before the fix (40 jobs: about forty reads of the log). The
// requests are now found together, the log read once for many jobs, as
// the jobs' ends are.
func TestRogue39CARoguesManyAcknowledgedJobsDoNotReadTheEvidenceLogEach(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the rogue's many jobs; make test and CI run them.")
	}
	c, counted, clk, t0 := countedCoordinator(t)
	apply := func(m lease.Message, want lease.Outcome) {
		t.Helper()
		r, err := c.Apply(context.Background(), m)
		if err != nil {
			t.Fatalf("%T: %v", m, err)
		}
		if r.Decision.Outcome != want {
			t.Fatalf("%T: %s, want %s", m, r.Decision, want)
		}
	}
	const holder, rogue, jobs = "n_holder39c", "agent:n_rogue39c", 40
	for i := range jobs {
		job := fmt.Sprintf("job-39c-%02d", i)
		cl := lease.Claim{JobID: job, LeaseID: "L-" + job, Generation: 1, HolderIdentity: holder}
		apply(lease.Offer{JobID: job, LeaseID: cl.LeaseID, HolderIdentity: holder, LeaseDuration: 10 * time.Minute, Owner: "n_rogue39c"}, lease.OutcomeAccepted)
		apply(lease.Ack{Claim: cl}, lease.OutcomeAccepted)
		apply(lease.RequestCancel{JobID: job, Reason: rogue + ": stop it"}, lease.OutcomeAccepted)
		apply(lease.CancelAck{Claim: cl}, lease.OutcomeAccepted)
	}
	// The newest commits fill the shared evidence log: another job's
	// progress of 4 KiB values, a few commits of several rows each.
	apply(lease.Offer{JobID: "other", LeaseID: "L-other", HolderIdentity: "n_other", LeaseDuration: 10 * time.Minute}, lease.OutcomeAccepted)
	other := lease.Claim{JobID: "other", LeaseID: "L-other", Generation: 1, HolderIdentity: "n_other"}
	apply(lease.Ack{Claim: other}, lease.OutcomeAccepted)
	value := strings.Repeat("v", 4000)
	seq := uint64(0)
	for range 16 {
		var wg sync.WaitGroup
		for range 8 {
			seq++
			wg.Add(1)
			c.Submit(lease.Progress{Claim: other, ProgressSequence: seq, ProgressValue: fmt.Sprint(seq, value)}, nil, func(coordinator.Result, error) { wg.Done() })
		}
		wg.Wait()
	}
	counted.read.Store(0)
	if _, err := c.Evidence(context.Background(), "job-39c-00"); err != nil {
		t.Fatal(err)
	}
	one := counted.read.Load() // the log and one short job's rows

	finalize := func(stop time.Time) ([]supervisor.RecordLease, int64) {
		t.Helper()
		counted.read.Store(0)
		got, _, err := leaseCanceller{c}.FinalizeHeldBy(context.Background(), []string{holder}, "stopping the subtree", supervisor.LeasePage{StopRequestedAt: stop})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != jobs {
			t.Fatalf("%d record leases, want %d", len(got), jobs)
		}
		return got, counted.read.Load()
	}
	clk.Advance(time.Second)
	finalize(t0)
	_, without := finalize(t0)
	got, with := finalize(clk.Now())
	t.Logf("one job's evidence with the log: %d bytes; the record's reads of %d finalised jobs: %d bytes, %d with who asked for their cancels", one, jobs, without, with)
	for _, l := range got {
		if l.CancelRequestedBy != rogue || l.TerminalResult != supervisor.LeaseResultCancelled {
			t.Fatalf("record lease %+v; want it CANCELLED, its cancel asked by %s", l, rogue)
		}
	}
	if with-without > 4*one {
		t.Errorf("reading who asked for the %d cancels took %d bytes, more than four reads of one job's evidence with the log (%d bytes each): the record reads the log once per job", jobs, with-without, one)
	}
}

// countedCoordinator runs a lease coordinator on a real Badger store whose
// reads are counted (bytesReadStore), on a manual clock starting at t0.
func countedCoordinator(t *testing.T) (c *coordinator.Coordinator, counted *bytesReadStore, clk *clock.Manual, t0 time.Time) {
	t.Helper()
	st, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	counted = &bytesReadStore{Store: st}
	t0 = time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	clk = clock.NewManual(t0)
	c, err = coordinator.New(context.Background(), coordinator.Config{
		Store: counted, Clock: clk, Policy: lease.DefaultPolicy(), Log: slog.New(slog.NewTextHandler(io.Discard, nil)), MaxWait: time.Millisecond, Shards: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-ran })
	return c, counted, clk, t0
}
