package coordinator_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	"github.com/tetherhq/tether/supervisor/lease"
	"github.com/tetherhq/tether/supervisor/lease/coordinator"
)

// listJobs is List(holder, after, limit) as job ids, and its next token.
func listJobs(t *testing.T, c *coordinator.Coordinator, holder, after string, limit int) ([]string, string) {
	t.Helper()
	ls, next, err := c.List(context.Background(), holder, after, limit)
	if err != nil {
		t.Fatalf("list %q after %q: %v", holder, after, err)
	}
	jobs := make([]string, len(ls))
	for i, l := range ls {
		if holder != "" && l.HolderIdentity != holder {
			t.Fatalf("list %q: job %s is held by %q", holder, l.JobID, l.HolderIdentity)
		}
		jobs[i] = l.JobID
	}
	return jobs, next
}

// TestListByHolderFollowsTheJobsHolders: a holder's listing reads the
// shards' index of the durable leases by holder, not every job: it follows
// offers, a reassignment to another holder, a terminal result (a terminal
// lease still lists), pages, and a restart (the index is rebuilt from the
// store).
func TestListByHolderFollowsTheJobsHolders(t *testing.T) {
	dir := t.TempDir()
	st := openStore(t, dir)
	clk := clock.NewManual(t0)
	h := start(t, st, clk, lease.DefaultPolicy())
	var w1, w2 []string
	for i := range 12 {
		job := fmt.Sprintf("w1-job-%02d", i)
		h.active(job, "w1", 5*time.Minute)
		w1 = append(w1, job)
	}
	for i := range 5 {
		job := fmt.Sprintf("w2-job-%02d", i)
		h.active(job, "w2", 5*time.Minute)
		w2 = append(w2, job)
	}
	// w1-job-00 moves to w2; w1-job-01 ends (still w1's, terminal).
	h.want(lease.Reassign{JobID: "w1-job-00", LeaseID: "L2-w1-job-00", HolderIdentity: "w2", LeaseDuration: 5 * time.Minute, Reason: "moved"}, lease.OutcomeAccepted, lease.EventReassigned)
	h.want(lease.Complete{Claim: claim("w1-job-01", "L-w1-job-01", 1, "w1"), Result: lease.ResultSuccess}, lease.OutcomeAccepted, lease.EventTerminalAccepted)
	w1 = w1[1:]
	w2 = append([]string{"w1-job-00"}, w2...)

	check := func(when string) {
		t.Helper()
		if got, _ := listJobs(t, h.c, "w1", "", 0); !slices.Equal(got, w1) {
			t.Fatalf("%s: w1 lists %v, want %v", when, got, w1)
		}
		if got, _ := listJobs(t, h.c, "w2", "", 0); !slices.Equal(got, w2) {
			t.Fatalf("%s: w2 lists %v, want %v", when, got, w2)
		}
		if got, _ := listJobs(t, h.c, "nobody", "", 0); len(got) != 0 {
			t.Fatalf("%s: a holder of nothing lists %v", when, got)
		}
		if got, _ := listJobs(t, h.c, "", "", 0); len(got) != len(w1)+len(w2) {
			t.Fatalf("%s: the whole listing has %d leases, want %d", when, len(got), len(w1)+len(w2))
		}
		// Pages of 5: each page is the next 5 of w1's jobs in order.
		var paged []string
		after := ""
		for {
			page, next := listJobs(t, h.c, "w1", after, 5)
			paged = append(paged, page...)
			if next == "" {
				break
			}
			after = next
		}
		if !slices.Equal(paged, w1) {
			t.Fatalf("%s: w1 paged lists %v, want %v", when, paged, w1)
		}
	}
	check("serving")
	h.stop()
	h = start(t, st, clk, lease.DefaultPolicy())
	check("after a restart")
}

// BenchmarkListByHolder: one holder lists its 3 leases among n jobs of
// others (ListLeases as an agent asks it about itself). Before the holder
// index each call walked every job of every shard on the shards' own
// goroutines.
func BenchmarkListByHolder(b *testing.B) {
	for _, n := range []int{1000, 20000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			st, err := badgerstore.OpenBadger(b.TempDir(), badgerstore.BadgerOptions{Logger: quiet()})
			if err != nil {
				b.Fatal(err)
			}
			c, err := coordinator.New(context.Background(), coordinator.Config{
				Store: st, Clock: clock.NewManual(t0), Policy: lease.DefaultPolicy(), Log: quiet(), MaxWait: time.Millisecond, Shards: 3,
			})
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- c.Run(ctx) }()
			defer func() { cancel(); <-done; _ = st.Close() }()
			for serving, changed := c.Serving(); !serving; serving, changed = c.Serving() {
				<-changed
			}
			errs := make(chan error, n+3)
			offer := func(job, holder string) {
				c.Submit(lease.Offer{JobID: job, LeaseID: "L-" + job, HolderIdentity: holder, LeaseDuration: 5 * time.Minute}, nil,
					func(_ coordinator.Result, err error) { errs <- err })
			}
			for i := range n {
				offer(fmt.Sprintf("other-%06d", i), fmt.Sprintf("other-holder-%03d", i%500))
			}
			for i := range 3 {
				offer(fmt.Sprintf("mine-%d", i), "me")
			}
			for range n + 3 {
				if err := <-errs; err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			for range b.N {
				ls, _, err := c.List(ctx, "me", "", 100)
				if err != nil || len(ls) != 3 {
					b.Fatalf("list: %d leases, %v", len(ls), err)
				}
			}
		})
	}
}

