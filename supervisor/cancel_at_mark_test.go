package supervisor

import (
	"context"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	"github.com/tetherhq/tether/supervisor/ledger"
	"github.com/tetherhq/tether/supervisor/tree"
)

// An abort's mark orders the cancel of the calls of the nodes it turns
// aborting, and the cancel step then reads no call (CancelsOrderedAtMark);
// but an exited node keeps its state, so a call it left in flight is not
// ordered cancelled at the mark, and the cancel step must still order it.
func TestTheCancelStepOrdersTheCallsTheMarkLeftInFlight(t *testing.T) {
	ctx := context.Background()
	s, st := chunkTestSupervisor(t, badgerstore.BadgerOptions{}, 4)
	root, ids := buildTree(t, st, 10, 3)
	now := s.Clock.Now()
	calls := map[string]string{} // call id → node
	if err := st.Update(ctx, func(tx store.Txn) error {
		for i, nodeID := range []string{ids[2], ids[7]} {
			n, err := tree.GetNodeIn(tx, nodeID)
			if err != nil {
				return err
			}
			n.Holds |= tree.HoldsTracked | tree.HoldsCalls
			if i == 1 {
				n.State = tree.NodeStateExited // exited with a call still open
			}
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
			calls[c.CallID] = nodeID
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	term, err := s.Terminate(ctx, TerminateRequest{NodeID: root, Mode: ModeAbort, CancelAckTimeout: time.Minute, Reason: "abort", RequestedBy: "operator:test"})
	if err != nil {
		t.Fatal(err)
	}
	// Up to the wait for acknowledgements: the mark and the cancel step.
	for range 100 {
		if _, err := s.Reconcile(ctx, term.ID); err != nil {
			t.Fatal(err)
		}
		if term, err = s.Get(ctx, term.ID); err != nil {
			t.Fatal(err)
		}
		if term.Phase == PhaseAborting && term.CancelsSent {
			break
		}
	}
	if term.Phase != PhaseAborting || !term.CancelsSent {
		t.Fatalf("the termination is %s (cancels sent: %v), want aborting with its cancels sent", term.Phase, term.CancelsSent)
	}
	if term.CancelsOrderedAtMark {
		t.Error("the mark says it ordered every cancel, though it left the exited node's call in flight")
	}
	for callID, nodeID := range calls {
		c, err := store.Read(ctx, st, func(tx store.ReadTxn) (*ledger.ToolCall, error) { return ledger.GetCallIn(tx, callID) })
		if err != nil {
			t.Fatal(err)
		}
		if c.State != ledger.CallStateCancelRequested || c.TerminationID != term.ID {
			t.Errorf("the call of node %s is %s (termination %q) once the cancels are sent, want cancel requested by %s", nodeID, c.State, c.TerminationID, term.ID)
		}
	}
}
