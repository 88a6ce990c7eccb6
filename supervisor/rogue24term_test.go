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

// The twenty-fourth hostile pass over termination: what the record says of
// a call when one stop takes a node over from another.

// TestACallEndingWhileAnAncestorsStopTakesItsNodeOverIsInThatStopsRecord:
// an operator drains C (T1), whose call X is in flight; T1 marks C and
// waits for X. Another operator then aborts C's tree from its root G (T2,
// which supersedes T1 and takes C over when its mark gets there). X's gate
// ends it after T2's request and before T2's mark reaches C: X was in
// flight when T2 was requested, and T2 is the stop that accounts for C in
// the end (T1's record says C is superseded by T2). T2's record lists X,
// with the gate's resolution; T1's does not (each call is in one record),
// as for a call still open when T2's mark takes C over. A call of C that
// ended before T2 was requested stays in T1's record, which it ended
// under.
//
// Driven by hand (on Badger), as in rogue22_test.go: through the server
// the one reconcile loop would have to hold T2's mark while the gate ends
// the call, with T1 free to finish.
func TestACallEndingWhileAnAncestorsStopTakesItsNodeOverIsInThatStopsRecord(t *testing.T) {
	ctx := context.Background()
	s, st := chunkTestSupervisor(t, badgerstore.BadgerOptions{}, 1)
	clk := s.Clock.(*clock.Manual)
	l := &ledger.Ledger{Store: st, Clock: clk}
	g, _, c := operatorChain(t, s)
	// Three calls of C in flight through the gate: one ends before T2's
	// request, one between T2's request and its mark at C, one stays open
	// until T2's mark (which moves it, as before).
	early, between, open := openCall(t, st, c.NodeID, clk.Now()), openCall(t, st, c.NodeID, clk.Now()), openCall(t, st, c.NodeID, clk.Now())

	inner, err := s.Terminate(ctx, TerminateRequest{NodeID: c.NodeID, Mode: ModeDrain, DrainWindow: time.Hour, ConfirmTimeout: time.Hour, Reason: "drain c", RequestedBy: "operator:one"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.mark(ctx, inner.ID, clk.Now()); err != nil {
		t.Fatal(err)
	}
	if cn, err := s.Tree.Get(ctx, c.NodeID); err != nil || cn.State != tree.NodeStateDraining || cn.TerminationID != inner.ID {
		t.Fatalf("C after T1's mark: %v, %v; want draining under T1", cn, err)
	}
	clk.Advance(time.Second)
	if _, err := l.End(ctx, early, "gate", "tool:gate", false, ""); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Second)
	outer, err := s.Terminate(ctx, TerminateRequest{NodeID: g.NodeID, Mode: ModeAbort, CancelAckTimeout: time.Minute, ConfirmTimeout: time.Minute, Reason: "stop the tree", RequestedBy: "operator:two"})
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Second)
	if _, err := l.End(ctx, between, "gate", "tool:gate", true, "disk full"); err != nil {
		t.Fatal(err)
	}
	// T2 marks, takes C over, and finishes (C's open call is ordered
	// cancelled and never acknowledged: closed by the record).
	outer = reconcileAsTimePasses(t, s, outer.ID)
	inner = reconcileAsTimePasses(t, s, inner.ID)

	listed := map[string]map[string]int{} // termination -> call -> times listed
	for _, term := range []Termination{inner, outer} {
		rec, err := s.Record(ctx, "", term.ID)
		if err != nil {
			t.Fatal(err)
		}
		listed[term.ID] = map[string]int{}
		for _, rc := range rec.ToolCalls {
			listed[term.ID][rc.CallID]++
			if rc.CallID == between && rc.Resolution != ledger.CallResolutionFailed {
				t.Errorf("%s's record lists the call ended between T2's request and its mark as %s, want the gate's failed", term.ID, rc.Resolution)
			}
		}
		if term.ID == outer.ID {
			for _, rn := range rec.Nodes {
				if rn.NodeID == c.NodeID && rn.InnerTerminationID != inner.ID {
					t.Errorf("T2's record lists C taken over from %q, want T1 %s", rn.InnerTerminationID, inner.ID)
				}
			}
		}
	}
	for _, want := range []struct {
		name, call, term string
	}{
		{"ended before T2's request", early, inner.ID},
		{"ended between T2's request and its mark", between, outer.ID},
		{"open at T2's mark", open, outer.ID},
	} {
		in, other := listed[want.term][want.call], 0
		for term, calls := range listed {
			if term != want.term {
				other += calls[want.call]
			}
		}
		if in != 1 || other != 0 {
			t.Errorf("the call %s is listed %d times in the record of %s and %d times in the other, want once in it and in no other", want.name, in, want.term, other)
		}
	}
}

