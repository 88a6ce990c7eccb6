package tree

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
)

// TestFlakeASessionOpenedBeforeTheSignalsWatchIsToldOfAChangeInBetween:
// a session subscribes to its node's signals, then reads the node; the
// watch of Signals.Run pushes every later change. The control plane serves
// as soon as it starts, beside its components, so a session (or a lease
// Channel) opened at a start — agents reconnecting to a restarted control
// plane — could subscribe and read before Run's first watch was
// established: a drain written in between was never pushed, and the
// Channel's cached "may act" never read the node again. Run's first pass
// now does what every later one does once its watch is established: it
// reads every subscribed node again and sends its signal, and wakes every
// Changes subscriber.
func TestFlakeASessionOpenedBeforeTheSignalsWatchIsToldOfAChangeInBetween(t *testing.T) {
	st, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	tr := &Tree{Store: st, Clock: clk, Limits: DefaultLimits}
	root, err := tr.RegisterRoot(ctx, "root", nil, "test")
	if err != nil {
		t.Fatal(err)
	}
	h := &Signals{Store: st, Clock: clk, Log: slog.New(slog.DiscardHandler)}
	// The session opens: it subscribes, then reads its node (running).
	signals, unsubscribe := h.Subscribe(root.NodeID)
	defer unsubscribe()
	changes, unsubscribeChanges := h.Changes(root.NodeID)
	defer unsubscribeChanges()
	if n, err := tr.Get(ctx, root.NodeID); err != nil || SignalFor(n) != nil {
		t.Fatalf("the node as the session opens: %v, %v; want it running", n, err)
	}
	// The node drains before Run's watch is established.
	if err := st.Update(ctx, func(tx store.Txn) error {
		n, err := GetNodeIn(tx, root.NodeID)
		if err != nil {
			return err
		}
		n.State, n.TerminationID = NodeStateDraining, "t_1"
		return PutNodeIn(tx, n)
	}); err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- h.Run(ctx) }()
	defer func() { cancel(); <-ran }()
	guard := time.After(10 * time.Second) // a bound on a hang, not a timing
	select {
	case sig := <-signals:
		if sig.Kind != SignalKindDrain {
			t.Fatalf("the session was sent %v, want the drain", sig)
		}
	case <-guard:
		t.Fatal("the session was never told of the drain written before the watch began")
	}
	select {
	case <-changes:
	case <-guard:
		t.Fatal("the Changes subscriber was never woken for the drain written before the watch began")
	}
}
