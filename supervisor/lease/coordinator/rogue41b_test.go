package coordinator_test

import (
	"context"
	"strings"
	"testing"
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
	walked := map[string]int64{} // by what the pages were: List, the record
	measure := func(what string, holders, limit int, page func()) {
		t.Helper()
		before := h.c.ListWalks()
		page()
		n := h.c.ListWalks() - before
		walked[strings.Fields(what)[0]] += n
		if want := int64(shards * holders * (limit + 1)); n > want {
			t.Fatalf("%s (a page of %d) visited %d of the holder's %d finished jobs on the shards, want at most %d (limit + 1 per holder and shard)",
				what, limit, n, finished, want)
		}
	}

	// A page from the middle of the holder's jobs.
	measure("List from the middle", 1, 1, func() {
		ls, _, err := h.c.List(context.Background(), "w1", jobs[149], 1)
		if err != nil || len(ls) != 1 || ls[0].JobID != jobs[150] {
			t.Fatalf("List after %s: %d leases (%v), want %s", jobs[149], len(ls), err, jobs[150])
		}
	})
	walked["List"] = 0
	pageThroughHoldersJobs(t, h, jobs, measure)
	t.Logf("List's pages visited %d jobs, the record's %d", walked["List"], walked["FinalizeHeldByPage"])
}
