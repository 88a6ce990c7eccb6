package coordinator_test

import (
	"context"
	"runtime/debug"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/supervisor/lease"
)

// A rogue holder that lets the ACK deadline of a long lease pass, under
// the ack-miss policy reassign, after the coordinator restarted with a
// lower Policy.MaxLeaseDuration than the one the job was offered under.
// The shard built the automatic reassignment with the lease's own
// duration, which the lowered policy refuses (INVALID_MESSAGE): the lease
// stayed due for an automatic reassignment, and the shard judged another
// after the refusal, and another, without end — its goroutine recursed
// until the process died, and every restart died again on the same lease:
// one holder's silence stopped every job's coordinator. The automatic
// reassignment offers generation + 1 under the policy in force (its
// duration at most the policy's maximum), and a refused one is never
// followed by another in the same judgement.
func TestRogue34EAHolderSilentUnderALoweredMaximumDoesNotStopTheCoordinator(t *testing.T) {
	// The recursion was unbounded: fail in a few MB of stack, not in the
	// gigabyte a goroutine may grow to (the machine is shared).
	defer debug.SetMaxStack(debug.SetMaxStack(64 << 20))
	dir := t.TempDir()
	st := openStore(t, dir)
	clk := clock.NewManual(t0)
	p := lease.DefaultPolicy()
	p.AckMiss = lease.AckMissReassign
	h := start(t, st, clk, p)
	h.want(lease.Offer{JobID: "long", LeaseID: "L1", HolderIdentity: "rogue", LeaseDuration: 10 * time.Minute, AckTimeout: 10 * time.Second},
		lease.OutcomeAccepted, lease.EventOffered)
	h.active("other", "w2", time.Hour/6)
	h.stop()
	st.Close()

	lowered := p
	lowered.MaxLeaseDuration = time.Minute
	st = openStore(t, dir)
	defer st.Close()
	h = start(t, st, clk, lowered)
	clk.Advance(time.Minute) // the rogue never ACKs (the restart gave it a grace)
	waitFor(t, "the automatic reassignment", func() bool { return h.get("long").Generation == 2 })
	l := h.get("long")
	if l.State != lease.StateOffered || l.HolderIdentity != "rogue" || l.LeaseDuration != time.Minute || l.AutoReassigns != 1 {
		t.Fatalf("after the missed ACK: %s gen %d holder %q for %s (automatic %d), want OFFERED gen 2 to the same holder for the policy's maximum, 1m",
			l.State, l.Generation, l.HolderIdentity, l.LeaseDuration, l.AutoReassigns)
	}
	// The other jobs' coordinator serves on.
	h.want(lease.Renew{Claim: claim("other", "L-other", 1, "w2"), RenewSequence: 1}, lease.OutcomeAccepted, lease.EventRenewed)
	rows, err := h.c.Evidence(context.Background(), "long")
	if err != nil {
		t.Fatal(err)
	}
	var auto int
	for _, r := range rows {
		if r.Message == lease.KindReassign {
			auto++
		}
	}
	if auto != 1 {
		t.Fatalf("%d reassignment rows, want the one automatic reassignment", auto)
	}
}