// operatorChain registers an operator's root G, its agent P and P's agent
// C: the chain the supersession tests stop from either end.
func operatorChain(t *testing.T, s *Supervisor) (g, p, c *tree.Node) {
	t.Helper()
	ctx := context.Background()
	g, err := s.Tree.RegisterRoot(ctx, "ops", nil, "operator:admin")
	if err != nil {
		t.Fatal(err)
	}
	if p, err = s.Tree.Spawn(ctx, g.NodeID, "p", nil, "agent:"+g.NodeID, nil); err != nil {
		t.Fatal(err)
	}
	if c, err = s.Tree.Spawn(ctx, p.NodeID, "c", nil, "agent:"+p.NodeID, nil); err != nil {
		t.Fatal(err)
	}
	return g, p, c
}

// openCall writes a call of nodeID in flight through "gate", as a gate's
// BeginCall does (the node noted as holding calls), and returns its id.
func openCall(t *testing.T, st store.Store, nodeID string, now time.Time) string {
	t.Helper()
	c := &ledger.ToolCall{CallID: id.New(id.Call), NodeID: nodeID, Tool: "shell", GateID: "gate", State: ledger.CallStateInFlight, BegunAt: now, BegunBy: "tool:gate"}
	if err := st.Update(context.Background(), func(tx store.Txn) error {
		n, err := tree.GetNodeIn(tx, nodeID)
		if err != nil {
			return err
		}
		if err := tree.NoteHoldingIn(tx, n, tree.HoldsCalls); err != nil {
			return err
		}
		if err := ledger.PutCallIn(tx, c); err != nil {
			return err
		}
		return tx.Put(ledger.OpenCallKey(nodeID, c.CallID), []byte("gate"))
	}); err != nil {
		t.Fatal(err)
	}
	return c.CallID
}

// reconcileAsTimePasses reconciles the termination until it is terminated,
// the clock a minute later at each pass (its waits run out).
func reconcileAsTimePasses(t *testing.T, s *Supervisor, termID string) Termination {
	t.Helper()
	return reconcileUntilTerminated(t, s, termID, 1000, func() { s.Clock.(*clock.Manual).Advance(time.Minute) })
}

