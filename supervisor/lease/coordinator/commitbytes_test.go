package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	"github.com/tetherhq/tether/supervisor/lease"
	"github.com/tetherhq/tether/supervisor/lease/coordinator"
)

// manyJobs offers n jobs with ids of the longest length to holder and has
// the holder acknowledge each (so each record lags its rows by one), a few
// at a time: each commit carries a few jobs.
func manyJobs(t *testing.T, h *harness, holder string, n int) []string {
	t.Helper()
	jobs := make([]string, n)
	for i := range jobs {
		id := fmt.Sprintf("many-%06d-", i)
		jobs[i] = id + strings.Repeat("x", lease.MaxIDBytes-len(id))
	}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 16 {
		wg.Go(func() {
			for i := w; i < n; i += 16 {
				job := jobs[i]
				leaseID := "L-" + fmt.Sprint(i)
				r, err := h.c.Apply(context.Background(), lease.Offer{JobID: job, LeaseID: leaseID, HolderIdentity: holder, LeaseDuration: 10 * time.Minute})
				if err == nil && r.Decision.Outcome != lease.OutcomeAccepted {
					err = fmt.Errorf("offer refused: %s", r.Decision)
				}
				if err == nil {
					r, err = h.c.Apply(context.Background(), lease.Ack{Claim: claim(job, leaseID, 1, holder)})
				}
				if err == nil && r.Decision.Outcome != lease.OutcomeAccepted {
					err = fmt.Errorf("ack refused: %s", r.Decision)
				}
				if err != nil {
					errs <- fmt.Errorf("job %d: %w", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return jobs
}

// A node's leases are not bounded by the coordinator, and a shard judged
// everything that waited into one batch, committed in one transaction: a
// termination's cancel of a node's 4,000 jobs (sent together, so that the
// shards gather them) was one batch of some 1.8 MB, past what Badger takes
// with its smallest memtable (8 MiB: 15%, some 1.2 MB), and the
// termination failed "transaction too large" every time it tried; a clean
// stop wrote every lagging record in one transaction too, and lost them
// all. A shard now seals its batch at Config.MaxCommitBytes and judges on
// into the next: the cancels and the finalisation are durable, the clean
// stop leaves no record lagging its rows, and a restart loads every lease
// as it was. Seen failing before the change: CancelHeldBy failed with the
// store's "transaction too large", and after the clean stop 4,000 records
// lagged.
func TestManyJobsJudgedTogetherFitTheStoresTransactions(t *testing.T) {
	st, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{Logger: quiet(), MemTableSize: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	clk := clock.NewManual(t0)
	// One shard, so that the cancels (and the checkpoints) are all its own.
	h := startShards(t, st, clk, 1)
	const n = 4000
	jobs := manyJobs(t, h, "holder", n)
	ctx := context.Background()
	if err := h.c.CancelHeldBy(ctx, []string{"holder"}, "the holder is being stopped: "+strings.Repeat("r", 2000)); err != nil {
		t.Fatalf("cancel the holder's %d jobs: %v", n, err)
	}
	final, err := h.c.FinalizeHeldBy(ctx, []string{"holder"}, "terminated")
	if err != nil {
		t.Fatalf("finalize the holder's %d jobs: %v", n, err)
	}
	if len(final) != n {
		t.Fatalf("finalized %d leases, want %d", len(final), n)
	}
	for _, l := range final {
		if l.State != lease.StateTerminal || !l.CancelRequested {
			t.Fatalf("job %.20s… is %s (cancel requested %v) after the finalisation, want terminal after a cancel request", l.JobID, l.State, l.CancelRequested)
		}
	}
	h.stop()
	lagging, err := coordinator.LaggingRecords(st)
	if err != nil {
		t.Fatal(err)
	}
	if lagging != 0 {
		t.Fatalf("after the clean stop %d of %d records lag their rows, want every one checkpointed", lagging, n)
	}
	h = startShards(t, st, clk, 1)
	for _, want := range final {
		got := h.get(want.JobID)
		if got.State != want.State || got.TerminalResult != want.TerminalResult || got.LeaseID != want.LeaseID || got.CancelRequested != want.CancelRequested {
			t.Fatalf("job %.20s… is %s %s after the restart, was %s %s", want.JobID, got.State, got.TerminalResult, want.State, want.TerminalResult)
		}
	}
	if len(jobs) != n {
		t.Fatal("the jobs offered are not the jobs finalized")
	}
}

// startShards is start with shards shards.
func startShards(t *testing.T, st store.Store, clk *clock.Manual, shards int) *harness {
	t.Helper()
	c, err := coordinator.New(context.Background(), coordinator.Config{
		Store: st, Clock: clk, Policy: lease.DefaultPolicy(), Log: quiet(), MaxWait: time.Millisecond, Shards: shards,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{t: t, c: c, clock: clk, store: st, cancel: cancel, done: make(chan error, 1)}
	ended := make(chan struct{})
	go func() { defer close(ended); h.done <- c.Run(ctx) }()
	t.Cleanup(h.stop)
	waitServing(t, c, ended)
	return h
}

// cutStore lets allow more Updates through once armed, and fails every
// later one: a power cut in the middle of a clean stop.
type cutStore struct {
	store.Store
	mu    sync.Mutex
	armed bool
	allow int
}

func (c *cutStore) Update(ctx context.Context, fn func(tx store.Txn) error) error {
	c.mu.Lock()
	cut := c.armed && c.allow <= 0
	if c.armed {
		c.allow--
	}
	c.mu.Unlock()
	if cut {
		return errors.New("power cut")
	}
	return c.Store.Update(ctx, fn)
}

// A clean stop's checkpoints now take several transactions: a stop cut
// between two of them (kill -9, a power cut) leaves some records
// checkpointed and others lagging their rows, and the next start loads
// every job as it stood, each from its record and the rows after it.
func TestACleanStopCutBetweenItsCheckpointsLosesNothing(t *testing.T) {
	dir := t.TempDir()
	inner, err := badgerstore.OpenBadger(dir, badgerstore.BadgerOptions{Logger: quiet(), MemTableSize: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	st := &cutStore{Store: inner}
	clk := clock.NewManual(t0)
	h := startShards(t, st, clk, 1)
	const n = 1500
	jobs := manyJobs(t, h, "holder", n)
	before := map[string]lease.Lease{}
	for _, job := range jobs {
		before[job] = h.get(job)
	}
	st.mu.Lock()
	st.armed, st.allow = true, 3
	st.mu.Unlock()
	h.stop()
	lagging, err := coordinator.LaggingRecords(inner)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the stop was cut with %d of %d records lagging their rows", lagging, n)
	if lagging == 0 || lagging == n {
		t.Fatalf("%d of %d records lag after the cut stop, want some checkpointed and some not", lagging, n)
	}
	if err := inner.Close(); err != nil {
		t.Fatal(err)
	}
	st2, err := badgerstore.OpenBadger(dir, badgerstore.BadgerOptions{Logger: quiet(), MemTableSize: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st2.Close() })
	h = startShards(t, st2, clk, 1)
	for job, want := range before {
		if got := h.get(job); got != want {
			t.Fatalf("job %.20s… after the restart:\n got %+v\nwant %+v", job, got, want)
		}
	}
	r := h.want(lease.Renew{Claim: claim(jobs[0], "L-0", 1, "holder"), RenewSequence: 1}, lease.OutcomeAccepted, lease.EventRenewed)
	if r.Row != 3 {
		t.Fatalf("the renewal after the restart is row %d, want 3 (offer, ack, renew)", r.Row)
	}
}
