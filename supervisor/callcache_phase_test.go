package supervisor

import (
	"context"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	"github.com/tetherhq/tether/supervisor/ledger"
	"github.com/tetherhq/tether/supervisor/tree"
)

// The calls kept for a drain's wait say "in flight". The escalation orders
// them cancelled in its own transaction, but the reconciler's watch may
// deliver that change after the same pass looks again: the aborting wait
// must not read the drain's kept states, in which no call waits for an
// acknowledgement (it would revoke at once and skip the abort's
// acknowledgement window, listing the calls unacknowledged; seen in a
// loaded run as a drain that went from draining to reconciling in one
// pass with an acknowledgement still pending).
func TestAnEscalationDoesNotReadTheDrainsKeptCalls(t *testing.T) {
	ctx := context.Background()
	s, st := chunkTestSupervisor(t, badgerstore.BadgerOptions{}, 64)
	root, ids := buildTree(t, st, 3, 3)
	now := s.Clock.Now()
	callID := id.New(id.Call)
	if err := st.Update(ctx, func(tx store.Txn) error {
		n, err := tree.GetNodeIn(tx, ids[1])
		if err != nil {
			return err
		}
		n.Holds |= tree.HoldsTracked | tree.HoldsCalls
		if err := tree.PutNodeIn(tx, n); err != nil {
			return err
		}
		c := &ledger.ToolCall{CallID: callID, NodeID: ids[1], Tool: "shell", GateID: "gate", State: ledger.CallStateInFlight, BegunAt: now}
		if err := ledger.PutCallIn(tx, c); err != nil {
			return err
		}
		return tx.Put(ledger.OpenCallKey(ids[1], callID), nil)
	}); err != nil {
		t.Fatal(err)
	}
	// The loop's watches are established (the cache is on); the test
	// delivers none of their events, as a lagging watch would not yet.
	s.calls.reset()
	term, err := s.Terminate(ctx, TerminateRequest{NodeID: root, Mode: ModeDrain, DrainWindow: time.Minute, CancelAckTimeout: time.Minute, ConfirmTimeout: time.Minute, Reason: "drain", RequestedBy: "operator:test"})
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		if _, err := s.Reconcile(ctx, term.ID); err != nil {
			t.Fatal(err)
		}
	}
	if term, err = s.Get(ctx, term.ID); err != nil {
		t.Fatal(err)
	}
	if term.Phase != PhaseDraining {
		t.Fatalf("the termination is %s, want draining (the call is in flight)", term.Phase)
	}
	if _, kept := s.calls.get(term.ID); !kept {
		t.Fatal("the drain's wait kept no calls: the test would not test the kept states")
	}

	s.Clock.(*clock.Manual).Advance(time.Minute) // the drain's window ends
	if _, err := s.Reconcile(ctx, term.ID); err != nil {
		t.Fatal(err)
	}
	if term, err = s.Get(ctx, term.ID); err != nil {
		t.Fatal(err)
	}
	if term.Phase != PhaseAborting || term.Progress.CancelsPending != 1 {
		t.Fatalf("after the escalation the termination is %s with %d acknowledgements pending, want aborting with 1 (the call's cancel is not acknowledged and its window is a minute)", term.Phase, term.Progress.CancelsPending)
	}
	c, err := store.Read(ctx, st, func(tx store.ReadTxn) (*ledger.ToolCall, error) { return ledger.GetCallIn(tx, callID) })
	if err != nil {
		t.Fatal(err)
	}
	if c.State != ledger.CallStateCancelRequested {
		t.Fatalf("the call is %s after the escalation, want cancel requested", c.State)
	}
}