// TestACallEndingBeforeEitherStopMarksItsNodeIsInTheRecordOfTheOneThatDoes:
// an operator drains C (T1, requested, not yet marked), then another
// aborts C's tree from its root G (T2, which supersedes T1). C's call X
// ends before either has marked C: the ledger put it on the account of
// the request nearest C, T1's. T2 marks C first and accounts for it in the
// end (T1 then finds C T2's and lists it superseded, or, once T2 is done,
// terminated by T2's record): X was in flight when T2 was requested, and
// T2's record lists it, T1's not.
func TestACallEndingBeforeEitherStopMarksItsNodeIsInTheRecordOfTheOneThatDoes(t *testing.T) {
	ctx := context.Background()
	s, st := chunkTestSupervisor(t, badgerstore.BadgerOptions{}, 1)
	clk := s.Clock.(*clock.Manual)
	l := &ledger.Ledger{Store: st, Clock: clk}
	g, _, c := operatorChain(t, s)
	x := openCall(t, st, c.NodeID, clk.Now())
	inner, err := s.Terminate(ctx, TerminateRequest{NodeID: c.NodeID, Mode: ModeDrain, DrainWindow: time.Hour, ConfirmTimeout: time.Hour, Reason: "drain c", RequestedBy: "operator:one"})
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Second)
	outer, err := s.Terminate(ctx, TerminateRequest{NodeID: g.NodeID, Mode: ModeAbort, CancelAckTimeout: time.Minute, ConfirmTimeout: time.Minute, Reason: "stop the tree", RequestedBy: "operator:two"})
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Second)
	if _, err := l.End(ctx, x, "gate", "tool:gate", false, ""); err != nil {
		t.Fatal(err)
	}
	outer = reconcileAsTimePasses(t, s, outer.ID)
	inner = reconcileAsTimePasses(t, s, inner.ID)
	counts := map[string]int{}
	for _, term := range []Termination{inner, outer} {
		rec, err := s.Record(ctx, "", term.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, rc := range rec.ToolCalls {
			if rc.CallID == x {
				counts[term.ID]++
			}
		}
	}
	if counts[outer.ID] != 1 || counts[inner.ID] != 0 {
		t.Fatalf("the call is listed %d times in the record of T2, which marked C, and %d times in T1's; want once in T2's only", counts[outer.ID], counts[inner.ID])
	}
}

// TestARefusalCountIsShownWhereTheRefusalsAreListed: the refused calls a
// stop lists are its own whoever accounts for the node in the end, and so
// is its count of the ones it refused past them: T1 (requested on C)
// refused C's calls and counted 5 more than it lists, then T2 (requested
// on C's root, superseding it) marked and terminated C first. T1's record
// lists C as terminated by T2 and lists its refusals; its entry for C
// shows the count too.
func TestARefusalCountIsShownWhereTheRefusalsAreListed(t *testing.T) {
	ctx := context.Background()
	s, st := chunkTestSupervisor(t, badgerstore.BadgerOptions{}, 1)
	g, err := s.Tree.RegisterRoot(ctx, "ops", nil, "operator:admin")
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.Tree.Spawn(ctx, g.NodeID, "c", nil, "agent:"+g.NodeID, nil)
	if err != nil {
		t.Fatal(err)
	}
	inner, err := s.Terminate(ctx, TerminateRequest{NodeID: c.NodeID, Mode: ModeDrain, DrainWindow: time.Hour, ConfirmTimeout: time.Hour, Reason: "drain c", RequestedBy: "operator:one"})
	if err != nil {
		t.Fatal(err)
	}
	// What the ledger writes once it has listed the node's first refusals
	// for T1 (ledger.Begin): the count, and the node's note of it.
	if err := st.Update(ctx, func(tx store.Txn) error {
		n, err := tree.GetNodeIn(tx, c.NodeID)
		if err != nil {
			return err
		}
		if err := tree.NoteHoldingIn(tx, n, tree.HoldsRefusalCount); err != nil {
			return err
		}
		return tx.Put(ledger.RefusedMoreKey(inner.ID, c.NodeID), []byte("5"))
	}); err != nil {
		t.Fatal(err)
	}
	outer, err := s.Terminate(ctx, TerminateRequest{NodeID: g.NodeID, Mode: ModeAbort, CancelAckTimeout: time.Minute, ConfirmTimeout: time.Minute, Reason: "stop the tree", RequestedBy: "operator:two"})
	if err != nil {
		t.Fatal(err)
	}
	reconcileAsTimePasses(t, s, outer.ID)
	inner = reconcileAsTimePasses(t, s, inner.ID)
	rec, err := s.Record(ctx, "", inner.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, rn := range rec.Nodes {
		if rn.NodeID != c.NodeID {
			continue
		}
		if rn.InnerTerminationID != outer.ID || rn.RefusedCallsNotListed != 5 {
			t.Fatalf("T1's record lists C terminated by %q with %d refused calls not listed, want by T2 %s with T1's count, 5", rn.InnerTerminationID, rn.RefusedCallsNotListed, outer.ID)
		}
		return
	}
	t.Fatal("T1's record does not list C")
}
