package supervisor

import (
	"context"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	"github.com/tetherhq/tether/supervisor/tree"
)

// TestAnAncestorUnderAnUnmarkedStopIsNoWitness: an operator's stop T1 of C
// waits for word of C's exit. An operator then stops the tree's root G,
// whose mark has not reached C's parent P (requested and not begun, or
// the roots' chunk alone committed). P vouches for C: it read as running
// outside every stop, so its word was an attestation and T1's record said
// C CONFIRMED by P, though P is the workload of the stop that covers it.
// Now P's word is a claim: C is unaccounted (the control plane never saw
// C's session end), P's claim shown.
//
// The reconciler is driven by hand (on Badger): through the server, one
// reconcile loop serves both terminations, and no hook can hold G's mark
// at P while T1's record is written without holding T1 too.
func TestAnAncestorUnderAnUnmarkedStopIsNoWitness(t *testing.T) {
	for _, tc := range []struct {
		name   string
		marked bool // G's roots' chunk has committed
	}{{"requested", false}, {"roots marked", true}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			s, _ := chunkTestSupervisor(t, badgerstore.BadgerOptions{}, 1)
			g, p, c := operatorChain(t, s)
			inner, err := s.Terminate(ctx, TerminateRequest{NodeID: c.NodeID, Mode: ModeAbort, ConfirmTimeout: time.Hour, Reason: "stop c", RequestedBy: "operator:one"})
			if err != nil {
				t.Fatal(err)
			}
			// Up to the wait for C's exit.
			for range 100 {
				if _, err := s.Reconcile(ctx, inner.ID); err != nil {
					t.Fatal(err)
				}
				if inner, err = s.Get(ctx, inner.ID); err != nil {
					t.Fatal(err)
				}
				if inner.Phase == PhaseReconciling && inner.Revoked {
					break
				}
			}
			if inner.Phase != PhaseReconciling {
				t.Fatalf("the stop of C is %s, want reconciling (waiting for C's exit)", inner.Phase)
			}
			outer, err := s.Terminate(ctx, TerminateRequest{NodeID: g.NodeID, Mode: ModeDrain, DrainWindow: time.Minute, Reason: "stop the tree", RequestedBy: "operator:two"})
			if err != nil {
				t.Fatal(err)
			}
			if tc.marked {
				if err := s.mark(ctx, outer.ID, s.Clock.Now()); err != nil {
					t.Fatal(err)
				}
				gn, err := s.Tree.Get(ctx, g.NodeID)
				if err != nil {
					t.Fatal(err)
				}
				pn, err := s.Tree.Get(ctx, p.NodeID)
				if err != nil {
					t.Fatal(err)
				}
				if gn.State != tree.NodeStateDraining || pn.State != tree.NodeStateRunning {
					t.Fatalf("after the roots' chunk G is %s and P %s, want draining and running", tree.StateName(gn.State), tree.StateName(pn.State))
				}
			}
			if _, err := s.Tree.ConfirmExit(ctx, c.NodeID, "agent:"+p.NodeID, tree.ConfirmedByAncestor, "gone", nil); err != nil {
				t.Fatal(err)
			}
			// P's word now settles nothing: the record waits for the
			// confirm timeout.
			s.Clock.(*clock.Manual).Advance(2 * time.Hour)
			inner = reconcileToEnd(t, s, inner.ID)
			rec, err := s.Record(ctx, "", inner.ID)
			if err != nil {
				t.Fatal(err)
			}
			var got *RecordNode
			for i := range rec.Nodes {
				if rec.Nodes[i].NodeID == c.NodeID {
					got = &rec.Nodes[i]
				}
			}
			if got == nil {
				t.Fatal("C is not in its stop's record")
			}
			if got.Outcome != NodeOutcomeUnaccounted {
				t.Fatalf("C is %s (by %q) on the word of P, which the operator's unmarked stop %s covers; want unaccounted", got.Outcome, got.ConfirmedBy, outer.ID)
			}
			if got.ClaimedBy != "agent:"+p.NodeID+" (ancestor)" {
				t.Fatalf("C's entry shows the claim of %q, want P's", got.ClaimedBy)
			}
		})
	}
}
