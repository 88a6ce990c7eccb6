package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/supervisor/lease"
	"github.com/tetherhq/tether/supervisor/lease/coordinator"
)

// TestAHolderBoundedOfferPassesAFullAccountAndCountsInIt: an account's
// bound (MaxOpenPerAccount) held every bounded offer, so one holder of the
// account that filled it — with offers it never acknowledged, expired and
// still open — had the offers of those who may empty it refused too.
// ApplyHolderBounded (the control plane's operators') is held to the bound
// per holder only and counts its lease in the account, so the account's
// own bounded offers still see it. (Fails if ApplyHolderBounded is refused
// by the full account, passes the holder's bound, or is not counted.)
func TestAHolderBoundedOfferPassesAFullAccountAndCountsInIt(t *testing.T) {
	clk := clock.NewManual(t0)
	st := openStore(t, t.TempDir())
	t.Cleanup(func() { st.Close() }) // after the coordinator's run stops
	c, err := coordinator.New(context.Background(), coordinator.Config{
		Store: st, Clock: clk, Policy: lease.DefaultPolicy(), Log: quiet(), MaxWait: time.Millisecond, Shards: 3,
		MaxOpenPerHolder: 3, MaxOpenPerAccount: 3,
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

	n := 0
	offer := func(holder string) lease.Offer {
		n++
		return lease.Offer{JobID: fmt.Sprintf("job-%d", n), LeaseID: fmt.Sprintf("L-%d", n), HolderIdentity: holder, LeaseDuration: time.Minute, AckTimeout: time.Second}
	}
	bg := context.Background()
	for range 3 {
		if _, err := c.ApplyBounded(bg, offer("n_rogue_child"), nil, "n_root"); err != nil {
			t.Fatal(err)
		}
	}
	clk.Advance(time.Minute) // never acknowledged: expired, still open
	waitFor(t, "the offers to expire", func() bool { return h.get("job-3").State == lease.StateExpired })
	if _, err := c.ApplyBounded(bg, offer("n_sibling"), nil, "n_root"); !errors.Is(err, coordinator.ErrLimit) {
		t.Fatalf("a bounded offer to a sibling in the full account: %v, want ErrLimit", err)
	}
	if _, err := c.ApplyHolderBounded(bg, offer("n_sibling"), nil, "n_root"); err != nil {
		t.Fatalf("a holder-bounded offer to a sibling in the full account: %v, want it judged", err)
	}
	if byHolder, byAccount := c.OpenLeases("n_sibling", "n_root"); byHolder != 1 || byAccount != 4 {
		t.Fatalf("open leases after it: the sibling %d, the account %d; want 1 and 4 (it counts in the account)", byHolder, byAccount)
	}
	if _, err := c.ApplyHolderBounded(bg, offer("n_rogue_child"), nil, "n_root"); !errors.Is(err, coordinator.ErrLimit) {
		t.Fatalf("a holder-bounded offer to the full holder: %v, want ErrLimit", err)
	}
}