// TestCancelHeldByFollowsTheJudgedHolders: a termination's cancel and
// finalize of its nodes' leases read the shards' index of jobs by the
// holder of their judged lease, not every job: a job reassigned away is
// no longer its old holder's, even before the reassignment is durable
// (the messages reach the shard in order), an offer judged just before is
// its holder's, a terminal lease is still its holder's (the record lists
// it), and a restart rebuilds the index from the store.
func TestCancelHeldByFollowsTheJudgedHolders(t *testing.T) {
	dir := t.TempDir()
	st := openStore(t, dir)
	clk := clock.NewManual(t0)
	h := start(t, st, clk, lease.DefaultPolicy())
	ctx := context.Background()
	for i := range 6 {
		h.active(fmt.Sprintf("w1-job-%d", i), "w1", 5*time.Minute)
		h.active(fmt.Sprintf("w2-job-%d", i), "w2", 5*time.Minute)
	}
	h.want(lease.Complete{Claim: claim("w1-job-5", "L-w1-job-5", 1, "w1"), Result: lease.ResultSuccess}, lease.OutcomeAccepted, lease.EventTerminalAccepted)
	// Sent without waiting: each is judged before the cancel that follows.
	errs := make(chan error, 2)
	answer := func(_ coordinator.Result, err error) { errs <- err }
	h.c.Submit(lease.Reassign{JobID: "w1-job-0", LeaseID: "L2-w1-job-0", HolderIdentity: "w2", LeaseDuration: 5 * time.Minute, Reason: "moved"}, nil, answer)
	h.c.Submit(lease.Offer{JobID: "w1-job-new", LeaseID: "L-w1-job-new", HolderIdentity: "w1", LeaseDuration: 5 * time.Minute}, nil, answer)
	if err := h.c.CancelHeldBy(ctx, []string{"w1"}, "terminated"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	check := func(when string) {
		t.Helper()
		for _, job := range []string{"w1-job-1", "w1-job-2", "w1-job-3", "w1-job-4", "w1-job-new"} {
			if !h.get(job).CancelRequested {
				t.Errorf("%s: %s, w1's, has no cancel request", when, job)
			}
		}
		for _, job := range []string{"w1-job-0", "w2-job-0", "w2-job-5", "w1-job-5"} {
			if h.get(job).CancelRequested {
				t.Errorf("%s: %s got a cancel request (not w1's, or terminal)", when, job)
			}
		}
	}
	check("serving")
	h.stop()
	h = start(t, st, clk, lease.DefaultPolicy())
	check("after a restart")
	got, err := h.c.FinalizeHeldBy(ctx, []string{"w1", "nobody"}, "terminated")
	if err != nil {
		t.Fatal(err)
	}
	var jobs []string
	for _, l := range got {
		jobs = append(jobs, l.JobID)
	}
	if want := []string{"w1-job-1", "w1-job-2", "w1-job-3", "w1-job-4", "w1-job-5", "w1-job-new"}; !slices.Equal(jobs, want) {
		t.Fatalf("w1's finalisation reports %v, want %v (its terminal lease included)", jobs, want)
	}
	if got, err := h.c.FinalizeHeldBy(ctx, []string{"w2"}, "terminated"); err != nil || len(got) != 7 {
		t.Fatalf("w2's finalisation reports %d leases (%v), want its 6 and the one moved to it", len(got), err)
	}
}

// BenchmarkCancelHeldBy: a termination's cancel of one node's 3 leases
// among n jobs of others (the cancels already requested, so each call is
// the lookup and a judgement that writes nothing). Before the index of
// judged holders every call walked every job of every shard on the
// shards' own goroutines, terminal ones included.
func BenchmarkCancelHeldBy(b *testing.B) {
	for _, n := range []int{1000, 20000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			st, err := badgerstore.OpenBadger(b.TempDir(), badgerstore.BadgerOptions{Logger: quiet()})
			if err != nil {
				b.Fatal(err)
			}
			c, err := coordinator.New(context.Background(), coordinator.Config{
				Store: st, Clock: clock.NewManual(t0), Policy: lease.DefaultPolicy(), Log: quiet(), MaxWait: time.Millisecond, Shards: 3,
			})
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- c.Run(ctx) }()
			defer func() { cancel(); <-done; _ = st.Close() }()
			for serving, changed := c.Serving(); !serving; serving, changed = c.Serving() {
				<-changed
			}
			errs := make(chan error, n+3)
			offer := func(job, holder string) {
				c.Submit(lease.Offer{JobID: job, LeaseID: "L-" + job, HolderIdentity: holder, LeaseDuration: 5 * time.Minute}, nil,
					func(_ coordinator.Result, err error) { errs <- err })
			}
			for i := range n {
				offer(fmt.Sprintf("other-%06d", i), fmt.Sprintf("other-holder-%03d", i%500))
			}
			for i := range 3 {
				offer(fmt.Sprintf("mine-%d", i), "me")
			}
			for range n + 3 {
				if err := <-errs; err != nil {
					b.Fatal(err)
				}
			}
			if err := c.CancelHeldBy(ctx, []string{"me"}, "stopped"); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for range b.N {
				if err := c.CancelHeldBy(ctx, []string{"me"}, "stopped"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
