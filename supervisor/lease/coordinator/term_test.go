package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/etcdtest"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/lease"
	"github.com/tetherhq/tether/supervisor/lease/coordinator"
)

// A coordinator is restartable: a second Run rebuilds its memory from the
// store, and between runs nothing is judged.
func TestRunAgainRebuildsFromTheStore(t *testing.T) {
	st := openStore(t, t.TempDir())
	defer st.Close()
	clk := clock.NewManual(t0)
	c, err := coordinator.New(context.Background(), coordinator.Config{Store: st, Clock: clk, Policy: lease.DefaultPolicy(), Log: quiet(), Shards: 2, MaxWait: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	run := func() (stop func()) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		ended := make(chan struct{})
		go func() { defer close(ended); done <- c.Run(ctx) }()
		waitServing(t, c, ended)
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		}
	}
	h := &harness{t: t, c: c, clock: clk, store: st}
	stop := run()
	first := c.Term()
	h.active("job-1", "w1", time.Minute)
	h.want(lease.Renew{Claim: claim("job-1", "L-job-1", 1, "w1"), RenewSequence: 1}, lease.OutcomeAccepted, lease.EventRenewed)
	stop()

	if serving, _ := c.Serving(); serving {
		t.Fatal("a coordinator whose Run returned says it serves")
	}
	_, err = c.Apply(context.Background(), lease.Renew{Claim: claim("job-1", "L-job-1", 1, "w1"), RenewSequence: 2})
	if !errors.Is(err, coordinator.ErrStopped) {
		t.Fatalf("a renew between runs: %v, want ErrStopped", err)
	}
	// Something else changes the store meanwhile (another replica led):
	// the next run sees it, because it reads the store, not its memory.
	other := start(t, st, clk, lease.DefaultPolicy())
	other.want(lease.Renew{Claim: claim("job-1", "L-job-1", 1, "w1"), RenewSequence: 2}, lease.OutcomeAccepted, lease.EventRenewed)
	other.stop()

	stop = run()
	defer stop()
	if c.Term() <= first+1 {
		t.Fatalf("terms %d then %d, with another run between: want a newer term for every run", first, c.Term())
	}
	if got := h.get("job-1"); got.RenewSequence != 2 {
		t.Fatalf("after the restart the lease has renew sequence %d, want 2 (written by the other run)", got.RenewSequence)
	}
	h.want(lease.Renew{Claim: claim("job-1", "L-job-1", 1, "w1"), RenewSequence: 2}, lease.OutcomeDuplicate, lease.EventDuplicateRenew)
	h.want(lease.Renew{Claim: claim("job-1", "L-job-1", 1, "w1"), RenewSequence: 3}, lease.OutcomeAccepted, lease.EventRenewed)
}

// A run that a newer run fenced off cannot commit: its decision in flight
// fails (and was never acknowledged), it stops serving, and the newer run
// has everything the older one acknowledged.
func TestANewerRunFencesOffAnOlderOne(t *testing.T) {
	dir := t.TempDir()
	raw := openStore(t, dir)
	defer raw.Close()
	gated := &gatedStore{Store: raw}
	clk := clock.NewManual(t0)
	old := start(t, gated, clk, lease.DefaultPolicy())
	old.active("job-1", "w1", time.Minute)
	old.want(lease.Renew{Claim: claim("job-1", "L-job-1", 1, "w1"), RenewSequence: 1}, lease.OutcomeAccepted, lease.EventRenewed)

	// The old run judges renew 2 and is about to commit it when the new
	// run starts (a paused leader whose election lease expired).
	gated.hold()
	t.Cleanup(gated.release)
	answer := make(chan error, 1)
	old.c.Submit(lease.Renew{Claim: claim("job-1", "L-job-1", 1, "w1"), RenewSequence: 2}, nil, func(_ coordinator.Result, err error) { answer <- err })
	<-gated.entered

	taker := start(t, raw, clk, lease.DefaultPolicy())
	if taker.c.Term() <= old.c.Term() {
		t.Fatalf("the new run's term %d is not above the old run's %d", taker.c.Term(), old.c.Term())
	}
	gated.release()
	if err := <-answer; !errors.Is(err, coordinator.ErrCommit) || !errors.Is(err, coordinator.ErrFenced) {
		t.Fatalf("the fenced-off run's commit answered %v, want ErrCommit wrapping ErrFenced", err)
	}
	waitFor(t, "the old run to stop serving", func() bool { serving, _ := old.c.Serving(); return !serving })
	if _, err := old.c.Apply(context.Background(), lease.Renew{Claim: claim("job-1", "L-job-1", 1, "w1"), RenewSequence: 3}); !errors.Is(err, coordinator.ErrStopped) {
		t.Fatalf("a renew sent to the fenced-off run: %v, want ErrStopped", err)
	}
	// The renew the old run never acknowledged is not there; the new run
	// judges it afresh.
	if got := taker.get("job-1"); got.RenewSequence != 1 {
		t.Fatalf("the new run loaded renew sequence %d, want 1 (the last acknowledged)", got.RenewSequence)
	}
	taker.want(lease.Renew{Claim: claim("job-1", "L-job-1", 1, "w1"), RenewSequence: 2}, lease.OutcomeAccepted, lease.EventRenewed)
	rows, err := taker.c.Evidence(context.Background(), "job-1")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(rows); n != 4 || rows[n-1].RenewSequence != 2 {
		t.Fatalf("evidence after the takeover: %d rows, last renew sequence %d; want offer, ack, renew 1, renew 2", n, rows[n-1].RenewSequence)
	}
}

