package supervisor

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	"github.com/tetherhq/tether/supervisor/ledger"
	"github.com/tetherhq/tether/supervisor/tree"
)

// TestAcknowledgementsAfterTheMarkAreJudgedOnTheDeadlineItCommitted: the
// mark's last chunk sets the abort's acknowledgement deadline, and the
// acknowledgements that follow it are judged on that deadline without
// reading the termination — even when an acknowledgement during the mark
// (its first chunk orders the root's call cancelled, before any deadline)
// put the ledger on the path that reads the termination first. In time
// before the deadline, refused at its instant, as before.
func TestAcknowledgementsAfterTheMarkAreJudgedOnTheDeadlineItCommitted(t *testing.T) {
	ctx := context.Background()
	s, st := chunkTestSupervisor(t, badgerstore.BadgerOptions{}, 2)
	var windowReads atomic.Int64
	l := &ledger.Ledger{Store: st, Clock: s.Clock, AckWindow: func(tx store.ReadTxn, terminationID string, now time.Time) (time.Time, error) {
		windowReads.Add(1)
		return CancelAckWindow(tx, terminationID, now)
	}}
	s.Ledger = l
	root, ids := buildTree(t, st, 10, 3)
	now := s.Clock.Now()
	callOn := map[string]string{} // node → call
	if err := st.Update(ctx, func(tx store.Txn) error {
		for _, nodeID := range []string{root, ids[4], ids[9]} {
			n, err := tree.GetNodeIn(tx, nodeID)
			if err != nil {
				return err
			}
			n.Holds |= tree.HoldsTracked | tree.HoldsCalls
			if err := tree.PutNodeIn(tx, n); err != nil {
				return err
			}
			c := &ledger.ToolCall{CallID: id.New(id.Call), NodeID: nodeID, Tool: "shell", GateID: "gate", State: ledger.CallStateInFlight, BegunAt: now}
			if err := ledger.PutCallIn(tx, c); err != nil {
				return err
			}
			if err := tx.Put(ledger.OpenCallKey(nodeID, c.CallID), nil); err != nil {
				return err
			}
			callOn[nodeID] = c.CallID
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	term, err := s.Terminate(ctx, TerminateRequest{NodeID: root, Mode: ModeAbort, CancelAckTimeout: time.Minute, Reason: "abort", RequestedBy: "operator:test"})
	if err != nil {
		t.Fatal(err)
	}
	// The roots' chunk: the root aborting, its call ordered cancelled,
	// the termination still marking (no deadline yet).
	if err := s.mark(ctx, term.ID, now); err != nil {
		t.Fatal(err)
	}
	if term, err = s.Get(ctx, term.ID); err != nil || term.Phase != PhaseRequested {
		t.Fatalf("after the roots' chunk the termination is %v (%v), want still requested", term.Phase, err)
	}
	ack := func(call string) error {
		_, err := l.CancelAck(ctx, call, "gate", "gate")
		return err
	}
	if err := ack(callOn[root]); err != nil {
		t.Fatalf("an acknowledgement while the subtree is being marked: %v", err)
	}
	for range 20 {
		if term, err = s.Get(ctx, term.ID); err != nil {
			t.Fatal(err)
		}
		if term.Phase != PhaseRequested {
			break
		}
		if err := s.mark(ctx, term.ID, now); err != nil {
			t.Fatal(err)
		}
	}
	if term.Phase != PhaseAborting || term.CancelDeadline.IsZero() {
		t.Fatalf("after the mark the termination is %s with deadline %s, want aborting with one", term.Phase, term.CancelDeadline)
	}
	windowReads.Store(0)
	if err := ack(callOn[ids[4]]); err != nil {
		t.Fatalf("an acknowledgement after the mark, before the deadline: %v", err)
	}
	s.Clock.(interface{ Advance(time.Duration) }).Advance(time.Minute)
	if err := ack(callOn[ids[9]]); !errors.Is(err, ledger.ErrAckTooLate) {
		t.Errorf("an acknowledgement at the deadline's instant: %v, want it refused as too late", err)
	}
	if n := windowReads.Load(); n != 0 {
		t.Errorf("the acknowledgements after the mark read the termination %d times; want none: the mark committed the deadline they are judged on", n)
	}
	for node, want := range map[string]ledger.CallResolution{ids[4]: ledger.CallResolutionCancelledAcked, ids[9]: 0} {
		c, err := store.Read(ctx, st, func(tx store.ReadTxn) (*ledger.ToolCall, error) { return ledger.GetCallIn(tx, callOn[node]) })
		if err != nil {
			t.Fatal(err)
		}
		if c.Resolution != want {
			t.Errorf("the call of node %s is resolved %q, want %q", node, c.Resolution, want)
		}
	}
}
