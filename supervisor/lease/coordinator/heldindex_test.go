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
