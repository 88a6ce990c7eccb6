package coordinator_test

import (
	"context"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/supervisor/lease"
	"github.com/tetherhq/tether/supervisor/lease/coordinator"
)

// TestEndOfEachFindsTheRowAWholeReadFinds: EndOfEach searches a job's
// anchor rows for the row at which its lease took its terminal result; it
// finds the row a read of the whole history finds (the first whose lease
// carries the result), whatever the row's place among the anchors, with
// rows after it (a holder repeating its result), for an UNRESOLVED later
// made final, and across a restart (rows in keys of their own and in the
// evidence log alike).
func TestEndOfEachFindsTheRowAWholeReadFinds(t *testing.T) {
	dir := t.TempDir()
	st := openStore(t, dir)
	defer st.Close()
	clk := clock.NewManual(t0)
	h := start(t, st, clk, lease.DefaultPolicy())

	// ends[job]: how many repeated renewals come before its end, and how
	// many repeated Completes after it.
	ends := map[string][2]int{"first": {0, 0}, "at-anchor": {59, 3}, "after-anchor": {60, 70}, "long": {300, 70}, "unresolved": {200, 0}}
	for job, n := range ends {
		h.active(job, "w", 10*time.Minute)
		c := claim(job, "L-"+job, 1, "w")
		var msgs []lease.Message
		for range n[0] {
			msgs = append(msgs, lease.Renew{Claim: c, RenewSequence: 1})
		}
		for _, m := range msgs {
			h.apply(m)
		}
		if job == "unresolved" {
			h.want(lease.Resolve{JobID: job, Result: lease.ResultUnresolved, Reason: "stopped"}, lease.OutcomeAccepted, lease.EventResolved)
			for range 70 {
				h.apply(lease.Renew{Claim: c, RenewSequence: 2})
			}
			h.want(lease.Resolve{JobID: job, Result: lease.ResultFailed, Reason: "operator:ops: it failed"}, lease.OutcomeAccepted, lease.EventResolved)
			continue
		}
		h.want(lease.Complete{Claim: c, Result: lease.ResultSuccess, Detail: "done"}, lease.OutcomeAccepted, lease.EventTerminalAccepted)
		for range n[1] {
			h.apply(lease.Complete{Claim: c, Result: lease.ResultSuccess, Detail: "done"})
		}
	}
	check := func(c *coordinator.Coordinator, when string) {
		t.Helper()
		var leases []lease.Lease
		for job := range ends {
			l, err := c.Get(context.Background(), job)
			if err != nil {
				t.Fatal(err)
			}
			leases = append(leases, l)
		}
		err := c.EndOfEach(context.Background(), leases, func(l lease.Lease, end coordinator.Row, found bool) error {
			rows, err := c.Evidence(context.Background(), l.JobID)
			if err != nil {
				return err
			}
			want := -1
			for i, r := range rows {
				if r.TerminalResult == l.TerminalResult {
					want = i
					break
				}
			}
			switch {
			case want < 0 || !found:
				t.Errorf("%s: %s: found %v, the whole read %d; want both to find the row", when, l.JobID, found, want)
			case end.Number != rows[want].Number || end.Message != rows[want].Message || !end.DecidedAt.Equal(rows[want].DecidedAt) || end.Decision != rows[want].Decision:
				t.Errorf("%s: %s: row %d (%s, %s), the whole read row %d (%s, %s)", when, l.JobID, end.Number, end.Message, end.Decision.Outcome, rows[want].Number, rows[want].Message, rows[want].Decision.Outcome)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	check(h.c, "running")
	h.stop()
	h = start(t, st, clk, lease.DefaultPolicy())
	check(h.c, "after a restart")
}
