package supervisor

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/store/badgerstore"
)

// TestRogue39JManyOwnStopsDoNotGrowTheOperatorsTermination: a rogue agent
// R drains its child A's subtree with a day's windows, then aborts each of
// A's children on a stop of its own (each takes its node over from the
// drain), and leaves every one of them unfinished (each waits a day for
// its exit confirmation). An operator then aborts R's subtree, taking
// every node over. Until the thirty-ninth pass a termination named every
// other termination it took nodes over from (TookOverFrom), and every one
// that took nodes from it (SupersededBy), in its stored value, rewritten
// with each chunk and step and sent whole by GetTermination: the list,
// and a slices.Contains over it per node the mark lists, grew with the
// rogue's stops, which nothing bounds (about 40,000 of them past the
// store's 1 MB value: the operator's mark could no longer be written, and
// the operator's stop stalled at that chunk for ever). Now each names at
// most MaxNamedTerminations; the record still names, node by node, the
// termination each node was taken over from.
func TestRogue39JManyOwnStopsDoNotGrowTheOperatorsTermination(t *testing.T) {
	s, _ := chunkTestSupervisor(t, badgerstore.BadgerOptions{}, 100)
	ctx := context.Background()
	clk := s.Clock.(interface {
		Now() time.Time
		Advance(time.Duration)
	})
	root, err := s.Tree.RegisterRoot(ctx, "rogue", nil, "operator:test")
	if err != nil {
		t.Fatal(err)
	}
	rogue := "agent:" + root.NodeID
	a, err := s.Tree.Spawn(ctx, root.NodeID, "a", nil, rogue, nil)
	if err != nil {
		t.Fatal(err)
	}
	const children = MaxNamedTerminations + 8
	var kids []string
	for range children {
		c, err := s.Tree.Spawn(ctx, a.NodeID, "child", nil, "agent:"+a.NodeID, nil)
		if err != nil {
			t.Fatal(err)
		}
		kids = append(kids, c.NodeID)
	}
	// stop requests a stop of R's with a day's windows and runs it as far
	// as it goes without the clock: to its wait for exit confirmations.
	stop := func(node string, mode Mode) Termination {
		t.Helper()
		term, err := s.Terminate(ctx, TerminateRequest{NodeID: node, Mode: mode, Reason: "rogue39j",
			DrainWindow: MaxTerminationWindow, CancelAckTimeout: MaxTerminationWindow, ConfirmTimeout: MaxTerminationWindow,
			RequestedBy: rogue, RequesterNodeID: root.NodeID})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Reconcile(ctx, term.ID); err != nil {
			t.Fatal(err)
		}
		if term, err = s.Get(ctx, term.ID); err != nil {
			t.Fatal(err)
		}
		if term.Phase != PhaseReconciling {
			t.Fatalf("the rogue's stop of %s is %s, want it waiting in reconciling", node, term.Phase)
		}
		return term
	}
	drain := stop(a.NodeID, ModeDrain)
	owner := map[string]string{a.NodeID: drain.ID}
	for _, k := range kids {
		owner[k] = stop(k, ModeAbort).ID
	}
	if drain, err = s.Get(ctx, drain.ID); err != nil {
		t.Fatal(err)
	}
	if got := drain.HandedOverCount(); got != children {
		t.Fatalf("the rogue's drain handed %d nodes over, want %d", got, children)
	}
	if got := len(drain.SupersededByIDs()); got > MaxNamedTerminations {
		t.Errorf("the rogue's drain names %d terminations that took its nodes over (one per stop the rogue made), want at most %d", got, MaxNamedTerminations)
	}

	op, err := s.Terminate(ctx, TerminateRequest{NodeID: root.NodeID, Mode: ModeAbort, Reason: "rogue39j",
		CancelAckTimeout: time.Second, ConfirmTimeout: time.Second, RequestedBy: "operator:test"})
	if err != nil {
		t.Fatal(err)
	}
	op = reconcileUntilTerminated(t, s, op.ID, 50, func() { clk.Advance(time.Second) })
	if got := op.Counts.TakenOver; got != children+1 {
		t.Fatalf("the operator's stop took %d nodes over, want %d", got, children+1)
	}
	if got := len(op.TookOverFromIDs()); got > MaxNamedTerminations {
		raw, _ := json.Marshal(op)
		t.Errorf("the operator's stop names %d terminations it took nodes over from (one per stop the rogue made; its stored value %d bytes, and growing with each), want at most %d", got, len(raw), MaxNamedTerminations)
	}
	rec, err := s.Record(ctx, "", op.ID)
	if err != nil {
		t.Fatal(err)
	}
	named := 0
	for _, n := range rec.Nodes {
		if want, ok := owner[n.NodeID]; ok {
			if n.InnerTerminationID != want {
				t.Errorf("the record gives node %s inner termination %q, want %s", n.NodeID, n.InnerTerminationID, want)
			}
			named++
		}
	}
	if named != children+1 {
		t.Errorf("the record lists %d of the %d nodes taken over", named, children+1)
	}
}
