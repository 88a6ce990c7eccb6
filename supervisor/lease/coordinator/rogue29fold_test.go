package coordinator_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/etcdtest"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/lease"
	"github.com/tetherhq/tether/supervisor/lease/coordinator"
)

// TestRogue29FFormerHolderCannotLengthenAnotherHoldersEvidence: a former
// holder within the job's last eight (a drained rollout member whose job
// went to another tree) had every late message kept as a row of the job's
// evidence, for ever, charged only to its own budget: it could lengthen
// the evidence of a job it no longer holds without bound. Every one of its
// messages still gets an explicit decision, but past
// StaleRowsPerFormerHolder rows the later ones are folded into a count on
// the job's record; the current holder's rows are never folded, and the
// count survives a crash (nothing acknowledged is lost).
func TestRogue29FFormerHolderCannotLengthenAnotherHoldersEvidence(t *testing.T) {
	dir := t.TempDir()
	inner := openStore(t, dir)
	formerHolderFolds(t, inner, func() store.Store {
		inner.Close()
		st := openStore(t, dir)
		t.Cleanup(func() { st.Close() })
		return st
	})
}

// The same on etcd, where the run that follows the crash takes over the
// same store.
func TestRogue29FEtcdFormerHolderCannotLengthenAnotherHoldersEvidence(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the etcd variant; make test and CI run them.")
	}
	inner := etcdtest.OpenStore(t, etcdtest.Start(t))
	formerHolderFolds(t, inner, func() store.Store { return inner })
}

// formerHolderFolds runs the test on inner; reopen is the store as found
// after the crash.
func formerHolderFolds(t *testing.T, inner store.Store, reopen func() store.Store) {
	st := &gatedStore{Store: inner}
	clk := clock.NewManual(t0)
	h := start(t, st, clk, lease.DefaultPolicy())
	h.active("job-1", "w1", time.Minute)
	h.want(lease.Reassign{JobID: "job-1", LeaseID: "L2", HolderIdentity: "w2", LeaseDuration: time.Minute, Reason: "drained"}, lease.OutcomeAccepted, lease.EventReassigned)
	h.want(lease.Ack{Claim: claim("job-1", "L2", 2, "w2")}, lease.OutcomeAccepted, lease.EventAcked)
	rows := func() int {
		t.Helper()
		rs, err := h.c.Evidence(context.Background(), "job-1")
		if err != nil {
			t.Fatal(err)
		}
		return len(rs)
	}
	base := rows()
	const k = coordinator.StaleRowsPerFormerHolder
	const sent = 3 * k
	for seq := uint64(1); seq <= sent; seq++ {
		h.want(lease.Renew{Claim: claim("job-1", "L-job-1", 1, "w1"), RenewSequence: seq}, lease.OutcomeRejected, lease.EventStaleGeneration)
	}
	if got := rows(); got != base+k {
		t.Fatalf("after %d stale messages of a former holder the job has %d rows, want %d (%d kept in full, the rest folded)", sent, got, base+k, k)
	}
	// The current holder's rows are never folded, however many.
	for seq := uint64(1); seq <= 2*k; seq++ {
		h.want(lease.Renew{Claim: claim("job-1", "L2", 2, "w2"), RenewSequence: seq}, lease.OutcomeAccepted, lease.EventRenewed)
	}
	if got := rows(); got != base+3*k {
		t.Fatalf("the current holder's %d renewals left %d rows, want %d", 2*k, got, base+3*k)
	}
	tally := func(when string, folded uint64) {
		t.Helper()
		got, err := h.c.StaleTally(context.Background(), "job-1")
		if err != nil {
			t.Fatal(err)
		}
		want := coordinator.StaleCount{Holder: "w1", Kept: k, Folded: folded}
		if len(got) != 1 || got[0] != want {
			t.Fatalf("%s: stale tally %+v, want [%+v]", when, got, want)
		}
	}
	tally("serving", sent-k)
	before := h.get("job-1")
	// The crash: nothing more reaches the disk, not even the clean stop's
	// checkpoint.
	st.mu.Lock()
	st.fail = errors.New("power cut")
	st.mu.Unlock()
	h.stop()
	h = start(t, reopen(), clk, lease.DefaultPolicy())
	if got := h.get("job-1"); got != before {
		t.Fatalf("after the crash:\n got %+v\nwant %+v", got, before)
	}
	tally("after the crash", sent-k)
	r := h.want(lease.Progress{Claim: claim("job-1", "L-job-1", 1, "w1"), ProgressSequence: 1, ProgressValue: "still here"}, lease.OutcomeRejected, lease.EventStaleGeneration)
	if got := rows(); got != base+3*k {
		t.Fatalf("after the crash a former holder's message added a row: %d rows, want %d", got, base+3*k)
	}
	if r.Decision.Reason == "" {
		t.Fatal("a folded message's decision has no reason")
	}
	tally("after the crash and one more", sent-k+1)

	// Holding the job again, w1 is no former holder: its counts go with
	// the decision that gave it the job (the record is rewritten with it).
	h.want(lease.Reassign{JobID: "job-1", LeaseID: "L3", HolderIdentity: "w1", LeaseDuration: time.Minute, Reason: "back"}, lease.OutcomeAccepted, lease.EventReassigned)
	if got, err := h.c.StaleTally(context.Background(), "job-1"); err != nil || len(got) != 0 {
		t.Fatalf("w1 holds the job again: stale tally %+v, %v; want none", got, err)
	}
}
