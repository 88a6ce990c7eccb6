package coordinator_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/tetherhq/tether/supervisor/lease"
)

// TestRogue41BAPageOfAHoldersJobsVisitsOnlyItsRange: a holder's finished
// jobs stay under it for ever, and since the fortieth pass a page of them
// copies only its own, but each shard still walked every job the holder
// ever held to find the page's — ListLeases, which any agent may ask
// about itself with a page of one as often as its budget allows; a
// rollout's handover on every pass; a termination's record page by page —
// on the goroutine that judges every tree's jobs on that shard, holding
// up their renewals. A rogue lineage whose child finished 300 jobs had
// each ListLeases of one lease visit all 300, and the record of them in
// pages of 10 visit 9,300. Each shard now keeps a holder's jobs in order
// of id, and a page visits from its start only the jobs it keeps (limit +
// 1 per holder and shard); the pages still list every job once, in order.
func TestRogue41BAPageOfAHoldersJobsVisitsOnlyItsRange(t *testing.T) {
	const (
		finished = 300
		shards   = 3 // start's
	)
	h, jobs := holderWithFinishedJobs(t, "r41b", finished)
	ctx := context.Background()

	walked := 0
	bound := func(what string, holders, limit int, before int64) {
		t.Helper()
		n := h.c.ListWalks() - before
		walked += int(n)
		if want := int64(shards * holders * (limit + 1)); n > want {
			t.Fatalf("%s (a page of %d) visited %d of the holder's %d finished jobs on the shards, want at most %d (limit + 1 per holder and shard)",
				what, limit, n, finished, want)
		}
	}

	// ListLeases of the holder, a page of one, then pages of 50.
	var listed []string
	after := ""
	for page := 0; ; page++ {
		limit := 1
		if page >= 3 {
			limit = 50
		}
		before := h.c.ListWalks()
		ls, next, err := h.c.List(ctx, "w1", after, limit)
		if err != nil {
			t.Fatal(err)
		}
		bound(fmt.Sprintf("List page %d", page), 1, limit, before)
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
	t.Logf("List's pages visited %d jobs", walked)

	// A page from the middle of the holder's jobs.
	before := h.c.ListWalks()
	ls, _, err := h.c.List(ctx, "w1", jobs[149], 1)
	if err != nil || len(ls) != 1 || ls[0].JobID != jobs[150] {
		t.Fatalf("List after %s: %d leases (%v), want %s", jobs[149], len(ls), err, jobs[150])
	}
	bound("List from the middle", 1, 1, before)

	// A rollout's handover lists the batch's members' leases.
	before = h.c.ListWalks()
	ls, _, err = h.c.ListHeldBy(ctx, []string{"w1", "w2"}, "", 1)
	if err != nil || len(ls) != 1 || ls[0].JobID != jobs[0] {
		t.Fatalf("ListHeldBy's first page: %d leases (%v), want %s", len(ls), err, jobs[0])
	}
	bound("ListHeldBy", 2, 1, before)

	// A termination's record of the holder's jobs, in pages of 10.
	listed, after, walked = nil, "", 0
	for {
		before := h.c.ListWalks()
		ls, more, err := h.c.FinalizeHeldByPage(ctx, []string{"w1"}, "stopped", after, 10)
		if err != nil {
			t.Fatal(err)
		}
		bound("FinalizeHeldByPage", 1, 10, before)
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
	t.Logf("the record's pages visited %d jobs", walked)
}
