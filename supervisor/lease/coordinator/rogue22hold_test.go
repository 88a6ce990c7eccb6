package coordinator_test

import (
	"context"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/supervisor/lease"
	"github.com/tetherhq/tether/supervisor/lease/coordinator"
)

// TestAShardHoldsItsNextCommitForTheCallersItAnswered: a shard handed its
// next batch to the committer the moment its commit came back, before it
// answered that commit's callers; callers renewing in a closed loop came
// back just after, and waited a whole commit for the next. So the callers
// split between two batches taking turns, each commit carrying part of
// them. A shard now holds its next commit, up to the last commit's time
// (at most 2 ms; here Config.Hold, long, so that the count does not hang
// on timing), until as many messages as it answered have come. On Badger,
// eight closed-loop renewers on one shard, one answered by a commit and
// seven by the next: their second renews go in one commit (before: the one
// alone, then the seven, 3 store Updates after the first where it now
// takes 2).
func TestAShardHoldsItsNextCommitForTheCallersItAnswered(t *testing.T) {
	st := &gatedStore{Store: openStore(t, t.TempDir())}
	defer st.Store.Close()
	clk := clock.NewManual(t0)
	c, err := coordinator.New(context.Background(), coordinator.Config{
		Store: st, Clock: clk, Policy: lease.DefaultPolicy(), Log: quiet(), MaxWait: time.Millisecond,
		Shards: 1, Hold: time.Minute,
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

	const callers = 8
	jobs := make([]string, callers)
	for i := range jobs {
		jobs[i] = "job-" + string(rune('a'+i))
		h.active(jobs[i], "w1", time.Minute)
	}
	type answer struct {
		job int
		r   coordinator.Result
		err error
	}
	answers := make(chan answer, 2*callers)
	renew := func(i int, seq uint64) {
		c.Submit(lease.Renew{Claim: claim(jobs[i], "L-"+jobs[i], 1, "w1"), RenewSequence: seq}, nil, func(r coordinator.Result, err error) {
			answers <- answer{i, r, err}
		})
	}
	st.hold()
	t.Cleanup(st.release)
	renew(0, 1)
	<-st.entered // the first caller's commit is in flight
	judged := make(chan struct{}, callers)
	for i := 1; i < callers; i++ {
		i := i
		c.Submit(lease.Renew{Claim: claim(jobs[i], "L-"+jobs[i], 1, "w1"), RenewSequence: 1}, func(lease.Lease) error {
			judged <- struct{}{}
			return nil
		}, func(r coordinator.Result, err error) { answers <- answer{i, r, err} })
	}
	for i := 1; i < callers; i++ {
		<-judged // the other seven wait in the next batch
	}
	before := st.updates.Load()
	st.release()
	// Each caller renews again as soon as it is answered (the first while
	// the seven's commit is in flight), then stops.
	for range 2 * callers {
		a := <-answers
		if a.err != nil || a.r.Decision.Outcome != lease.OutcomeAccepted {
			t.Fatalf("renew of %s: %s, %v", jobs[a.job], a.r.Decision, a.err)
		}
		if a.r.Lease.RenewSequence == 1 {
			renew(a.job, 2)
		}
	}
	// After the first commit (in flight): the seven's, then the eight's
	// second renews together.
	if got := st.updates.Load() - before; got != 2 {
		t.Errorf("two renews of eight callers took %d store Updates after the first, want 2 (the eight's second renews in one)", got)
	}
}
