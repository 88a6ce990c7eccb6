package coordinator_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/tetherhq/tether/supervisor/lease"
)

// TestRogue42BAStopsCancelVisitsOnlyTheHoldersOpenJobs: a termination asks
// its members to cancel their open leases (CancelHeldBy, once per chunk of
// members), and did so by listing every job each member ever held —
// finished ones stay under their holder for ever — in one walk per shard
// (no page), on the goroutine that judges every tree's jobs on that shard,
// then sending each listed job through its shard again to find it
// terminal. A rogue lineage that had its child finish 300 jobs made the
// stop of that child walk all 300 and judge 300 jobs for the two it still
// held open. The shards now keep, beside the index of every job by the
// holder of its judged lease, one of the open ones only, and a stop's
// cancel walks that: it visits and sends the holders' open jobs, and still
// asks each of them to cancel (and nobody else's).
func TestRogue42BAStopsCancelVisitsOnlyTheHoldersOpenJobs(t *testing.T) {
	const finished = 300
	h, _ := holderWithFinishedJobs(t, "r42b", finished)
	// Two jobs w1 still holds: one active, one only offered.
	h.active("r42b-open-active", "w1", 5*time.Minute)
	h.want(lease.Offer{JobID: "r42b-open-offered", LeaseID: "L-r42b-open-offered", HolderIdentity: "w1", LeaseDuration: 5 * time.Minute},
		lease.OutcomeAccepted, lease.EventOffered)
	open := []string{"r42b-open-active", "r42b-open-offered"}

	walks, copies := h.c.ListWalks(), h.c.ListCopies()
	if err := h.c.CancelHeldBy(context.Background(), []string{"w1"}, "terminated by operator:test: stopped"); err != nil {
		t.Fatal(err)
	}
	walked, listed := h.c.ListWalks()-walks, h.c.ListCopies()-copies
	t.Logf("CancelHeldBy visited %d jobs on the shards and listed %d for judgement (w1 finished %d, holds %d open)",
		walked, listed, finished, len(open))
	if walked > int64(len(open)) || listed > int64(len(open)) {
		t.Fatalf("a stop's cancel of a holder with %d open leases visited %d of its jobs and listed %d, want at most %d each: its %d finished jobs are not the stop's work",
			len(open), walked, listed, len(open), finished)
	}
	for _, job := range open {
		if l := h.get(job); !l.CancelRequested {
			t.Fatalf("job %s, open under w1, has no cancel request after the stop's cancel", job)
		}
	}
	if l := h.get("s-other"); l.CancelRequested {
		t.Fatal("w2's job was asked to cancel by w1's stop")
	}

	// The record still lists every job w1 held, finished and open alike.
	all, _, err := h.c.FinalizeHeldByPage(context.Background(), []string{"w1"}, "stopped", "", 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range all {
		got = append(got, l.JobID)
	}
	if len(got) != finished+len(open) || !slices.Contains(got, open[0]) || !slices.Contains(got, open[1]) {
		t.Fatalf("the record lists %d jobs, want w1's %d finished and %d open", len(got), finished, len(open))
	}
}
