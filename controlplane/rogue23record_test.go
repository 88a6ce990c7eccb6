package controlplane

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	"github.com/tetherhq/tether/supervisor"
	"github.com/tetherhq/tether/supervisor/lease"
	"github.com/tetherhq/tether/supervisor/lease/coordinator"
)

// startR23Coordinator runs a coordinator over Badger on a temporary
// directory with a manual clock.
func startR23Coordinator(t *testing.T) (*coordinator.Coordinator, *clock.Manual) {
	t.Helper()
	st, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewManual(time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC))
	c, err := coordinator.New(context.Background(), coordinator.Config{
		Store: st, Clock: clk, Policy: lease.DefaultPolicy(), Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Shards: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("Run: %v", err)
		}
		st.Close()
	})
	for serving, changed := c.Serving(); !serving; serving, changed = c.Serving() {
		select {
		case <-changed:
		case <-time.After(10 * time.Second):
			t.Fatal("the coordinator did not start serving")
		}
	}
	return c, clk
}

// judgeAll submits every message at once and waits for their decisions.
func judgeAll(t *testing.T, c *coordinator.Coordinator, msgs []lease.Message) {
	t.Helper()
	done := make(chan error, len(msgs))
	for _, m := range msgs {
		c.Submit(m, nil, func(_ coordinator.Result, err error) { done <- err })
	}
	for range msgs {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// TestRogue23AHoldersPiledUpEvidenceDoesNotWeighOnItsStopsRecord: a
// termination's record says how each of the stopped holders' jobs ended
// (by whom, when), and found it by decoding the job's whole evidence
// history at once, held in memory: EvidenceOfEach read every row of up to
// 1,024 jobs in one go, and a rollout's record every row of each. A holder
// spends its lineage's rate budget (10,000 messages a second by default)
// on repeated renewals of its own jobs, each an evidence row kept for
// ever: in ten minutes, six million rows, some gigabytes decoded when its
// termination writes its record — the control plane's memory, on every
// retry of the record after a crash. The record now finds the row at
// which each job took its result by a search over the job's anchor rows
// (every 64th, written whole), decoding a few of them and at most the 63
// rows after one. Here 5,000 repeated renewals: the record read, for the
// termination and for the rollout, allocated some 16 MB each (35 MB at
// 10,000: it grew with the history); now about 2.4 MB, as much at 2,000 or
// 30,000 rows (most of it the read of the evidence log, whose window is
// bounded).
func TestRogue23AHoldersPiledUpEvidenceDoesNotWeighOnItsStopsRecord(t *testing.T) {
	c, clk := startR23Coordinator(t)
	const holder, job = "n_rogue", "piled-up"
	judgeAll(t, c, []lease.Message{lease.Offer{JobID: job, LeaseID: "L1", HolderIdentity: holder, LeaseDuration: 10 * time.Minute}})
	claim := lease.Claim{JobID: job, LeaseID: "L1", Generation: 1, HolderIdentity: holder}
	judgeAll(t, c, []lease.Message{lease.Ack{Claim: claim}, lease.Renew{Claim: claim, RenewSequence: 1}})
	const repeats = 5000
	renews := make([]lease.Message, repeats)
	for i := range renews {
		renews[i] = lease.Renew{Claim: claim, RenewSequence: 1}
	}
	judgeAll(t, c, renews)
	clk.Advance(time.Second)

	var got []supervisor.RecordLease
	var err error
	finalised := allocated(func() {
		got, _, err = leaseCanceller{c}.FinalizeHeldBy(context.Background(), []string{holder}, "terminated by operator:ops: rogue", supervisor.LeasePage{})
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].EndedBy != supervisor.LeaseEndedByTermination || got[0].EndedAt.IsZero() {
		t.Fatalf("the record says %+v; want the job ended by the termination, with its time", got)
	}
	// A rollout's record reads how a job ended the same way.
	var page []supervisor.RecordLease
	handedOver := leastAllocated(func() {
		page, _, err = leaseHandover{leases: c}.HeldBy(context.Background(), []string{holder}, supervisor.LeasePage{Limit: 256})
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(page) != 1 || page[0].EndedBy != got[0].EndedBy || !page[0].EndedAt.Equal(got[0].EndedAt) {
		t.Fatalf("the rollout's record says %+v; want what the termination's says, %+v", page, got)
	}
	t.Logf("a job with %d evidence rows: the termination's record allocated %d bytes, the rollout's %d", repeats+4, finalised, handedOver)
	const most = 8 << 20
	if finalised > most || handedOver > most {
		t.Fatalf("reading how one job with %d evidence rows ended allocated %d bytes (termination) and %d (rollout); want at most %d: the record must not decode the job's whole history",
			repeats+4, finalised, handedOver, most)
	}
}

// TestRogue23ARolloutsRecordReadsTheEvidenceLogOncePerPage: a rollout's
// record (the lease handover's HeldBy) read how each job of a page ended
// with a read of its own, and each such read reads the whole evidence log
// (its recent rows of every job, up to 256 KiB and the newest commit): a
// page of 256 finished jobs read the log 256 times, where a termination's
// record reads it once per 1,024 jobs. Here 200 finished jobs of the
// batch's member, beside a log filled by another holder's 3,000 repeated
// renewals: the page allocated some 250 MB; now the log is read once per
// page, and the page about 5 MB.
func TestRogue23ARolloutsRecordReadsTheEvidenceLogOncePerPage(t *testing.T) {
	c, _ := startR23Coordinator(t)
	const member, jobs = "n_member", 200
	var msgs []lease.Message
	for i := range jobs {
		msgs = append(msgs, lease.Offer{JobID: fmt.Sprintf("done-%03d", i), LeaseID: fmt.Sprintf("L%03d", i), HolderIdentity: member, LeaseDuration: time.Minute})
	}
	judgeAll(t, c, msgs)
	for _, m := range msgs {
		o := m.(lease.Offer)
		claim := lease.Claim{JobID: o.JobID, LeaseID: o.LeaseID, Generation: 1, HolderIdentity: member}
		judgeAll(t, c, []lease.Message{lease.Ack{Claim: claim}})
		judgeAll(t, c, []lease.Message{lease.Complete{Claim: claim, Result: lease.ResultSuccess, Detail: "done"}})
	}
	judgeAll(t, c, []lease.Message{lease.Offer{JobID: "noisy", LeaseID: "LN", HolderIdentity: "n_other", LeaseDuration: time.Minute}})
	noisy := lease.Claim{JobID: "noisy", LeaseID: "LN", Generation: 1, HolderIdentity: "n_other"}
	judgeAll(t, c, []lease.Message{lease.Ack{Claim: noisy}, lease.Renew{Claim: noisy, RenewSequence: 1}})
	renews := make([]lease.Message, 3000)
	for i := range renews {
		renews[i] = lease.Renew{Claim: noisy, RenewSequence: 1}
	}
	judgeAll(t, c, renews)

	var page []supervisor.RecordLease
	var err error
	bytes := leastAllocated(func() {
		page, _, err = leaseHandover{leases: c}.HeldBy(context.Background(), []string{member}, supervisor.LeasePage{Limit: 256})
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(page) != jobs {
		t.Fatalf("the page holds %d leases, want %d", len(page), jobs)
	}
	for _, l := range page {
		if l.EndedBy != supervisor.LeaseEndedByHolderReport || l.EndedByNodeID != member {
			t.Fatalf("%s: ended by %v (%s), want the holder's report", l.JobID, l.EndedBy, l.EndedByNodeID)
		}
	}
	t.Logf("a page of %d finished jobs: %d bytes allocated", jobs, bytes)
	const most = 32 << 20
	if bytes > most {
		t.Fatalf("a page of %d finished jobs allocated %d bytes, want at most %d: the evidence log is read once per page, not once per job", jobs, bytes, most)
	}
}
