package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	"github.com/tetherhq/tether/supervisor/lease"
	"github.com/tetherhq/tether/supervisor/lease/coordinator"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// harness runs a coordinator over a store with a manual clock.
type harness struct {
	t      *testing.T
	c      *coordinator.Coordinator
	clock  *clock.Manual
	store  store.Store
	cancel context.CancelFunc
	done   chan error
}

func openStore(t *testing.T, dir string) *badgerstore.Badger {
	t.Helper()
	st, err := badgerstore.OpenBadger(dir, badgerstore.BadgerOptions{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func start(t *testing.T, st store.Store, clk *clock.Manual, p lease.Policy) *harness {
	t.Helper()
	return startWith(t, st, clk, p, time.Millisecond)
}

// startWith sets how long a shard may sleep between looks at the clock: a
// long maxWait keeps the coordinator from acting on a deadline the manual
// clock passed, as if it had not got round to it yet.
func startWith(t *testing.T, st store.Store, clk *clock.Manual, p lease.Policy, maxWait time.Duration) *harness {
	t.Helper()
	c, err := coordinator.New(context.Background(), coordinator.Config{
		Store: st, Clock: clk, Policy: p, Log: quiet(), MaxWait: maxWait, Shards: 3,
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

// waitServing waits until c's run has loaded the store and serves, and
// fails at once if the run ends first (ended is closed when Run returns).
// How long the load takes is the store's size and the machine's: a
// restart on 4,000 leases took 6.5 s under -race -cpu=1 with the machine
// loaded, and more than the 10 s this wait once allowed as the load grew.
// Its bound is a guard against a run that neither serves nor ends.
func waitServing(t *testing.T, c *coordinator.Coordinator, ended <-chan struct{}) {
	t.Helper()
	guard := time.NewTimer(2 * time.Minute)
	defer guard.Stop()
	for {
		serving, changed := c.Serving()
		if serving {
			return
		}
		select {
		case <-changed:
		case <-ended:
			t.Fatal("the coordinator's run ended before it served")
		case <-guard.C: // a guard against a hang, not a timing
			t.Fatal("the coordinator neither served nor ended its run in two minutes")
		}
	}
}

func (h *harness) stop() {
	if h.cancel == nil {
		return
	}
	h.cancel()
	if err := <-h.done; err != nil {
		h.t.Errorf("Run: %v", err)
	}
	h.cancel = nil
}

func (h *harness) apply(m lease.Message) coordinator.Result {
	h.t.Helper()
	r, err := h.c.Apply(context.Background(), m)
	if err != nil {
		h.t.Fatalf("apply %T: %v", m, err)
	}
	return r
}

func (h *harness) want(m lease.Message, outcome lease.Outcome, event lease.AuditEvent) coordinator.Result {
	h.t.Helper()
	r := h.apply(m)
	if r.Decision.Outcome != outcome || r.Decision.Event != event {
		h.t.Fatalf("%T: got %s, want %s %s", m, r.Decision, outcome, event)
	}
	return r
}

func (h *harness) get(job string) lease.Lease {
	h.t.Helper()
	l, err := h.c.Get(context.Background(), job)
	if err != nil {
		h.t.Fatalf("get %s: %v", job, err)
	}
	return l
}

// waitFor polls a condition another goroutine makes true (the shard acting
// on the manual clock); it never stands in for a fixed sleep.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func claim(job, leaseID string, gen uint64, holder string) lease.Claim {
	return lease.Claim{JobID: job, LeaseID: leaseID, Generation: gen, HolderIdentity: holder}
}

// active offers job to holder and acks it: generation 1, ACTIVE for d.
func (h *harness) active(job, holder string, d time.Duration) lease.Lease {
	h.t.Helper()
	h.want(lease.Offer{JobID: job, LeaseID: "L-" + job, HolderIdentity: holder, LeaseDuration: d}, lease.OutcomeAccepted, lease.EventOffered)
	r := h.want(lease.Ack{Claim: claim(job, "L-"+job, 1, holder)}, lease.OutcomeAccepted, lease.EventAcked)
	return r.Lease
}

func TestDecisionsSurviveARestart(t *testing.T) {
	dir := t.TempDir()
	clk := clock.NewManual(t0)
	st := openStore(t, dir)
	h := start(t, st, clk, lease.DefaultPolicy())
	h.active("job-1", "w1", time.Minute)
	clk.Advance(time.Second)
	h.want(lease.Renew{Claim: claim("job-1", "L-job-1", 1, "w1"), RenewSequence: 1}, lease.OutcomeAccepted, lease.EventRenewed)
	h.want(lease.Progress{Claim: claim("job-1", "L-job-1", 1, "w1"), ProgressSequence: 4, ProgressValue: "40%"}, lease.OutcomeAccepted, lease.EventProgressRecorded)
	h.want(lease.Renew{Claim: claim("job-1", "L-job-1", 1, "w9"), RenewSequence: 2}, lease.OutcomeRejected, lease.EventOwnershipConflict)
	before := h.get("job-1")
	h.stop()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	st = openStore(t, dir)
	defer st.Close()
	h = start(t, st, clk, lease.DefaultPolicy())
	after := h.get("job-1")
	if after != before {
		t.Fatalf("after restart:\n got %+v\nwant %+v", after, before)
	}
	rows, err := h.c.Evidence(context.Background(), "job-1")
	if err != nil {
		t.Fatal(err)
	}
	wantKinds := []lease.Kind{lease.KindOffer, lease.KindAck, lease.KindRenew, lease.KindProgress, lease.KindRenew}
	if len(rows) != len(wantKinds) {
		t.Fatalf("%d evidence rows, want %d", len(rows), len(wantKinds))
	}
	for i, r := range rows {
		if r.Number != uint64(i+1) || r.Message != wantKinds[i] {
			t.Errorf("row %d: number %d message %s, want %d %s", i, r.Number, r.Message, i+1, wantKinds[i])
		}
	}
	if rows[4].Decision.Event != lease.EventOwnershipConflict || !rows[4].OwnershipConflict {
		t.Errorf("the rejected renew's row is %s (conflict %v); the audit keeps rejected messages", rows[4].Decision, rows[4].OwnershipConflict)
	}
	// The next renew continues from the recovered sequence, and the
	// recorded conflict still halts it: authority is not extended.
	h.want(lease.Renew{Claim: claim("job-1", "L-job-1", 1, "w1"), RenewSequence: 1}, lease.OutcomeDuplicate, lease.EventDuplicateRenew)
	h.want(lease.Renew{Claim: claim("job-1", "L-job-1", 1, "w1"), RenewSequence: 2}, lease.OutcomeRejected, lease.EventOwnershipConflict)
	if got := h.get("job-1"); !got.ExpiresAt.Equal(before.ExpiresAt) || !got.OwnershipConflict {
		t.Fatalf("a renew under a recorded conflict changed the lease: %+v", got)
	}
}

// gatedStore holds every Update until the test releases it, so a test can
// look at the coordinator while a commit is in flight. It wraps a real
// store; only the timing is controlled.
type gatedStore struct {
	store.Store
	mu      sync.Mutex
	gate    chan struct{}
	entered chan struct{}
	fail    error
	updates atomic.Int64
}

func (g *gatedStore) Update(ctx context.Context, fn func(tx store.Txn) error) error {
	g.updates.Add(1)
	g.mu.Lock()
	gate, fail := g.gate, g.fail
	g.mu.Unlock()
	if gate != nil {
		g.entered <- struct{}{}
		<-gate
	}
	if fail != nil {
		return fail
	}
	return g.Store.Update(ctx, fn)
}

func (g *gatedStore) hold() {
	g.mu.Lock()
	g.gate = make(chan struct{})
	g.entered = make(chan struct{}, 16)
	g.mu.Unlock()
}

func (g *gatedStore) release() {
	g.mu.Lock()
	if g.gate != nil {
		close(g.gate)
		g.gate = nil
	}
	g.mu.Unlock()
}

func TestReadsNeverSeeUndurableDecisions(t *testing.T) {
	st := &gatedStore{Store: openStore(t, t.TempDir())}
	defer st.Store.Close()
	clk := clock.NewManual(t0)
	h := start(t, st, clk, lease.DefaultPolicy())
	h.active("job-1", "w1", time.Minute)
	durable := h.get("job-1")

	st.hold()
	t.Cleanup(st.release) // runs before the harness stops: a failing test must not hang on the gate
	results := make(chan coordinator.Result, 2)
	for seq := uint64(1); seq <= 2; seq++ {
		h.c.Submit(lease.Renew{Claim: claim("job-1", "L-job-1", 1, "w1"), RenewSequence: seq}, nil, func(r coordinator.Result, err error) {
			if err != nil {
				t.Error(err)
			}
			results <- r
		})
	}
	<-st.entered // the first renew's commit is in flight
	if got := h.get("job-1"); got != durable {
		t.Fatalf("a read during the commit saw %+v, want the durable %+v", got, durable)
	}
	select {
	case r := <-results:
		t.Fatalf("answered before the commit: %s", r.Decision)
	default:
	}
	st.release()
	// The second renew was judged against the first while the first was
	// being committed (the pipeline), so both are accepted, in order.
	for seq := uint64(1); seq <= 2; seq++ {
		r := <-results
		if r.Decision.Outcome != lease.OutcomeAccepted || r.Lease.RenewSequence != seq {
			t.Fatalf("renew %d: %s, lease seq %d", seq, r.Decision, r.Lease.RenewSequence)
		}
	}
	if got := h.get("job-1"); got.RenewSequence != 2 {
		t.Fatalf("after the commits the read shows seq %d, want 2", got.RenewSequence)
	}
}

// jobsOnEveryShard activates one job on each shard and returns them by
// shard.
func (h *harness) jobsOnEveryShard(shards int) []string {
	h.t.Helper()
	jobs := make([]string, shards)
	for i, found := 0, 0; found < shards; i++ {
		job := fmt.Sprintf("job-%d", i)
		if s := h.c.ShardOf(job); jobs[s] == "" {
			jobs[s] = job
			h.active(job, "w1", time.Minute)
			found++
		}
	}
	return jobs
}

// The shards share a commit: what every shard judged while a commit was in
// flight becomes durable in the next store Update, not in one Update per
// shard taking turns.
func TestShardsShareOneCommit(t *testing.T) {
	st := &gatedStore{Store: openStore(t, t.TempDir())}
	defer st.Store.Close()
	h := start(t, st, clock.NewManual(t0), lease.DefaultPolicy())
	jobs := h.jobsOnEveryShard(3)
	renew := func(job string, seq uint64) lease.Renew {
		return lease.Renew{Claim: claim(job, "L-"+job, 1, "w1"), RenewSequence: seq}
	}
	answers := make(chan coordinator.Result, 4)
	answer := func(r coordinator.Result, err error) {
		if err != nil {
			t.Error(err)
		}
		answers <- r
	}

	st.hold()
	t.Cleanup(st.release)
	h.c.Submit(renew(jobs[0], 1), nil, answer)
	<-st.entered // shard 0's commit is in flight
	before := st.updates.Load()
	// Shard 0 judges its next renew into the batch after the one in
	// flight; shards 1 and 2 seal theirs at once, and they wait.
	judged := make(chan struct{})
	h.c.Submit(renew(jobs[0], 2), func(lease.Lease) error { close(judged); return nil }, answer)
	h.c.Submit(renew(jobs[1], 1), nil, answer)
	h.c.Submit(renew(jobs[2], 1), nil, answer)
	<-judged
	waitFor(t, "the other shards' batches to wait for the committer", func() bool { return h.c.QueuedBatches() == 2 })
	st.release()
	for range 4 {
		if r := <-answers; r.Decision.Outcome != lease.OutcomeAccepted {
			t.Fatalf("renew: %s", r.Decision)
		}
	}
	if got := st.updates.Load() - before; got != 1 {
		t.Fatalf("the three shards' batches took %d store Updates after the one in flight, want 1", got)
	}
	for i, job := range jobs {
		want := uint64(1)
		if i == 0 {
			want = 2
		}
		if got := h.get(job).RenewSequence; got != want {
			t.Fatalf("%s: renew sequence %d, want %d", job, got, want)
		}
	}
}

// A commit that fails takes every shard's batch in it back: nothing in it
// happened, on any shard.
func TestAFailedSharedCommitRollsEveryShardBack(t *testing.T) {
	st := &gatedStore{Store: openStore(t, t.TempDir())}
	defer st.Store.Close()
	h := start(t, st, clock.NewManual(t0), lease.DefaultPolicy())
	jobs := h.jobsOnEveryShard(3)
	renew := func(job string, seq uint64) lease.Renew {
		return lease.Renew{Claim: claim(job, "L-"+job, 1, "w1"), RenewSequence: seq}
	}
	st.hold()
	t.Cleanup(st.release)
	first := make(chan error, 1)
	h.c.Submit(renew(jobs[0], 1), nil, func(_ coordinator.Result, err error) { first <- err })
	<-st.entered // shard 0's first renew is being committed, and will be
	var before []lease.Lease
	for _, job := range jobs[1:] {
		before = append(before, h.get(job))
	}
	// The next commit carries shard 0's second renew and the batches of
	// shards 1 and 2; it fails.
	errs := make(chan error, 3)
	fail := func(_ coordinator.Result, err error) { errs <- err }
	judged := make(chan struct{})
	h.c.Submit(renew(jobs[0], 2), func(lease.Lease) error { close(judged); return nil }, fail)
	for _, job := range jobs[1:] {
		h.c.Submit(renew(job, 1), nil, fail)
	}
	<-judged
	waitFor(t, "shards 1 and 2 to seal their batches", func() bool { return h.c.QueuedBatches() == 2 })
	st.mu.Lock()
	st.fail = errors.New("disk on fire")
	st.mu.Unlock()
	st.release()
	if err := <-first; err != nil {
		t.Fatalf("the commit in flight before the failure: %v", err)
	}
	for range 3 {
		if err := <-errs; !errors.Is(err, coordinator.ErrCommit) {
			t.Fatalf("renew in the failed commit: %v, want ErrCommit", err)
		}
	}
	st.mu.Lock()
	st.fail = nil
	st.mu.Unlock()
	if got := h.get(jobs[0]).RenewSequence; got != 1 {
		t.Fatalf("%s after the failed commit: renew sequence %d, want 1 (the commit before it)", jobs[0], got)
	}
	for i, job := range jobs[1:] {
		if got := h.get(job); got != before[i] {
			t.Fatalf("%s after the failed commit: %+v, want %+v", job, got, before[i])
		}
	}
	// Every renew of the failed commit is judged afresh: none was accepted.
	h.want(renew(jobs[0], 2), lease.OutcomeAccepted, lease.EventRenewed)
	for _, job := range jobs[1:] {
		h.want(renew(job, 1), lease.OutcomeAccepted, lease.EventRenewed)
	}
}

func TestAFailedCommitIsNotADecision(t *testing.T) {
	st := &gatedStore{Store: openStore(t, t.TempDir())}
	defer st.Store.Close()
	clk := clock.NewManual(t0)
	h := start(t, st, clk, lease.DefaultPolicy())
	h.active("job-1", "w1", time.Minute)
	before := h.get("job-1")

	st.mu.Lock()
	st.fail = errors.New("disk on fire")
	st.mu.Unlock()
	_, err := h.c.Apply(context.Background(), lease.Renew{Claim: claim("job-1", "L-job-1", 1, "w1"), RenewSequence: 1})
	if !errors.Is(err, coordinator.ErrCommit) {
		t.Fatalf("renew during a failing store: %v, want ErrCommit", err)
	}
	st.mu.Lock()
	st.fail = nil
	st.mu.Unlock()
	if got := h.get("job-1"); got != before {
		t.Fatalf("after a failed commit the lease is %+v, want %+v", got, before)
	}
	// The same renew is judged afresh: it was never accepted.
	h.want(lease.Renew{Claim: claim("job-1", "L-job-1", 1, "w1"), RenewSequence: 1}, lease.OutcomeAccepted, lease.EventRenewed)
}

func TestExpiryIsActedOnWhenTheDeclaredClockReachesIt(t *testing.T) {
	st := openStore(t, t.TempDir())
	defer st.Close()
	clk := clock.NewManual(t0)
	h := start(t, st, clk, lease.DefaultPolicy())
	h.active("job-1", "w1", 30*time.Second)
	clk.Advance(29 * time.Second)
	h.want(lease.Progress{Claim: claim("job-1", "L-job-1", 1, "w1"), ProgressSequence: 1, ProgressValue: "x"}, lease.OutcomeAccepted, lease.EventProgressRecorded)
	if got := h.get("job-1"); got.State != lease.StateActive {
		t.Fatalf("before expiry: %s", got.State)
	}
	clk.Advance(time.Second) // progress does not renew: expiry at ack + 30s
	waitFor(t, "the expiry to be acted on", func() bool { return h.get("job-1").State == lease.StateExpired })
	rows, err := h.c.Evidence(context.Background(), "job-1")
	if err != nil {
		t.Fatal(err)
	}
	last := rows[len(rows)-1]
	if last.Message != lease.KindTick || last.Decision.Event != lease.EventLeaseExpired || !last.LeaseExpired {
		t.Fatalf("last row: %s %s expired=%v", last.Message, last.Decision, last.LeaseExpired)
	}
	// An expired generation is never revived.
	h.want(lease.Renew{Claim: claim("job-1", "L-job-1", 1, "w1"), RenewSequence: 1}, lease.OutcomeRejected, lease.EventLeaseExpired)
}

func TestAutomaticReassignmentFollowsThePolicy(t *testing.T) {
	st := openStore(t, t.TempDir())
	defer st.Close()
	clk := clock.NewManual(t0)
	p := lease.DefaultPolicy()
	p.AckMiss = lease.AckMissReassign
	h := start(t, st, clk, p)
	h.want(lease.Offer{JobID: "job-1", LeaseID: "L1", HolderIdentity: "w1", LeaseDuration: time.Minute, AckTimeout: 10 * time.Second}, lease.OutcomeAccepted, lease.EventOffered)
	h.want(lease.Offer{JobID: "job-2", LeaseID: "L2", HolderIdentity: "w1", LeaseDuration: time.Minute, AckTimeout: 10 * time.Second}, lease.OutcomeAccepted, lease.EventOffered)
	h.want(lease.RequestCancel{JobID: "job-2", Reason: "not needed"}, lease.OutcomeAccepted, lease.EventCancelRequested)
	clk.Advance(10 * time.Second)
	waitFor(t, "the automatic reassignment", func() bool { return h.get("job-1").Generation == 2 })
	l := h.get("job-1")
	if l.State != lease.StateOffered || l.HolderIdentity != "w1" || l.LeaseID == "L1" || l.Transitions != 1 {
		t.Fatalf("after the missed ACK: %+v", l)
	}
	// The late ACK of generation 1 is stale; generation 2 is offered.
	h.want(lease.Ack{Claim: claim("job-1", "L1", 1, "w1")}, lease.OutcomeRejected, lease.EventStaleGeneration)
	h.want(lease.Ack{Claim: claim("job-1", l.LeaseID, 2, "w1")}, lease.OutcomeAccepted, lease.EventAcked)
	// A cancel request stops automatic reassignment: the missed ACK with
	// the request standing closes the job UNRESOLVED (thirty-eighth pass).
	waitFor(t, "job-2 to expire", func() bool { return h.get("job-2").TerminalResult == lease.ResultUnresolved })
	if l := h.get("job-2"); l.Generation != 1 {
		t.Fatalf("a cancelled job was reassigned automatically: %+v", l)
	}
}

func TestRestartExtendsOnlyDeadlinesThatFellDuringTheDowntime(t *testing.T) {
	dir := t.TempDir()
	st := openStore(t, dir)
	clk := clock.NewManual(t0)
	p := lease.DefaultPolicy() // extend: grace 30s, spread 15s
	h := start(t, st, clk, p)
	h.active("short", "w1", 10*time.Second) // expires at t0+10s, while the coordinator is up
	h.active("long-a", "w1", time.Minute)   // expires at t0+60s, during the downtime
	h.active("long-b", "w2", time.Minute)
	clk.Advance(20 * time.Second)
	waitFor(t, "the short lease to expire", func() bool { return h.get("short").State == lease.StateExpired })
	h.stop() // a clean stop records t0+20s as the last alive time
	st.Close()

	clk.Advance(10 * time.Minute) // down for ten minutes
	restartAt := clk.Now()
	st = openStore(t, dir)
	defer st.Close()
	h = start(t, st, clk, p)
	if got := h.c.LastAlive(); !got.Equal(t0.Add(20 * time.Second)) {
		t.Fatalf("last alive %s, want the clean stop at t0+20s", got)
	}
	for _, job := range []string{"long-a", "long-b"} {
		waitFor(t, job+" to be recovered", func() bool { return h.get(job).ExpiresAt.After(restartAt) })
		l := h.get(job)
		floor := restartAt.Add(p.RestartGrace)
		if l.State != lease.StateActive || l.ExpiresAt.Before(floor) || !l.ExpiresAt.Before(floor.Add(p.RestartSpread)) {
			t.Fatalf("%s after restart: %s until %s, want ACTIVE until [%s, %s)", job, l.State, l.ExpiresAt, floor, floor.Add(p.RestartSpread))
		}
	}
	if a, b := h.get("long-a").ExpiresAt, h.get("long-b").ExpiresAt; a.Equal(b) {
		t.Fatalf("recovered deadlines pile up at %s; they must be spread", a)
	}
	if l := h.get("short"); l.State != lease.StateExpired {
		t.Fatalf("a lease that expired before the stop was revived: %+v", l)
	}
	// The holder renews normally after the restart.
	h.want(lease.Renew{Claim: claim("long-a", "L-long-a", 1, "w1"), RenewSequence: 1}, lease.OutcomeAccepted, lease.EventRenewed)
	rows, _ := h.c.Evidence(context.Background(), "long-b")
	if r := rows[len(rows)-1]; r.Message != lease.KindRecover || r.Decision.Outcome != lease.OutcomeAccepted {
		t.Fatalf("long-b's last row is %s %s, want the accepted recovery", r.Message, r.Decision)
	}
}

// A deadline that passed while the coordinator was still up is not
// extended by a restart, even if the coordinator had not acted on it yet.
func TestRestartDoesNotExtendADeadlineThatPassedBeforeTheStop(t *testing.T) {
	dir := t.TempDir()
	st := openStore(t, dir)
	clk := clock.NewManual(t0)
	p := lease.DefaultPolicy()
	h := startWith(t, st, clk, p, time.Hour)
	h.active("job-1", "w1", 10*time.Second) // deadline t0+10s
	clk.Advance(20 * time.Second)           // passes while up; the shard sleeps on
	h.stop()                                // clean stop: alive at t0+20s
	st.Close()
	clk.Advance(10 * time.Minute)
	st = openStore(t, dir)
	defer st.Close()
	h = start(t, st, clk, p)
	if !h.c.LastAlive().Equal(t0.Add(20 * time.Second)) {
		t.Fatalf("last alive %s, want the clean stop at t0+20s", h.c.LastAlive())
	}
	waitFor(t, "the expiry", func() bool { return h.get("job-1").State == lease.StateExpired })
	rows, _ := h.c.Evidence(context.Background(), "job-1")
	for _, r := range rows {
		if r.Message == lease.KindRecover && r.Decision.Outcome == lease.OutcomeAccepted {
			t.Fatalf("a deadline that passed before the stop was extended: %s", r.Decision)
		}
	}
}

func TestStrictRestartExpiresWhatFellDuringTheDowntime(t *testing.T) {
	dir := t.TempDir()
	st := openStore(t, dir)
	clk := clock.NewManual(t0)
	p := lease.DefaultPolicy()
	p.Restart = lease.RestartStrict
	h := start(t, st, clk, p)
	h.active("job-1", "w1", time.Minute)
	h.stop()
	st.Close()
	clk.Advance(5 * time.Minute)
	st = openStore(t, dir)
	defer st.Close()
	h = start(t, st, clk, p)
	waitFor(t, "the expiry", func() bool { return h.get("job-1").State == lease.StateExpired })
}

func TestCancelAndFinalizeHeldBy(t *testing.T) {
	st := openStore(t, t.TempDir())
	defer st.Close()
	clk := clock.NewManual(t0)
	h := start(t, st, clk, lease.DefaultPolicy())
	h.active("acked", "w1", time.Minute)
	h.active("silent", "w1", time.Minute)
	h.active("expiring", "w2", 10*time.Second)
	h.active("done", "w2", time.Minute)
	h.active("elsewhere", "w3", time.Minute)
	h.want(lease.Offer{JobID: "offered", LeaseID: "L-offered", HolderIdentity: "w1", LeaseDuration: time.Minute}, lease.OutcomeAccepted, lease.EventOffered)
	h.want(lease.Complete{Claim: claim("done", "L-done", 1, "w2"), Result: lease.ResultSuccess}, lease.OutcomeAccepted, lease.EventTerminalAccepted)

	ctx := context.Background()
	holders := []string{"w1", "w2"}
	if err := h.c.CancelHeldBy(ctx, holders, "terminated"); err != nil {
		t.Fatal(err)
	}
	if err := h.c.CancelHeldBy(ctx, holders, "terminated"); err != nil { // idempotent
		t.Fatal(err)
	}
	for _, job := range []string{"acked", "silent", "expiring", "offered"} {
		if !h.get(job).CancelRequested {
			t.Errorf("%s: cancel not requested", job)
		}
	}
	if h.get("elsewhere").CancelRequested || h.get("done").CancelRequested {
		t.Error("a lease outside the holders, or a terminal one, got a cancel request")
	}
	h.want(lease.CancelAck{Claim: claim("acked", "L-acked", 1, "w1")}, lease.OutcomeAccepted, lease.EventCancelAcked)
	clk.Advance(15 * time.Second)

	// How each job ends: its terminal result, and whether its lease ran out.
	type end struct {
		result  lease.TerminalResult
		expired bool
	}
	want := map[string]end{
		"acked":    {lease.ResultCancelled, false},
		"silent":   {lease.ResultUnresolved, false},
		"expiring": {lease.ResultFailed, true},
		"done":     {lease.ResultSuccess, false},
		"offered":  {lease.ResultCancelled, true}, // its ACK deadline passed
	}
	for round := range 2 { // idempotent: the second round reports the same
		got, err := h.c.FinalizeHeldBy(ctx, holders, "terminated")
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Fatalf("round %d: %d leases reported, want %d", round, len(got), len(want))
		}
		for _, l := range got {
			if e := (end{l.TerminalResult, l.LeaseExpired}); e != want[l.JobID] {
				t.Errorf("round %d: %s ended %+v, want %+v", round, l.JobID, e, want[l.JobID])
			}
		}
	}
	for job := range want {
		if l := h.get(job); l.State != lease.StateTerminal {
			t.Errorf("%s is %s after finalisation, want TERMINAL", job, l.State)
		}
	}
	if l := h.get("silent"); l.TerminalResult != lease.ResultUnresolved || l.UnresolvedUntil.IsZero() {
		t.Errorf("silent: %s until %s, want a bounded UNRESOLVED", l.TerminalResult, l.UnresolvedUntil)
	}
	if l := h.get("expiring"); l.TerminalResult != lease.ResultFailed {
		t.Errorf("expiring: %s; an expired lease never proved success", l.TerminalResult)
	}
}

// A finalisation with no cancel request before it (a rollout's batch
// leaves its leases for the handover; aborting the rollout finalises them)
// requests the cancellation itself, so the never-ACKed offer it resolves
// CANCELLED has the request in its record; before, the lease machine
// refusing CANCELLED without a request would have left the job open.
func TestFinalizeHeldByRequestsTheCancelItReconciles(t *testing.T) {
	st := openStore(t, t.TempDir())
	defer st.Close()
	clk := clock.NewManual(t0)
	h := start(t, st, clk, lease.DefaultPolicy())
	h.want(lease.Offer{JobID: "offered", LeaseID: "L-offered", HolderIdentity: "w1", LeaseDuration: time.Minute}, lease.OutcomeAccepted, lease.EventOffered)
	h.active("running", "w1", time.Minute)
	got, err := h.c.FinalizeHeldBy(context.Background(), []string{"w1"}, "rollout aborted")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("%d leases reported, want 2", len(got))
	}
	for _, l := range got {
		want := map[string]lease.TerminalResult{"offered": lease.ResultCancelled, "running": lease.ResultUnresolved}[l.JobID]
		if l.State != lease.StateTerminal || l.TerminalResult != want || !l.CancelRequested {
			t.Errorf("%s: %s %s cancel requested %v; want TERMINAL %s after a request", l.JobID, l.State, l.TerminalResult, l.CancelRequested, want)
		}
	}
}

func TestUnknownJobsAreAuditedInABoundedLog(t *testing.T) {
	st := openStore(t, t.TempDir())
	defer st.Close()
	c, err := coordinator.New(context.Background(), coordinator.Config{Store: st, Clock: clock.NewManual(t0), Policy: lease.DefaultPolicy(), Log: quiet(), UnknownLogSize: 3})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- c.Run(ctx) }()
	defer func() { cancel(); <-done }()
	for i := range 5 {
		r, err := c.Apply(context.Background(), lease.Renew{Claim: claim("ghost", "L", 1, "w1"), RenewSequence: uint64(i + 1)})
		if err != nil || r.Decision.Event != lease.EventUnknownLease || r.Lease.Exists() {
			t.Fatalf("renew of an unknown job: %s, %+v, %v", r.Decision, r.Lease, err)
		}
	}
	rows, err := c.Evidence(context.Background(), "ghost")
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3 || rows[0].Number != 3 || rows[2].Number != 5 {
		t.Fatalf("unknown-job log holds %d rows (first %d); want the last 3", len(rows), rows[0].Number)
	}
	if _, err := c.Get(context.Background(), "ghost"); !errors.Is(err, coordinator.ErrNotFound) {
		t.Fatalf("get of an unknown job: %v", err)
	}
}

// A crash leaves rows after the job's last record (the record is only a
// checkpoint): loading takes the newest row.
func TestLoadTakesTheRowsAfterTheLastCheckpoint(t *testing.T) {
	dir := t.TempDir()
	inner := openStore(t, dir)
	st := &gatedStore{Store: inner}
	clk := clock.NewManual(t0)
	h := start(t, st, clk, lease.DefaultPolicy())
	h.active("job-1", "w1", time.Minute)
	for seq := uint64(1); seq <= 100; seq++ {
		h.want(lease.Renew{Claim: claim("job-1", "L-job-1", 1, "w1"), RenewSequence: seq}, lease.OutcomeAccepted, lease.EventRenewed)
	}
	before := h.get("job-1")
	// The crash: nothing more reaches the disk, not even the clean stop's
	// checkpoint.
	st.mu.Lock()
	st.fail = errors.New("power cut")
	st.mu.Unlock()
	h.stop()
	inner.Close()

	st2 := openStore(t, dir)
	defer st2.Close()
	h = start(t, st2, clk, lease.DefaultPolicy())
	if got := h.get("job-1"); got != before {
		t.Fatalf("after the crash:\n got %+v\nwant %+v", got, before)
	}
	rows, err := h.c.Evidence(context.Background(), "job-1")
	if err != nil || len(rows) != 102 {
		t.Fatalf("%d rows, %v; want 102", len(rows), err)
	}
	h.want(lease.Renew{Claim: claim("job-1", "L-job-1", 1, "w1"), RenewSequence: 101}, lease.OutcomeAccepted, lease.EventRenewed)
	if r := h.apply(lease.Renew{Claim: claim("job-1", "L-job-1", 1, "w1"), RenewSequence: 102}); r.Row != 104 {
		t.Fatalf("row numbering after the crash: %d, want 104", r.Row)
	}
}

// EvidencePage returns every row exactly once across pages, whatever the
// page size, the same rows Evidence returns in one go; a page deep in the
// history decodes from the anchor before it. The unknown-job log pages
// too.
func TestEvidencePagesMatchTheWholeHistory(t *testing.T) {
	st := openStore(t, t.TempDir())
	defer st.Close()
	clk := clock.NewManual(t0)
	h := start(t, st, clk, lease.DefaultPolicy())
	defer h.stop()
	h.active("long", "w1", time.Minute)
	for seq := range uint64(200) {
		clk.Advance(time.Millisecond)
		h.want(lease.Progress{Claim: claim("long", "L-long", 1, "w1"), ProgressSequence: seq + 1, ProgressValue: fmt.Sprint(seq + 1)}, lease.OutcomeAccepted, lease.EventProgressRecorded)
	}
	ctx := context.Background()
	all, err := h.c.Evidence(ctx, "long")
	if err != nil || len(all) != 202 {
		t.Fatalf("%d rows, %v", len(all), err)
	}
	// Each row names the generation it was judged against: the row
	// before's (none for the first).
	for i, r := range all {
		var prior, priorHolder string
		if i > 0 {
			prior, priorHolder = all[i-1].LeaseID, all[i-1].HolderIdentity
		}
		if r.Names.PriorLeaseID != prior || r.Names.PriorHolder != priorHolder {
			t.Fatalf("row %d: judged against lease %q of %q, want %q of %q", r.Number, r.Names.PriorLeaseID, r.Names.PriorHolder, prior, priorHolder)
		}
	}
	for _, size := range []int{1, 7, 63, 64, 65, 500} {
		var got []coordinator.Row
		cursor := coordinator.EvidenceCursor{}
		for {
			page, err := h.c.EvidencePage(ctx, "long", cursor, size)
			if err != nil {
				t.Fatalf("page size %d after %v: %v", size, cursor, err)
			}
			if len(page.Rows) > size {
				t.Fatalf("page size %d: %d rows", size, len(page.Rows))
			}
			got = append(got, page.Rows...)
			if !page.More {
				break
			}
			cursor = page.Next
		}
		if len(got) != len(all) {
			t.Fatalf("page size %d: %d rows, want %d", size, len(got), len(all))
		}
		for i := range all {
			if got[i].Number != all[i].Number || got[i].EvidenceRow.ProgressValue != all[i].EvidenceRow.ProgressValue || got[i].Reason != all[i].Reason || got[i].Names != all[i].Names {
				t.Fatalf("page size %d: row %d differs:\n got %+v\nwant %+v", size, i+1, got[i], all[i])
			}
		}
	}

	for i := range 3 {
		h.want(lease.Renew{Claim: claim("ghost", "L", 1, "w1"), RenewSequence: uint64(i + 1)}, lease.OutcomeRejected, lease.EventUnknownLease)
	}
	page, err := h.c.EvidencePage(ctx, "ghost", coordinator.EvidenceCursor{}, 2)
	if err != nil || len(page.Rows) != 2 || !page.More || !page.Next.Unknown {
		t.Fatalf("first page of the unknown-job log: %+v, %v", page, err)
	}
	rest, err := h.c.EvidencePage(ctx, "ghost", page.Next, 2)
	if err != nil || len(rest.Rows) != 1 || rest.More || rest.Rows[0].Number != page.Rows[1].Number+1 {
		t.Fatalf("second page of the unknown-job log: %+v, %v", rest, err)
	}
	if _, err := h.c.EvidencePage(ctx, "nobody", coordinator.EvidenceCursor{}, 10); !errors.Is(err, coordinator.ErrNotFound) {
		t.Fatalf("a job with no rows: %v", err)
	}
}

// A coordinator that does not serve (a replica that does not lead, or a
// run that stopped) answers Get from the store: the same durable lease the
// serving run answers — including the decisions written as evidence rows
// after the job's last record — as soon as the serving run acknowledged
// it, and ErrNotFound for a job without a lease.
func TestGetWhereNoRunServesReadsTheStore(t *testing.T) {
	st := openStore(t, t.TempDir())
	defer st.Close()
	clk := clock.NewManual(t0)
	h := start(t, st, clk, lease.DefaultPolicy())
	follower, err := coordinator.New(context.Background(), coordinator.Config{Store: st, Clock: clk, Policy: lease.DefaultPolicy(), Log: quiet(), Shards: 2})
	if err != nil {
		t.Fatal(err)
	}
	followerGet := func(job string) lease.Lease {
		t.Helper()
		l, err := follower.Get(context.Background(), job)
		if err != nil {
			t.Fatalf("Get(%s) where no run serves: %v", job, err)
		}
		return l
	}
	h.active("job-1", "w1", 10*time.Minute)
	h.active("job-2", "w2", 10*time.Minute)
	// Past one checkpoint (a record every 64 rows), so the newest state is
	// in the rows after the record.
	for seq := uint64(1); seq <= 70; seq++ {
		clk.Advance(time.Second)
		r := h.want(lease.Renew{Claim: claim("job-1", "L-job-1", 1, "w1"), RenewSequence: seq}, lease.OutcomeAccepted, lease.EventRenewed)
		if got := followerGet("job-1"); got != r.Lease {
			t.Fatalf("after renew %d the store reads\n %+v\nthe run answered\n %+v", seq, got, r.Lease)
		}
	}
	h.want(lease.Renew{Claim: claim("job-2", "L-job-2", 1, "w9"), RenewSequence: 1}, lease.OutcomeRejected, lease.EventOwnershipConflict)
	for _, job := range []string{"job-1", "job-2"} {
		if got, want := followerGet(job), h.get(job); got != want {
			t.Fatalf("%s: the store reads\n %+v\nthe run answers\n %+v", job, got, want)
		}
	}
	if _, err := follower.Get(context.Background(), "job-none"); !errors.Is(err, coordinator.ErrNotFound) {
		t.Fatalf("Get of a job without a lease where no run serves: %v, want ErrNotFound", err)
	}
	// The run that stopped reads the store too.
	want := h.get("job-1")
	h.stop()
	if got := h.get("job-1"); got != want {
		t.Fatalf("after the run stopped Get answers\n %+v\nwant\n %+v", got, want)
	}
}
