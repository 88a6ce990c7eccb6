package crash

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"pgregory.net/rapid"

	"github.com/tetherhq/tether/controlplane/wire"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	"github.com/tetherhq/tether/supervisor/lease"
	"github.com/tetherhq/tether/supervisor/lease/coordinator"
)

// TestCoordinatorThroughTheStoreAgainstStep is the model test of the
// lease coordinator: random messages about a few jobs, on a clock that
// moves between them, through coordinator.Apply over a real store, with
// restarts (the coordinator stopped and rebuilt from the store) at random
// points. The reference is the pure state machine it wraps: every answer
// must be what lease.Step gives for the same message at the same time,
// and after every restart each job's lease must be the reference's, once
// the restart policy's recoveries (lease.PlanRestart) are applied to it.
// So sharding, group commit, checkpoints, reloading and the deadline queue
// change nothing the protocol decides.
func TestCoordinatorThroughTheStoreAgainstStep(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		p := lease.DefaultPolicy()
		p.DefaultAckTimeout = 10 * time.Second
		p.MaxUnresolvedBound = time.Minute
		if rapid.Bool().Draw(rt, "strictRestart") {
			p.Restart = lease.RestartStrict
		}
		st, err := badgerstore.OpenBadger("", badgerstore.BadgerOptions{InMemory: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			rt.Fatal(err)
		}
		defer st.Close()
		clk := clock.NewManual(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
		c := &coordinatorRun{t: rt, st: st, clk: clk, p: p}
		c.start()
		defer c.stop()

		jobs := []string{"job-a", "job-b", "job-c"}
		ref := map[string]lease.Lease{}
		ids := 0
		steps := rapid.IntRange(1, 40).Draw(rt, "steps")
		for i := range steps {
			clk.Advance(time.Duration(rapid.IntRange(0, 15000).Draw(rt, "advanceMs")) * time.Millisecond)
			if rapid.IntRange(0, 9).Draw(rt, "restart") == 0 {
				c.restart(jobs, ref)
				continue
			}
			job := rapid.SampledFrom(jobs).Draw(rt, "job")
			ids++
			m := drawLeaseMessage(rt, job, ref[job], fmt.Sprintf("L%d", ids))
			now := clk.Now()
			want, wantDecision, _ := lease.Step(ref[job], m, now, p)
			res, err := c.c.Apply(context.Background(), m)
			if err != nil {
				rt.Fatalf("step %d %s: %v", i, m.Kind(), err)
			}
			if res.Decision.Outcome != wantDecision.Outcome || res.Decision.Event != wantDecision.Event {
				rt.Fatalf("step %d %#v at %s: coordinator decided %s %s (%s), Step %s %s (%s)", i, m, now,
					res.Decision.Outcome, res.Decision.Event, res.Decision.Reason, wantDecision.Outcome, wantDecision.Event, wantDecision.Reason)
			}
			if want.Exists() {
				// The coordinator acts on deadlines as its clock reaches
				// them (and a message refused before judgement does not
				// look at the clock): compare what the clock decided too.
				sameLease(rt, fmt.Sprintf("step %d %s at %s (coordinator: %s)", i, m.Kind(), now, res.Decision.Reason),
					observed(res.Lease, now, p), observed(want, now, p))
				ref[job] = want
			}
		}
		c.restart(jobs, ref)
	})
}

// coordinatorRun is one coordinator over a store that outlives it.
type coordinatorRun struct {
	t      *rapid.T
	st     store.Store
	clk    *clock.Manual
	p      lease.Policy
	c      *coordinator.Coordinator
	cancel context.CancelFunc
	done   chan error
}

