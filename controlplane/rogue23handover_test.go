package controlplane

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	"github.com/tetherhq/tether/supervisor"
	"github.com/tetherhq/tether/supervisor/lease"
	"github.com/tetherhq/tether/supervisor/lease/coordinator"
)

// allocated is how many bytes the process allocated while f ran.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// leastAllocated is the least of three counts of allocated(f), for an f
// that reads: the count is the whole process's, and another test's
// goroutines still winding down (a store's compactions, a server's
// shutdown) allocate into one count now and then, hardly into all three.
func leastAllocated(f func()) uint64 {
	least := allocated(f)
	for range 2 {
		least = min(least, allocated(f))
	}
	return least
}

// TestRogue23ARolloutsHandoverReadsOnlyItsMembersLeases: a rollout's
// lease handover (Open, read by the rollout's reconciler on every pass for
// every replaced batch, and HeldBy, read for each page of a batch's
// record) listed every lease the coordinator holds — every tree's, terminal
// ones included — and kept its members': the shards, the goroutines that
// judge renewals, copied out each of them each time. Any lineage can pile
// up terminal leases (they are bounded only by the offers its rate budget
// buys), and each rollout then paid for all of them, on every pass. The
// handover now reads the members' leases from the shards' index of durable
// leases by holder. Here 4,000 leases of other agents and one of the
// batch's member: the handover allocated some 8 MB per read (both reads);
// now a few KB.
func TestRogue23ARolloutsHandoverReadsOnlyItsMembersLeases(t *testing.T) {
	st, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	c, err := coordinator.New(context.Background(), coordinator.Config{
		Store: st, Clock: clock.NewManual(time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)), Policy: lease.DefaultPolicy(),
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Shards: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- c.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	for serving, changed := c.Serving(); !serving; serving, changed = c.Serving() {
		select {
		case <-changed:
		case <-time.After(10 * time.Second):
			t.Fatal("the coordinator did not start serving")
		}
	}

	const others = 4000
	offered := make(chan error, others+1)
	offer := func(job, holder string) {
		c.Submit(lease.Offer{JobID: job, LeaseID: "L-" + job, HolderIdentity: holder, LeaseDuration: time.Minute}, nil,
			func(r coordinator.Result, err error) {
				if err == nil && r.Decision.Outcome != lease.OutcomeAccepted {
					err = fmt.Errorf("offer of %s: %s", job, r.Decision)
				}
				offered <- err
			})
	}
	for i := range others {
		offer(fmt.Sprintf("other-%05d", i), fmt.Sprintf("n_other%d", i%50))
	}
	offer("members-job", "n_member")
	for range others + 1 {
		if err := <-offered; err != nil {
			t.Fatal(err)
		}
	}

	h := leaseHandover{leases: c}
	members := []string{"n_member"}
	var open []supervisor.HandoverLease
	openBytes := leastAllocated(func() {
		if open, _, err = h.Open(context.Background(), members); err != nil {
			t.Fatal(err)
		}
	})
	if len(open) != 1 || open[0].JobID != "members-job" {
		t.Fatalf("the handover found %d open leases (%v), want the member's one", len(open), open)
	}
	var page []supervisor.RecordLease
	var more bool
	pageBytes := leastAllocated(func() {
		if page, more, err = h.HeldBy(context.Background(), members, supervisor.LeasePage{Limit: 256}); err != nil {
			t.Fatal(err)
		}
	})
	if len(page) != 1 || more || page[0].JobID != "members-job" {
		t.Fatalf("the record's page holds %d leases (more: %v), want the member's one", len(page), more)
	}
	t.Logf("one member's lease beside %d others: Open allocated %d bytes, HeldBy %d", others, openBytes, pageBytes)
	const most = 2 << 20
	if openBytes > most || pageBytes > most {
		t.Fatalf("reading one member's lease beside %d others allocated %d bytes (Open) and %d (HeldBy); want at most %d each: the handover reads its members' leases, not every lease",
			others, openBytes, pageBytes, most)
	}
}
