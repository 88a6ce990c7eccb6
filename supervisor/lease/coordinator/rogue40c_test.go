package coordinator_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/supervisor/lease"
)

// TestRogue40CAHoldersFinishedJobsDoNotMakeEachPageCopyThemAll: a
// holder's finished jobs stay under it for ever (the record and the
// evidence keep them), and every listing of its leases — ListLeases, which
// any agent may ask about itself with a page of one, as often as its
// budget allows; a rollout's handover; a termination's record, page by page
// — had each shard copy every one of them after the page's start (a lease
// is 576 bytes) and sort them all, on the goroutine that judges every
// tree's jobs on that shard, to answer a page. A rogue lineage whose child
// finished 300 jobs had one ListLeases of one lease copy 300 leases, and a
// record of the child's jobs in pages of 10 copy and sort its job ids
// 4,650 times over. A shard now keeps only the page's first jobs as it
// walks the holder's (limit + 1 of them, what the merge needs), so a page
// copies at most that many per shard, and the pages still list every job
// once, in order.
func TestRogue40CAHoldersFinishedJobsDoNotMakeEachPageCopyThemAll(t *testing.T) {
	const (
		finished = 300
		shards   = 3 // start's
	)
	h, jobs := holderWithFinishedJobs(t, "r40c", finished)
	pageThroughHoldersJobs(t, h, jobs, func(what string, _, limit int, page func()) {
		t.Helper()
		before := h.c.ListCopies()
		page()
		if copies := h.c.ListCopies() - before; copies > int64(shards*(limit+1)) {
			t.Fatalf("%s (a page of %d) copied %d of the holder's %d finished jobs on the shards, want at most %d (limit + 1 per shard)",
				what, limit, copies, finished, shards*(limit+1))
		}
	})
}

// pageThroughHoldersJobs reads holder w1's jobs (holderWithFinishedJobs)
// every way a page of them is asked for — ListLeases' pages of one, then
// of 50; a rollout handover's first page of w1's and w2's (ListHeldBy);
// a termination record's pages of 10 (FinalizeHeldByPage) — checks that
// the List and the record pages each list every job once, in order, and
// has measure run each page: what it is, how many holders it names, its
// limit.
func pageThroughHoldersJobs(t *testing.T, h *harness, jobs []string, measure func(what string, holders, limit int, page func())) {
	t.Helper()
	ctx := context.Background()
	var listed []string
	after := ""
	for page := 0; ; page++ {
		limit := 1
		if page >= 3 {
			limit = 50
		}
		var ls []lease.Lease
		var next string
		measure(fmt.Sprintf("List page %d", page), 1, limit, func() {
			var err error
			if ls, next, err = h.c.List(ctx, "w1", after, limit); err != nil {
				t.Fatal(err)
			}
		})
		for _, l := range ls {
			listed = append(listed, l.JobID)
		}
		if next == "" {
			break
		}
		after = next
	}
	if !slices.Equal(listed, jobs) {
		t.Fatalf("List's pages list %d jobs %v…, want the holder's %d in order", len(listed), listed[:min(5, len(listed))], len(jobs))
	}

	measure("ListHeldBy", 2, 1, func() {
		ls, _, err := h.c.ListHeldBy(ctx, []string{"w1", "w2"}, "", 1)
		if err != nil || len(ls) != 1 || ls[0].JobID != jobs[0] {
			t.Fatalf("ListHeldBy's first page: %d leases (%v), want %s", len(ls), err, jobs[0])
		}
	})

	listed, after = nil, ""
	for {
		var ls []lease.Lease
		var more bool
		measure("FinalizeHeldByPage", 1, 10, func() {
			var err error
			if ls, more, err = h.c.FinalizeHeldByPage(ctx, []string{"w1"}, "stopped", after, 10); err != nil {
				t.Fatal(err)
			}
		})
		for _, l := range ls {
			if l.TerminalResult != lease.ResultSuccess {
				t.Fatalf("job %s finished SUCCESS is %s after the record", l.JobID, l.TerminalResult)
			}
			listed = append(listed, l.JobID)
		}
		if !more {
			break
		}
		after = ls[len(ls)-1].JobID
	}
	if !slices.Equal(listed, jobs) {
		t.Fatalf("the record's pages list %d jobs, want the holder's %d in order", len(listed), len(jobs))
	}
}

// holderWithFinishedJobs starts a coordinator (Badger on disk, 3 shards)
// whose holder w1 finished n jobs named prefix-NNN, begun out of order of
// id, beside one active job of another holder (w2), and returns it with
// w1's job ids in order.
func holderWithFinishedJobs(t *testing.T, prefix string, n int) (*harness, []string) {
	t.Helper()
	st := openStore(t, t.TempDir())
	t.Cleanup(func() { st.Close() })
	h := start(t, st, clock.NewManual(t0), lease.DefaultPolicy())
	var jobs []string
	for i := range n {
		job := fmt.Sprintf("%s-%03d", prefix, (i*37)%n) // not in order of id
		h.active(job, "w1", 5*time.Minute)
		h.want(lease.Complete{Claim: claim(job, "L-"+job, 1, "w1"), Result: lease.ResultSuccess}, lease.OutcomeAccepted, lease.EventTerminalAccepted)
		jobs = append(jobs, job)
	}
	h.active("s-other", "w2", 5*time.Minute)
	slices.Sort(jobs)
	return h, jobs
}