func (r *coordinatorRun) start() {
	c, err := coordinator.New(context.Background(), coordinator.Config{Store: r.st, Clock: r.clk, Policy: r.p, Shards: 2, MaxWait: time.Millisecond,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		r.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.c, r.cancel, r.done = c, cancel, make(chan error, 1)
	go func() { r.done <- c.Run(ctx) }()
}

func (r *coordinatorRun) stop() {
	if r.cancel == nil {
		return
	}
	r.cancel()
	if err := <-r.done; err != nil && err != context.Canceled {
		r.t.Fatalf("coordinator Run: %v", err)
	}
	r.cancel = nil
}

// restart stops the coordinator, starts a new one on the same store, and
// checks every job against the reference with the restart policy applied.
func (r *coordinatorRun) restart(jobs []string, ref map[string]lease.Lease) {
	r.stop()
	r.start()
	now := r.clk.Now()
	// A tick through each job's shard is answered only once everything the
	// new run judged before it — the restart's recoveries — is durable.
	got := map[string]lease.Lease{}
	for _, job := range jobs {
		res, err := r.c.Apply(context.Background(), lease.Tick{JobID: job})
		if err != nil {
			r.t.Fatalf("after a restart, a tick for %s: %v", job, err)
		}
		got[job] = res.Lease
	}
	var all []lease.Lease
	for _, job := range jobs {
		if ref[job].Exists() {
			all = append(all, ref[job])
		}
	}
	if lastAlive := r.c.LastAlive(); !lastAlive.IsZero() {
		for _, rec := range lease.PlanRestart(all, lastAlive, now, r.p) {
			next, _, _ := lease.Step(ref[rec.JobID], rec, now, r.p)
			ref[rec.JobID] = next
		}
	}
	for _, job := range jobs {
		if !ref[job].Exists() {
			if got[job].Exists() {
				r.t.Fatalf("after a restart, job %s has a lease nobody offered: %v", job, got[job])
			}
			continue
		}
		ref[job] = observed(ref[job], now, r.p)
		sameLease(r.t, "after a restart, job "+job, got[job], ref[job])
	}
}

func observed(l lease.Lease, now time.Time, p lease.Policy) lease.Lease {
	next, _, _ := lease.Step(l, lease.Tick{JobID: l.JobID}, now, p)
	return next
}

func sameLease(t *rapid.T, what string, got, want lease.Lease) {
	t.Helper()
	g, w := wire.Lease(got), wire.Lease(want)
	if !proto.Equal(g, w) {
		t.Fatalf("%s:\n coordinator %v\n Step        %v", what, g, w)
	}
}

// drawLeaseMessage draws a message about job, aimed at its current lease
// so that accepted, duplicate, stale and refused messages are all common.
func drawLeaseMessage(t *rapid.T, job string, l lease.Lease, newLeaseID string) lease.Message {
	holders := []string{"w1", "w2"}
	c := lease.Claim{JobID: job, LeaseID: l.LeaseID, Generation: max(l.Generation, 1), HolderIdentity: l.HolderIdentity}
	if c.HolderIdentity == "" || rapid.IntRange(0, 5).Draw(t, "otherHolder") == 0 {
		c.HolderIdentity = rapid.SampledFrom(holders).Draw(t, "holder")
	}
	switch rapid.IntRange(0, 7).Draw(t, "claimFault") {
	case 0:
		c.Generation--
	case 1:
		c.Generation++
	}
	if c.LeaseID == "" || c.Generation == 0 {
		c.LeaseID, c.Generation = "L0", 1
	}
	seq := func(last uint64) uint64 {
		return max(1, last+uint64(rapid.IntRange(0, 2).Draw(t, "seqStep"))) - uint64(rapid.IntRange(0, 1).Draw(t, "seqBack"))
	}
	results := []lease.TerminalResult{lease.ResultSuccess, lease.ResultFailed, lease.ResultCancelled}
	d := time.Duration(rapid.IntRange(5, 30).Draw(t, "durationS")) * time.Second
	switch rapid.IntRange(0, 10).Draw(t, "kind") {
	case 0:
		return lease.Offer{JobID: job, LeaseID: newLeaseID, HolderIdentity: c.HolderIdentity, LeaseDuration: d}
	case 1:
		return lease.Ack{Claim: c}
	case 2, 3:
		return lease.Renew{Claim: c, RenewSequence: seq(l.RenewSequence)}
	case 4:
		return lease.Progress{Claim: c, ProgressSequence: seq(l.ProgressSequence), ProgressValue: rapid.SampledFrom([]string{"a", "b"}).Draw(t, "value")}
	case 5:
		return lease.CancelAck{Claim: c}
	case 6:
		return lease.Complete{Claim: c, Result: rapid.SampledFrom(results).Draw(t, "result")}
	case 7:
		return lease.RequestCancel{JobID: job, Reason: "model"}
	case 8:
		return lease.Reassign{JobID: job, LeaseID: newLeaseID, HolderIdentity: rapid.SampledFrom(holders).Draw(t, "newHolder"), LeaseDuration: d,
			Reason: "model", ResolveConflict: l.OwnershipConflict}
	default:
		r := lease.Resolve{JobID: job, Result: rapid.SampledFrom([]lease.TerminalResult{lease.ResultCancelled, lease.ResultFailed, lease.ResultUnresolved}).Draw(t, "resolution"), Reason: "model"}
		if r.Result == lease.ResultUnresolved {
			r.UnresolvedBound = time.Duration(rapid.IntRange(1, 60).Draw(t, "boundS")) * time.Second
		}
		return r
	}
}
