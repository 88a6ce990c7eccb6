package supervisor

import (
	"context"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	"github.com/tetherhq/tether/supervisor/ledger"
)

// TestACallIsListedOnceWhateverOrderThreeStopsFinishIn: from the review of
// the twenty-fourth pass. C drains under T1 (marked), with calls X and Y in
// flight; an operator aborts P (T2, requested), X ends, another aborts G
// (T3, requested), Y ends. Whatever order the three are reconciled in,
// each call is in exactly one record, and no note of a call that ended on
// a termination's account (calls/endedon/<node>/) is left once all three
// records are written.
func TestACallIsListedOnceWhateverOrderThreeStopsFinishIn(t *testing.T) {
	for _, order := range []string{"321", "312", "123", "231", "213", "132"} {
		t.Run(order, func(t *testing.T) {
			ctx := context.Background()
			s, st := chunkTestSupervisor(t, badgerstore.BadgerOptions{}, 1)
			clk := s.Clock.(*clock.Manual)
			l := &ledger.Ledger{Store: st, Clock: clk}
			g, p, c := operatorChain(t, s)
			x, y := openCall(t, st, c.NodeID, clk.Now()), openCall(t, st, c.NodeID, clk.Now())
			t1, err := s.Terminate(ctx, TerminateRequest{NodeID: c.NodeID, Mode: ModeDrain, DrainWindow: time.Hour, ConfirmTimeout: time.Hour, Reason: "1", RequestedBy: "operator:one"})
			if err != nil {
				t.Fatal(err)
			}
			if err := s.mark(ctx, t1.ID, clk.Now()); err != nil {
				t.Fatal(err)
			}
			clk.Advance(time.Second)
			t2, err := s.Terminate(ctx, TerminateRequest{NodeID: p.NodeID, Mode: ModeAbort, CancelAckTimeout: time.Minute, ConfirmTimeout: time.Minute, Reason: "2", RequestedBy: "operator:two"})
			if err != nil {
				t.Fatal(err)
			}
			clk.Advance(time.Second)
			if _, err := l.End(ctx, x, "gate", "tool:gate", false, ""); err != nil {
				t.Fatal(err)
			}
			clk.Advance(time.Second)
			t3, err := s.Terminate(ctx, TerminateRequest{NodeID: g.NodeID, Mode: ModeAbort, CancelAckTimeout: time.Minute, ConfirmTimeout: time.Minute, Reason: "3", RequestedBy: "operator:three"})
			if err != nil {
				t.Fatal(err)
			}
			clk.Advance(time.Second)
			if _, err := l.End(ctx, y, "gate", "tool:gate", false, ""); err != nil {
				t.Fatal(err)
			}
			ids := map[byte]string{'1': t1.ID, '2': t2.ID, '3': t3.ID}
			for i := range order {
				reconcileAsTimePasses(t, s, ids[order[i]])
			}
			for _, id := range ids {
				reconcileAsTimePasses(t, s, id)
			}
			count := map[string]int{}
			where := map[string][]string{}
			for k, id := range ids {
				rec, err := s.Record(ctx, "", id)
				if err != nil {
					t.Fatal(err)
				}
				for _, rc := range rec.ToolCalls {
					count[rc.CallID]++
					where[rc.CallID] = append(where[rc.CallID], string(k))
				}
			}
			for name, cid := range map[string]string{"x": x, "y": y} {
				if count[cid] != 1 {
					t.Errorf("call %s listed %d times (%v)", name, count[cid], where[cid])
				}
			}
			// No note of an ended call is left.
			n := 0
			if err := st.View(ctx, func(tx store.ReadTxn) error {
				n = 0
				return tx.Scan(ledger.EndedOnPrefix(c.NodeID), nil, func(_, _ []byte) error { n++; return nil })
			}); err != nil {
				t.Fatal(err)
			}
			if n != 0 {
				t.Errorf("%d endedon notes left", n)
			}
		})
	}
}
