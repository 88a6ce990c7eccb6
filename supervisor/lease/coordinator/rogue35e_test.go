package coordinator_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/lease"
	"github.com/tetherhq/tether/supervisor/lease/coordinator"
)

// stoppingHolders is a Config.HolderUnavailable over a set the test
// fills, counting what it was asked.
type stoppingHolders struct {
	mu       sync.Mutex
	stopping map[string]string
	asked    map[string]int
}

func (s *stoppingHolders) unavailable(_ context.Context, holder string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.asked[holder]++
	return s.stopping[holder]
}

func (s *stoppingHolders) times(holder string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.asked[holder]
}

// startHolders starts a coordinator whose automatic reassignments ask
// holders about the holder they would go to.
func startHolders(t *testing.T, st store.Store, clk *clock.Manual, p lease.Policy, holders *stoppingHolders) *harness {
	t.Helper()
	c, err := coordinator.New(context.Background(), coordinator.Config{
		Store: st, Clock: clk, Policy: p, Log: quiet(), MaxWait: time.Millisecond, Shards: 3,
		HolderUnavailable: holders.unavailable,
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

// A holder being stopped lets its offer's ACK deadline pass under the
// ack-miss policy reassign. The shard offered it generation + 1 without
// reading anything of it, up to the policy's maximum times: a stopping
// holder kept being handed a job it could not take. The shard now asks
// (Config.HolderUnavailable) and withholds the automatic reassignment:
// the job stays EXPIRED, generation 1, as the policy expire leaves it,
// through the holder's late messages and a restart, and the shard asked
// once — the holder's messages after the miss read nothing on the shard.
// A holder that can take work is reassigned as before.
func TestRogue35EAStoppingHolderIsNotOfferedAnAutomaticReassignment(t *testing.T) {
	dir := t.TempDir()
	st := openStore(t, dir)
	clk := clock.NewManual(t0)
	p := lease.DefaultPolicy()
	p.AckMiss = lease.AckMissReassign
	holders := &stoppingHolders{stopping: map[string]string{"rogue": "agent rogue is draining"}, asked: map[string]int{}}
	h := startHolders(t, st, clk, p, holders)
	h.want(lease.Offer{JobID: "stopping", LeaseID: "L1", HolderIdentity: "rogue", LeaseDuration: 30 * time.Second},
		lease.OutcomeAccepted, lease.EventOffered)
	h.want(lease.Offer{JobID: "running", LeaseID: "L2", HolderIdentity: "w2", LeaseDuration: 30 * time.Second},
		lease.OutcomeAccepted, lease.EventOffered)
	clk.Advance(p.DefaultAckTimeout)
	waitFor(t, "the running holder's automatic reassignment", func() bool { return h.get("running").Generation == 2 })
	waitFor(t, "the stopping holder's missed ACK", func() bool {
		l := h.get("stopping")
		return l.State == lease.StateExpired || l.Generation > 1
	})

	// The rogue's late messages about generation 1.
	for range 3 {
		h.want(lease.Ack{Claim: claim("stopping", "L1", 1, "rogue")}, lease.OutcomeRejected, lease.EventAckDeadlineMissed)
	}
	check := func(when string) {
		t.Helper()
		l := h.get("stopping")
		if l.State != lease.StateExpired || l.Generation != 1 || l.HolderIdentity != "rogue" || l.AutoReassigns != 0 {
			t.Fatalf("%s: %s gen %d holder %q (automatic %d), want EXPIRED gen 1, never reassigned automatically",
				when, l.State, l.Generation, l.HolderIdentity, l.AutoReassigns)
		}
		rows, err := h.c.Evidence(context.Background(), "stopping")
		if err != nil {
			t.Fatal(err)
		}
		withheld := 0
		for _, r := range rows {
			if r.Message != lease.KindReassign {
				continue
			}
			if r.Decision.Outcome != lease.OutcomeRejected || !strings.Contains(r.Reason, `withheld: holder "rogue" cannot take work ("agent rogue is draining")`) {
				t.Fatalf("%s: reassignment row %s %q, want the one withheld", when, r.Decision, r.Reason)
			}
			withheld++
		}
		if withheld != 1 || holders.times("rogue") != 1 {
			t.Fatalf("%s: %d withheld rows, the holder's state read %d times; want one of each, at the missed ACK", when, withheld, holders.times("rogue"))
		}
	}
	check("after the missed ACK")
	if l := h.get("running"); l.HolderIdentity != "w2" || l.State != lease.StateOffered || l.AutoReassigns != 1 {
		t.Fatalf("the running holder's job: %s holder %q (automatic %d), want OFFERED to w2, reassigned automatically once", l.State, l.HolderIdentity, l.AutoReassigns)
	}

	h.stop()
	st.Close()
	st = openStore(t, dir)
	defer st.Close()
	h = startHolders(t, st, clk, p, holders)
	clk.Advance(time.Minute)
	h.want(lease.Ack{Claim: claim("stopping", "L1", 1, "rogue")}, lease.OutcomeRejected, lease.EventAckDeadlineMissed)
	check("after a restart")
}

// A rogue lineage offers a child being stopped many jobs at once, and the
// child lets every ACK deadline pass together: each missed ACK asked for
// the holder's node, a store read (a round trip on etcd) on the goroutine
// that judges every job of the shard, so one holder's silence held up the
// other agents' renewals there for as many reads as it had jobs. A shard
// now asks once per holder per batch.
func TestRogue35EManyMissedAcksOfOneHolderReadItOnceABatch(t *testing.T) {
	st := openStore(t, t.TempDir())
	defer st.Close()
	clk := clock.NewManual(t0)
	p := lease.DefaultPolicy()
	p.AckMiss = lease.AckMissReassign
	holders := &stoppingHolders{stopping: map[string]string{"rogue": "agent rogue is aborting"}, asked: map[string]int{}}
	h := startHolders(t, st, clk, p, holders)
	const jobs = 40
	for i := range jobs {
		job := fmt.Sprintf("job-%d", i)
		h.want(lease.Offer{JobID: job, LeaseID: "L-" + job, HolderIdentity: "rogue", LeaseDuration: 30 * time.Second},
			lease.OutcomeAccepted, lease.EventOffered)
	}
	clk.Advance(p.DefaultAckTimeout)
	waitFor(t, "every missed ACK", func() bool {
		for i := range jobs {
			if l := h.get(fmt.Sprintf("job-%d", i)); l.State == lease.StateOffered && l.Generation == 1 {
				return false
			}
		}
		return true
	})
	// Three shards, each judging its jobs' ticks in one batch.
	if n := holders.times("rogue"); n > 3 {
		t.Fatalf("the holder's node was read %d times for %d missed ACKs on 3 shards; want at most once a shard's batch", n, jobs)
	}
}
