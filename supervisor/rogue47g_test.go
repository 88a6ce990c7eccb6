package supervisor

import (
	"context"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/ledger"
	"github.com/tetherhq/tether/supervisor/tree"
)

// TestRogue47GAnAcknowledgementReachesTheReconcilerAsItsCallAlone: on
// etcd, the termination reconciler watched every key of the ledger, so
// each cancel acknowledgement of a termination sent it four or five events
// (the call, its open index, its node's count of open calls where kept,
// its cancel order, the note of its end by node: 4 here), and the etcd
// member encoded and the process decoded each, though the reconciler
// moves on the call alone and dropped the others (a sixth of a
// 1,000-agent termination's watch events). It now watches the
// ledger's keys that may move a termination (ledger.TerminationPrefixes):
// the acknowledgement reaches it as its call's one event, and the
// termination still ends with the call acknowledged in its record.
func TestRogue47GAnAcknowledgementReachesTheReconcilerAsItsCallAlone(t *testing.T) {
	s, st := etcdMarkTestSupervisor(t)
	ctx, clk := context.Background(), s.Clock
	s.Ledger = &ledger.Ledger{Store: st, Clock: clk}
	all := spawnTen(t, s.Tree)
	node := all[len(all)-1]
	call := &ledger.ToolCall{CallID: id.New(id.Call), NodeID: node, Tool: "shell", GateID: "gate", State: ledger.CallStateInFlight, BegunAt: clk.Now()}
	if err := st.Update(ctx, func(tx store.Txn) error {
		n, err := tree.GetNodeIn(tx, node)
		if err != nil {
			return err
		}
		n.Holds |= tree.HoldsTracked | tree.HoldsCalls
		if err := tree.PutNodeIn(tx, n); err != nil {
			return err
		}
		if err := ledger.PutCallIn(tx, call); err != nil {
			return err
		}
		return tx.Put(ledger.OpenCallKey(node, call.CallID), nil)
	}); err != nil {
		t.Fatal(err)
	}
	term, err := s.Terminate(ctx, TerminateRequest{NodeID: all[0], Mode: ModeAbort, CancelAckTimeout: time.Minute, Reason: "acknowledged", RequestedBy: "operator:test"})
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		if term, err = s.Get(ctx, term.ID); err != nil {
			t.Fatal(err)
		}
		if term.Phase != PhaseRequested {
			break
		}
		if err := s.mark(ctx, term.ID, clk.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if term.Phase != PhaseAborting {
		t.Fatalf("after the mark the termination is %s, want aborting", term.Phase)
	}

	// The reconcile loop's watches, from here on; then the gate's
	// acknowledgement, then a key under each watched prefix, written
	// after it, which tells each watch has delivered the acknowledgement.
	prefixes := reconcilerWatches()
	watches := make([]store.Watcher, len(prefixes))
	for i, p := range prefixes {
		if watches[i], err = st.Watch(t.Context(), p); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Ledger.CancelAck(ctx, call.CallID, "gate", "gate"); err != nil {
		t.Fatal(err)
	}
	sentinel := func(p []byte) []byte { return append(append([]byte{}, p...), "zz-sentinel"...) }
	if err := st.Update(ctx, func(tx store.Txn) error {
		for _, p := range prefixes {
			if err := tx.Put(sentinel(p), nil); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var delivered []string
	guard := time.NewTimer(time.Minute) // against a hang only
	defer guard.Stop()
	for i, w := range watches {
		for done := false; !done; {
			select {
			case batch, ok := <-w.Events():
				if !ok {
					t.Fatalf("the watch of %q ended", prefixes[i])
				}
				for _, ev := range batch {
					if string(ev.Key) == string(sentinel(prefixes[i])) {
						done = true
						continue
					}
					delivered = append(delivered, string(ev.Key))
				}
			case <-guard.C:
				t.Fatalf("the watch of %q did not deliver its sentinel", prefixes[i])
			}
		}
	}
	if len(delivered) != 1 || delivered[0] != string(ledger.CallKey(call.CallID)) {
		t.Errorf("the acknowledgement reached the reconciler's watches as %d events %q; want its call's one", len(delivered), delivered)
	}
	if err := st.Update(ctx, func(tx store.Txn) error {
		for _, p := range prefixes {
			if err := tx.Delete(sentinel(p)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	term = reconcileToEnd(t, s, term.ID)
	checkRecord(t, s, term, all)
	c, err := store.Read(ctx, st, func(tx store.ReadTxn) (*ledger.ToolCall, error) { return ledger.GetCallIn(tx, call.CallID) })
	if err != nil {
		t.Fatal(err)
	}
	if c.Resolution != ledger.CallResolutionCancelledAcked {
		t.Errorf("the call is resolved %q, want %q", c.Resolution, ledger.CallResolutionCancelledAcked)
	}
}