func TestTakeoverUnderARenewStormLosesNoAcknowledgedRenew(t *testing.T) {
	st := openStore(t, t.TempDir())
	defer st.Close()
	takeoverUnderRenewStorm(t, st)
}

func TestEtcdTakeoverUnderARenewStormLosesNoAcknowledgedRenew(t *testing.T) {
	st := etcdtest.OpenStore(t, etcdtest.Start(t))
	takeoverUnderRenewStorm(t, st)
}

// takeoverUnderRenewStorm renews leases as fast as the coordinators answer
// while a second coordinator takes the store over from the first (as a
// new leader does while the old one still runs): every renew either
// coordinator acknowledged is in the final state, and the evidence rows of
// every job are in order (nothing the old run wrote after the takeover
// overwrote the new run's rows).
func takeoverUnderRenewStorm(t *testing.T, st store.Store) {
	const jobs = 16
	clk := clock.NewManual(t0)
	first := start(t, st, clk, lease.DefaultPolicy())
	for i := range jobs {
		first.active(fmt.Sprintf("job-%d", i), "w1", 10*time.Minute)
	}
	var (
		mu       sync.Mutex
		acked    [jobs]uint64 // the highest renew sequence acknowledged per job
		fenced   int
		accepted [2]int // by run
	)
	ctx, stopStorm := context.WithCancel(context.Background())
	var current sync.Map // "run" → *coordinator.Coordinator
	current.Store("run", first.c)
	switched := make(chan struct{}) // closed once current is the second run
	var wg sync.WaitGroup
	for i := range jobs {
		wg.Go(func() {
			job := fmt.Sprintf("job-%d", i)
			for seq := uint64(1); ctx.Err() == nil; seq++ {
				// Half the holders stay with the first run throughout, as
				// clients of a leader that does not know it was replaced.
				c := any(first.c)
				if i%2 == 1 {
					c, _ = current.Load("run")
				}
				run := 0
				if c != first.c {
					run = 1
				}
				r, err := c.(*coordinator.Coordinator).Apply(ctx, lease.Renew{Claim: claim(job, "L-"+job, 1, "w1"), RenewSequence: seq})
				mu.Lock()
				switch {
				case err == nil && (r.Decision.Outcome == lease.OutcomeAccepted || r.Decision.Event == lease.EventDuplicateRenew):
					acked[i] = max(acked[i], r.Lease.RenewSequence)
					accepted[run]++
				case errors.Is(err, coordinator.ErrFenced):
					fenced++
				case err == nil && r.Decision.Outcome == lease.OutcomeRejected:
					t.Errorf("%s renew %d rejected: %s", job, seq, r.Decision)
				}
				mu.Unlock()
				if run == 0 && errors.Is(err, coordinator.ErrStopped) {
					// The first run, fenced off, answers nothing more
					// until it ends (refused at once, never judged):
					// asking it again only spins, taking the CPU from
					// the second run's renewals the test waits for
					// (hundreds of thousands of refusals under load).
					// Its own holders stop; the others wait to be
					// moved to the second run.
					if i%2 == 0 {
						<-ctx.Done()
						return
					}
					select {
					case <-switched:
					case <-ctx.Done():
					}
				}
			}
		})
	}
	waitFor(t, "renews on the first run", func() bool { mu.Lock(); defer mu.Unlock(); return accepted[0] >= 10*jobs })
	second := start(t, st, clk, lease.DefaultPolicy())
	current.Store("run", second.c)
	close(switched)
	waitFor(t, "renews on the second run", func() bool { mu.Lock(); defer mu.Unlock(); return accepted[1] >= 5*jobs })
	stopStorm()
	wg.Wait()
	t.Logf("acknowledged: %d by the first run, %d by the second; %d refused as fenced off", accepted[0], accepted[1], fenced)
	for i := range jobs {
		job := fmt.Sprintf("job-%d", i)
		if got := second.get(job).RenewSequence; got < acked[i] {
			t.Errorf("%s: renew %d was acknowledged, the lease says %d: an acknowledged renew was lost", job, acked[i], got)
		}
		rows, err := second.c.Evidence(context.Background(), job)
		if err != nil {
			t.Fatal(err)
		}
		var last uint64
		for k, r := range rows {
			if r.Number != uint64(k+1) {
				t.Fatalf("%s: row %d is numbered %d", job, k+1, r.Number)
			}
			if r.RenewSequence < last {
				t.Fatalf("%s: row %d has renew sequence %d after %d: a fenced-off run overwrote a row", job, r.Number, r.RenewSequence, last)
			}
			last = r.RenewSequence
		}
	}
	if serving, _ := first.c.Serving(); serving {
		t.Fatal("the first run still serves after the second took over")
	}
}

