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

// A drain that outlasts its window escalates: the same pass orders the
// calls still in flight cancelled and must then wait for their
// acknowledgements. While the drain waited, the reconciler kept the calls'
// states in memory (callcache.go), moved forward only as the loop's watch
// delivers each change. A pass that read them right after its own cancel
// orders committed, before their events arrived, found "in flight" —
// which is no pending cancel — and revoked and reconciled at once: the
// gate's acknowledgement, however prompt, was then refused and the record
// said cancel_unacknowledged. The watch here delivers nothing (as one
// that lags), which the cache must survive: a state of its own making is
// not waited for from the watch.
func TestAnEscalationWaitsForItsCancelsWhateverTheWatchHasDelivered(t *testing.T) {
	for _, mode := range []Mode{ModeDrain, ModeAbort} {
		t.Run(mode.String(), func(t *testing.T) {
			ctx := context.Background()
			s, st := chunkTestSupervisor(t, badgerstore.BadgerOptions{}, 4)
			root, ids := buildTree(t, st, 3, 3)
			now := s.Clock.Now()
			callID := id.New(id.Call)
			node := ids[2]
			if err := st.Update(ctx, func(tx store.Txn) error {
				n, err := tree.GetNodeIn(tx, node)
				if err != nil {
					return err
				}
				n.Holds |= tree.HoldsTracked | tree.HoldsCalls
				if mode == ModeAbort {
					// An exited node keeps its state: its call is ordered
					// cancelled by the cancel step, not the mark.
					n.State = tree.NodeStateExited
				}
				if err := tree.PutNodeIn(tx, n); err != nil {
					return err
				}
				c := &ledger.ToolCall{CallID: callID, NodeID: node, Tool: "shell", GateID: "gate", State: ledger.CallStateInFlight, BegunAt: now}
				if err := ledger.PutCallIn(tx, c); err != nil {
					return err
				}
				return tx.Put(ledger.OpenCallKey(node, callID), nil)
			}); err != nil {
				t.Fatal(err)
			}
			s.calls.reset() // the loop's watches are up; none of their events is delivered
			term, err := s.Terminate(ctx, TerminateRequest{NodeID: root, Mode: mode, DrainWindow: 10 * time.Second, CancelAckTimeout: time.Hour, ConfirmTimeout: time.Hour, Reason: "stop", RequestedBy: "operator:test"})
			if err != nil {
				t.Fatal(err)
			}
			waitingPhase := PhaseDraining
			if mode == ModeAbort {
				waitingPhase = PhaseAborting
			}
			// Up to the wait: the drain's for its call, or the abort's
			// first look at its calls (before the cancel step).
			for range 100 {
				if _, err := s.Reconcile(ctx, term.ID); err != nil {
					t.Fatal(err)
				}
				if term, err = s.Get(ctx, term.ID); err != nil {
					t.Fatal(err)
				}
				if term.Phase != PhaseRequested {
					break
				}
			}
			if term.Phase != waitingPhase {
				t.Fatalf("the termination is %s, want %s", term.Phase, waitingPhase)
			}
			if mode == ModeDrain {
				s.Clock.(*clock.Manual).Advance(10 * time.Second) // the window runs out
				if _, err := s.Reconcile(ctx, term.ID); err != nil {
					t.Fatal(err)
				}
				if term, err = s.Get(ctx, term.ID); err != nil {
					t.Fatal(err)
				}
			}
			c, err := store.Read(ctx, st, func(tx store.ReadTxn) (*ledger.ToolCall, error) { return ledger.GetCallIn(tx, callID) })
			if err != nil {
				t.Fatal(err)
			}
			if c.State != ledger.CallStateCancelRequested {
				t.Fatalf("the call is %s, want its cancel ordered", c.State)
			}
			if term.Phase != PhaseAborting || term.Revoked {
				t.Fatalf("with the call's cancel unacknowledged and an hour to acknowledge it, the termination is %s (revoked: %v), want aborting, waiting", term.Phase, term.Revoked)
			}
		})
	}
}
