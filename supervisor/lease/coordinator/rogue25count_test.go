package coordinator_test

import (
	"context"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/supervisor/lease"
)

// TestRogue25ReviewCountingAHoldersLeasesDoesNotReadThem: a stop rule over
// observed.leases_held asks CountHeldBy on every evaluation of the node —
// each tool call it begins or ends, each counter it reports — and each
// shard answered on its own goroutine, the one that judges every tree's
// leases, by reading every lease the holder ever held: the finished ones
// stay under it, so a worker that had finished 300 jobs cost 300 reads per
// tool call however few it held. The shards keep the count by holder and
// state as leases change; a count reads those, and agrees with a listing
// through offers, acks, a reassignment, finished jobs and a restart.
func TestRogue25ReviewCountingAHoldersLeasesDoesNotReadThem(t *testing.T) {
	dir := t.TempDir()
	st := openStore(t, dir)
	clk := clock.NewManual(t0)
	h := start(t, st, clk, lease.DefaultPolicy())
	const finished = 300
	for i := range finished + 5 {
		job := fmt.Sprintf("job-%03d", i)
		h.active(job, "w1", 5*time.Minute)
		if i < finished {
			h.want(lease.Complete{Claim: claim(job, "L-"+job, 1, "w1"), Result: lease.ResultSuccess}, lease.OutcomeAccepted, lease.EventTerminalAccepted)
		}
	}
	h.want(lease.Offer{JobID: "offered", LeaseID: "L-offered", HolderIdentity: "w1", LeaseDuration: time.Minute}, lease.OutcomeAccepted, lease.EventOffered)
	h.want(lease.Reassign{JobID: fmt.Sprintf("job-%03d", finished), LeaseID: "L2", HolderIdentity: "w2", LeaseDuration: time.Minute, Reason: "moved"}, lease.OutcomeAccepted, lease.EventReassigned)

	check := func(when string) {
		t.Helper()
		for _, holder := range []string{"w1", "w2", "nobody"} {
			ls, _, err := h.c.List(context.Background(), holder, "", 0)
			if err != nil {
				t.Fatal(err)
			}
			want := map[lease.State]int{}
			for _, l := range ls {
				want[l.State]++
			}
			before := h.c.CountReads()
			got, err := h.c.CountHeldBy(context.Background(), holder)
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(got, want) {
				t.Fatalf("%s: %s counts %v, its listing %v", when, holder, got, want)
			}
			// At most one read per state, per shard (3).
			if reads := h.c.CountReads() - before; reads > 3*int64(lease.StateTerminal) {
				t.Fatalf("%s: counting %s's leases (%d finished among them) read %d entries, want at most %d: its counts by state, not its leases",
					when, holder, finished, reads, 3*lease.StateTerminal)
			}
		}
	}
	check("serving")
	h.stop()
	h = start(t, st, clk, lease.DefaultPolicy())
	check("after a restart")
}