// A change of leadership is a restart (docs/design.md §2): a lease that expired
// under the old leader stays expired (its generation is never revived), a
// deadline that passed while the old leader was still deciding is not
// extended, and only deadlines that fell while nobody served are extended,
// by the restart policy's grace.
func TestTakeoverIsARestart(t *testing.T) {
	raw := openStore(t, t.TempDir())
	defer raw.Close()
	cut := &gatedStore{Store: raw}
	clk := clock.NewManual(t0)
	p := lease.DefaultPolicy() // extend: grace 30s, spread 15s
	old := startWith(t, cut, clk, p, time.Hour)
	old.active("expired", "w1", 10*time.Second) // expires at t0+10s
	old.active("passed", "w1", 20*time.Second)  // deadline t0+20s
	old.active("gap", "w1", time.Minute)        // deadline t0+60s
	clk.Advance(15 * time.Second)
	waitFor(t, "the first lease to expire", func() bool { return old.get("expired").State == lease.StateExpired })
	clk.Advance(10 * time.Second) // t0+25s: "passed" is past its deadline
	old.want(lease.Progress{Claim: claim("gap", "L-gap", 1, "w1"), ProgressSequence: 1, ProgressValue: "1"}, lease.OutcomeAccepted, lease.EventProgressRecorded)
	// The old leader is cut off from the store here (its last commit:
	// t0+25s), and a new one takes over a minute later.
	cut.mu.Lock()
	cut.fail = errors.New("cut off from the store")
	cut.mu.Unlock()
	clk.Advance(time.Minute)
	takeoverAt := clk.Now()
	taker := start(t, raw, clk, p)
	if got := taker.c.LastAlive(); !got.Equal(t0.Add(25 * time.Second)) {
		t.Fatalf("the new run's last alive is %s, want the old run's last commit at t0+25s", got)
	}
	waitFor(t, "the gap lease to be recovered", func() bool { return taker.get("gap").ExpiresAt.After(takeoverAt) })
	if l := taker.get("gap"); l.State != lease.StateActive || l.ExpiresAt.Before(takeoverAt.Add(p.RestartGrace)) {
		t.Fatalf("the lease whose deadline fell while nobody served: %s until %s, want ACTIVE until at least the grace", l.State, l.ExpiresAt)
	}
	// A deadline that passed while the old leader still decided expires,
	// whether or not the old leader got round to it.
	waitFor(t, "the passed lease to expire", func() bool { return taker.get("passed").State == lease.StateExpired })
	for _, job := range []string{"expired", "passed"} {
		rows, _ := taker.c.Evidence(context.Background(), job)
		for _, r := range rows {
			if r.Message == lease.KindRecover && r.Decision.Outcome == lease.OutcomeAccepted {
				t.Fatalf("%s was extended by the takeover: %s", job, r.Decision)
			}
		}
	}
	// A late renew of the expired generation does not revive it.
	r := taker.apply(lease.Renew{Claim: claim("expired", "L-expired", 1, "w1"), RenewSequence: 1})
	if r.Decision.Outcome != lease.OutcomeRejected || r.Lease.State != lease.StateExpired {
		t.Fatalf("a late renew of an expired generation after the takeover: %s, lease %s", r.Decision, r.Lease.State)
	}
}

