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

// startBounded runs a coordinator on Badger with the bounds of cfg.
func startBounded(t *testing.T, cfg coordinator.Config) (*coordinator.Coordinator, *harness) {
	t.Helper()
	clk := clock.NewManual(t0)
	st := openStore(t, t.TempDir())
	t.Cleanup(func() { st.Close() }) // after the coordinator's run stops
	cfg.Store, cfg.Clock, cfg.Policy, cfg.Log, cfg.MaxWait, cfg.Shards = st, clk, lease.DefaultPolicy(), quiet(), time.Millisecond, 3
	c, err := coordinator.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{t: t, c: c, clock: clk, store: st, cancel: cancel, done: make(chan error, 1)}
	ended := make(chan struct{})
	go func() { defer close(ended); h.done <- c.Run(ctx) }()
	t.Cleanup(h.stop)
	waitServing(t, c, ended)
	return c, h
}

// TestRogue24TheBoundsForgetAHolderWhoseLeasesEnded: the bounds on open
// leases remember each holder's account (its lineage) to count the
// leases it opens, and never forgot one: a rogue that spawns short-lived
// children and has each offered a lease (one refused by a full account
// counts too) grew the coordinator's memory by a holder each, until a
// restart (500 holders, 500 remembered after every lease ended). A
// holder is now forgotten with its last open lease, and a refusal
// remembers nothing. (Fails if any holder is remembered once its leases
// ended.)
func TestRogue24TheBoundsForgetAHolderWhoseLeasesEnded(t *testing.T) {
	const children = 500
	c, _ := startBounded(t, coordinator.Config{MaxOpenPerHolder: 2, MaxOpenPerAccount: children})
	bg := context.Background()
	for i := range children {
		holder := fmt.Sprintf("n_child_%d", i)
		if _, err := c.ApplyBounded(bg, lease.Offer{JobID: fmt.Sprintf("job-%d", i), LeaseID: fmt.Sprintf("L-%d", i), HolderIdentity: holder, LeaseDuration: time.Minute, AckTimeout: time.Second}, nil, "n_root"); err != nil {
			t.Fatal(err)
		}
	}
	// A full account refuses: the refused holders are not remembered.
	for i := range children {
		_, err := c.ApplyBounded(bg, lease.Offer{JobID: fmt.Sprintf("refused-%d", i), LeaseID: fmt.Sprintf("R-%d", i), HolderIdentity: fmt.Sprintf("n_refused_%d", i), LeaseDuration: time.Minute, AckTimeout: time.Second}, nil, "n_root")
		if !errors.Is(err, coordinator.ErrLimit) {
			t.Fatalf("an offer past the full account: %v, want ErrLimit", err)
		}
	}
	if n := c.HoldersRemembered(); n != children {
		t.Fatalf("with %d holders of open leases, %d refused, the bounds remember %d holders, want %d", children, children, n, children)
	}
	for i := range children {
		if _, err := c.Apply(bg, lease.Resolve{JobID: fmt.Sprintf("job-%d", i), Result: lease.ResultFailed, Reason: "the child exited"}); err != nil {
			t.Fatal(err)
		}
	}
	if byHolder, byAccount := c.OpenLeases("n_child_0", "n_root"); byHolder != 0 || byAccount != 0 {
		t.Fatalf("after every lease ended: the child holds %d, the account %d open leases, want 0", byHolder, byAccount)
	}
	t.Logf("after %d children's leases ended, the bounds remember %d holders", children, c.HoldersRemembered())
	if n := c.HoldersRemembered(); n != 0 {
		t.Fatalf("after every lease of %d short-lived children ended the bounds remember %d holders, want 0", children, n)
	}
	// A holder offered again is counted under its account again.
	if _, err := c.ApplyBounded(bg, lease.Offer{JobID: "again", LeaseID: "L-again", HolderIdentity: "n_child_0", LeaseDuration: time.Minute, AckTimeout: time.Second}, nil, "n_root"); err != nil {
		t.Fatal(err)
	}
	if byHolder, byAccount := c.OpenLeases("n_child_0", "n_root"); byHolder != 1 || byAccount != 1 {
		t.Fatalf("offered again: the child holds %d, the account %d open leases, want 1 and 1", byHolder, byAccount)
	}
}

// TestRogue24EachHolderKeepsItsShareOfAFullAccount: an account's bound
// (MaxOpenPerAccount) was one pool its holders shared, so one holder's
// children could take every place and a sibling none. Each holder now
// keeps OpenReservePerHolder of its own: the account counts only the
// leases a holder holds past it. (Fails if the sibling is refused within
// its share, if it gets more than its share of a full account, or if the
// counts do not return to zero when the leases end.)
func TestRogue24EachHolderKeepsItsShareOfAFullAccount(t *testing.T) {
	c, _ := startBounded(t, coordinator.Config{MaxOpenPerHolder: 8, MaxOpenPerAccount: 8, OpenReservePerHolder: 2})
	bg := context.Background()
	n := 0
	offer := func(holder string) error {
		n++
		_, err := c.ApplyBounded(bg, lease.Offer{JobID: fmt.Sprintf("job-%d", n), LeaseID: fmt.Sprintf("L-%d", n), HolderIdentity: holder, LeaseDuration: time.Minute, AckTimeout: time.Second}, nil, "n_root")
		return err
	}
	// The rogue's first child: its bound per holder, 2 of its own and 6
	// of the account's.
	for range 8 {
		if err := offer("n_kid_1"); err != nil {
			t.Fatal(err)
		}
	}
	if byHolder, byAccount := c.OpenLeases("n_kid_1", "n_root"); byHolder != 8 || byAccount != 6 {
		t.Fatalf("the first child holds %d, the account counts %d, want 8 and 6", byHolder, byAccount)
	}
	// Its second: 2 of its own and the account's last 2.
	for range 4 {
		if err := offer("n_kid_2"); err != nil {
			t.Fatal(err)
		}
	}
	if err := offer("n_kid_2"); !errors.Is(err, coordinator.ErrLimit) {
		t.Fatalf("the second child's fifth offer in a full account: %v, want ErrLimit", err)
	}
	// The sibling takes its own 2, and no more.
	for i := range 2 {
		if err := offer("n_sibling"); err != nil {
			t.Fatalf("the sibling's offer %d in the account the rogue filled: %v, want it judged (its own share)", i+1, err)
		}
	}
	if err := offer("n_sibling"); !errors.Is(err, coordinator.ErrLimit) {
		t.Fatalf("the sibling's third offer in the full account: %v, want ErrLimit", err)
	}
	if byHolder, byAccount := c.OpenLeases("n_sibling", "n_root"); byHolder != 2 || byAccount != 8 {
		t.Fatalf("the sibling holds %d, the account counts %d, want 2 and 8", byHolder, byAccount)
	}
	// Every lease ends: every count returns to zero.
	for i := 1; i <= n; i++ {
		c.Apply(bg, lease.Resolve{JobID: fmt.Sprintf("job-%d", i), Result: lease.ResultFailed, Reason: "ended"}) // the refused ones have no lease
	}
	for _, h := range []string{"n_kid_1", "n_kid_2", "n_sibling"} {
		if byHolder, byAccount := c.OpenLeases(h, "n_root"); byHolder != 0 || byAccount != 0 {
			t.Fatalf("after every lease ended %s holds %d, the account counts %d, want 0", h, byHolder, byAccount)
		}
	}
	if n := c.HoldersRemembered(); n != 0 {
		t.Fatalf("after every lease ended the bounds remember %d holders, want 0", n)
	}
}
