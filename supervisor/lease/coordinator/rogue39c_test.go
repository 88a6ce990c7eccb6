package coordinator_test

import (
	"context"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/supervisor/lease"
	"github.com/tetherhq/tether/supervisor/lease/coordinator"
)

// TestRogue39CCancelRequestOfIsTheAcceptedRequestOfTheGeneration: the row
// a termination's record names the cancel's requester from
// (CancelRequestOfEach, which reads a few anchor rows instead of the job's
// whole history) is the one a whole read finds — the accepted request of
// the lease's generation — on a job that went through an earlier
// generation, whose history is longer than several anchors before and
// after the request (repeated renewals, the request repeated, a former
// holder's stale traffic); and there is none for a lease without a
// request.
func TestRogue39CCancelRequestOfIsTheAcceptedRequestOfTheGeneration(t *testing.T) {
	dir := t.TempDir()
	st := openStore(t, dir)
	defer st.Close()
	clk := clock.NewManual(t0)
	h := start(t, st, clk, lease.DefaultPolicy())
	const job = "j39c"
	h.active(job, "w1", 10*time.Minute)
	c1 := claim(job, "L-"+job, 1, "w1")
	for range 70 {
		h.apply(lease.Renew{Claim: c1, RenewSequence: 1})
	}
	h.want(lease.Reassign{JobID: job, LeaseID: "L2", HolderIdentity: "w2", LeaseDuration: 10 * time.Minute, Reason: "operator:ops: move"}, lease.OutcomeAccepted, lease.EventReassigned)
	c2 := claim(job, "L2", 2, "w2")
	h.want(lease.Ack{Claim: c2}, lease.OutcomeAccepted, lease.EventAcked)
	for range 140 {
		h.apply(lease.Renew{Claim: c2, RenewSequence: 1})
	}
	requestOf := func(l lease.Lease) (coordinator.Row, bool, error) {
		var row coordinator.Row
		var found bool
		err := h.c.CancelRequestOfEach(context.Background(), []lease.Lease{l}, func(_ lease.Lease, r coordinator.Row, ok bool) error {
			row, found = r, ok
			return nil
		})
		return row, found, err
	}
	none, found, err := requestOf(h.get(job))
	if err != nil || found {
		t.Fatalf("no request yet: found %v row %d (%v)", found, none.Number, err)
	}
	h.want(lease.RequestCancel{JobID: job, Reason: "agent:n_a: stop"}, lease.OutcomeAccepted, lease.EventCancelRequested)
	for range 100 {
		h.apply(lease.RequestCancel{JobID: job, Reason: "agent:n_b: stop again"})
		h.apply(lease.Progress{Claim: c1, ProgressSequence: 9, ProgressValue: "late"})
	}
	h.want(lease.CancelAck{Claim: c2}, lease.OutcomeAccepted, lease.EventCancelAcked)
	l := h.get(job)
	rows, err := h.c.Evidence(context.Background(), job)
	if err != nil {
		t.Fatal(err)
	}
	want := -1
	for i := len(rows) - 1; i >= 0; i-- {
		r := rows[i]
		if r.Message == lease.KindRequestCancel && r.Decision.Outcome == lease.OutcomeAccepted && r.Generation == l.Generation {
			want = i
			break
		}
	}
	if want < 0 {
		t.Fatal("no accepted request in a whole read")
	}
	got, found, err := requestOf(l)
	if err != nil || !found || got.Number != rows[want].Number || got.Reason != rows[want].Reason {
		t.Fatalf("found %v row %d %q (%v); a whole read of %d rows finds row %d %q", found, got.Number, got.Reason, err, len(rows), rows[want].Number, rows[want].Reason)
	}
}
