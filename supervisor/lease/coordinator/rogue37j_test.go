package coordinator_test

import (
	"context"
	"testing"
	"time"

	"github.com/tetherhq/tether/supervisor/lease"
	"github.com/tetherhq/tether/supervisor/lease/coordinator"

	"github.com/tetherhq/tether/internal/clock"
)

// TestRogue37JAnEndedHoldersRepeatsDoNotLengthenTheJobsEvidence: a rogue
// holder whose generation has ended — its own SUCCESS recorded, or its
// lease expired — keeps sending (a repeated result, renewals, progress,
// cancel acknowledgements). Each changes nothing and each gets an explicit
// decision, but each was kept as a row of the job's evidence for ever,
// because the current holder's rows were never folded: the holder of a
// finished job could lengthen its record (the one its owner and the
// operators read) without bound. Now, once its generation has ended, it is
// held to what a former holder is held to: its first
// StaleRowsPerFormerHolder messages are rows, the later ones that change
// nothing are folded into its count. A live generation's rows are never
// folded, and a message that changes the lease (the clock's expiry as it
// is judged) is a row.
func TestRogue37JAnEndedHoldersRepeatsDoNotLengthenTheJobsEvidence(t *testing.T) {
	st := openStore(t, t.TempDir())
	defer st.Close()
	clk := clock.NewManual(t0)
	h := start(t, st, clk, lease.DefaultPolicy())
	const k = coordinator.StaleRowsPerFormerHolder
	rows := func(job string) int {
		t.Helper()
		rs, err := h.c.Evidence(context.Background(), job)
		if err != nil {
			t.Fatal(err)
		}
		return len(rs)
	}
	tally := func(job string) []coordinator.StaleCount {
		t.Helper()
		got, err := h.c.StaleTally(context.Background(), job)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}

	// The holder of a finished job.
	h.active("done", "w", 10*time.Minute)
	c := claim("done", "L-done", 1, "w")
	h.want(lease.Complete{Claim: c, Result: lease.ResultSuccess, Detail: "w: ok"}, lease.OutcomeAccepted, lease.EventTerminalAccepted)
	base := rows("done")
	const sent = 3 * k
	for i := range sent {
		switch i % 3 {
		case 0:
			h.want(lease.Complete{Claim: c, Result: lease.ResultSuccess, Detail: "w: ok"}, lease.OutcomeDuplicate, lease.EventDuplicateTerminal)
		case 1:
			h.want(lease.Renew{Claim: c, RenewSequence: uint64(i)}, lease.OutcomeRejected, lease.EventInvalidTransition)
		default:
			h.want(lease.Progress{Claim: c, ProgressSequence: uint64(i), ProgressValue: "still here"}, lease.OutcomeRejected, lease.EventLateProgress)
		}
	}
	if got := rows("done"); got != base+k {
		t.Fatalf("after %d messages of the holder of a finished job it has %d rows, want %d (%d kept in full, the rest folded)", sent, got, base+k, k)
	}
	want := coordinator.StaleCount{Holder: "w", Kept: k, Folded: sent - k}
	if got := tally("done"); len(got) != 1 || got[0] != want {
		t.Fatalf("stale tally of the finished job %+v, want [%+v]", got, want)
	}

	// The holder of an expired lease: the message that finds it expired
	// changes the lease (a row whatever the count), the rest change nothing.
	h.active("lapsed", "w", time.Minute)
	cl := claim("lapsed", "L-lapsed", 1, "w")
	clk.Advance(2 * time.Minute)
	base = rows("lapsed")
	for seq := uint64(1); seq <= sent; seq++ {
		r := h.apply(lease.Renew{Claim: cl, RenewSequence: seq})
		if r.Decision.Outcome != lease.OutcomeRejected || r.Lease.State != lease.StateExpired {
			t.Fatalf("renew %d of an expired lease: %s %s, lease %s", seq, r.Decision.Outcome, r.Decision.Event, r.Lease.State)
		}
	}
	// The first renewal's row also records the expiry the clock forced (or
	// the sweep's Tick did, a row of its own): either way at most k+1 rows.
	if got := rows("lapsed"); got > base+k+1 {
		t.Fatalf("after %d renewals of an expired lease it has %d rows, want at most %d", sent, got, base+k+1)
	}

	// A live generation's rows are never folded.
	h.active("live", "w", 10*time.Minute)
	base = rows("live")
	for seq := uint64(1); seq <= 2*k; seq++ {
		h.want(lease.Renew{Claim: claim("live", "L-live", 1, "w"), RenewSequence: seq}, lease.OutcomeAccepted, lease.EventRenewed)
	}
	if got := rows("live"); got != base+2*k {
		t.Fatalf("the holder's %d renewals of a live lease left %d rows, want %d", 2*k, got, base+2*k)
	}
	if got := tally("live"); len(got) != 0 {
		t.Fatalf("a live lease has a stale tally %+v", got)
	}
}