// A run that cannot load the leases (a record it cannot decode) fails
// instead of serving from a partial memory, and what waited for it fails
// with ErrStopped rather than waiting for ever.
func TestARunThatCannotLoadFails(t *testing.T) {
	st := openStore(t, t.TempDir())
	defer st.Close()
	if err := st.Update(context.Background(), func(tx store.Txn) error {
		return tx.Put([]byte("leases/job/broken"), []byte{99, 1, 2})
	}); err != nil {
		t.Fatal(err)
	}
	c, err := coordinator.New(context.Background(), coordinator.Config{Store: st, Clock: clock.NewManual(t0), Policy: lease.DefaultPolicy(), Log: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	waiting := make(chan error, 1)
	c.Submit(lease.Tick{JobID: "job-1"}, nil, func(_ coordinator.Result, err error) { waiting <- err })
	if err := c.Run(context.Background()); !errors.Is(err, coordinator.ErrCorrupt) {
		t.Fatalf("Run over a corrupt record returned %v, want ErrCorrupt", err)
	}
	if err := <-waiting; !errors.Is(err, coordinator.ErrStopped) {
		t.Fatalf("a message sent before the failed run: %v, want ErrStopped", err)
	}
	if serving, _ := c.Serving(); serving {
		t.Fatal("a run that failed to load serves")
	}
}

// A run that takes over on etcd loads every lease without a round trip per
// lease: the rows after each job's record are fetched in batches
// (store.PrefetchScansFrom), so a takeover's load costs a handful of
// requests for hundreds of leases, not one each — and loads them right.
func TestEtcdLoadFetchesEveryLeasesRowsInBatches(t *testing.T) {
	const jobs = 300
	st := etcdtest.OpenStore(t, etcdtest.Start(t))
	clk := clock.NewManual(t0)
	first := start(t, st, clk, lease.DefaultPolicy())
	var wg sync.WaitGroup
	errs := make(chan error, jobs)
	for i := range jobs {
		wg.Go(func() {
			job := fmt.Sprintf("job-%03d", i)
			for _, m := range []lease.Message{
				lease.Offer{JobID: job, LeaseID: "L-" + job, HolderIdentity: "w1", LeaseDuration: 10 * time.Minute},
				lease.Ack{Claim: claim(job, "L-"+job, 1, "w1")},
				lease.Renew{Claim: claim(job, "L-"+job, 1, "w1"), RenewSequence: 1},
			} {
				if r, err := first.c.Apply(context.Background(), m); err != nil || r.Decision.Outcome != lease.OutcomeAccepted {
					errs <- fmt.Errorf("%s %T: %v %v", job, m, r.Decision, err)
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
	want := map[string]lease.Lease{}
	for i := range jobs {
		job := fmt.Sprintf("job-%03d", i)
		want[job] = first.get(job)
	}
	// The second run starts while the first still runs (a takeover): the
	// rows after each record are what it must catch up on.
	before := st.Stats().ReadRequests
	second := start(t, st, clk, lease.DefaultPolicy())
	reads := st.Stats().ReadRequests - before
	t.Logf("the takeover's start (term, load) made %d read requests for %d leases", reads, jobs)
	if reads > 20 {
		t.Fatalf("the takeover's load of %d leases made %d read requests: a round trip per lease", jobs, reads)
	}
	for job, l := range want {
		if got := second.get(job); got != l {
			t.Fatalf("%s after the takeover:\n got %+v\nwant %+v", job, got, l)
		}
	}
}
