package supervisor

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	"github.com/tetherhq/tether/supervisor/tree"
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

// TestRogue39JAStoppedRoguesHeartbeatsDoNotKickTheStopsBelowIt: a rogue
// agent a, itself draining, keeps stops of its own children unfinished
// (each waiting a day for confirmations they never send), and keeps a
// session whose heartbeat writes its node every LastSeenEvery. A node
// that is stopped, or whose exit is confirmed, kicks the terminations
// rooted below it (its word about a member's exit turns into a claim);
// until the thirty-ninth pass it kicked every one of them at each of its
// writes, though being stopped is for good: each heartbeat of the rogue
// cost a reconcile of each of its stops, as many as it cared to keep. Now
// each is kicked once for it; a stop placed below it later, at its next
// write.
func TestRogue39JAStoppedRoguesHeartbeatsDoNotKickTheStopsBelowIt(t *testing.T) {
	const stops = 50
	var places []terminationPlace
	for i := range stops {
		places = append(places, terminationPlace{ID: fmt.Sprintf("t%d", i), NodeID: fmt.Sprintf("c%d", i)})
	}
	var k terminationKicks
	k.reset(places)
	for _, p := range places {
		k.place(p.ID, []string{"r", "a"})
	}
	kicks := map[string]int{}
	write := func(n tree.Node) {
		t.Helper()
		b, err := tree.MarshalNode(&n)
		if err != nil {
			t.Fatal(err)
		}
		k.changed([]store.Event{{Type: store.EventPut, Key: tree.NodeKey(n.NodeID), Value: b}},
			func(id string) { kicks[id]++ }, func(string) { t.Fatal("nothing finished") })
	}
	seen := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a := tree.Node{NodeID: "a", Ancestors: []string{"r"}, State: tree.NodeStateDraining, TerminationID: "other"}
	write(a) // a is stopped: each stop below it is kicked
	for i := range 10 {
		a.LastSeenAt, a.LastSeenSeq = seen.Add(time.Duration(i)*tree.LastSeenEvery), uint64(i+1)
		write(a) // its heartbeats
	}
	a.State = tree.NodeStateAborting
	write(a)
	for _, p := range places {
		if kicks[p.ID] != 1 {
			t.Fatalf("the rogue's stop %s was kicked %d times by 12 writes of its stopped ancestor (%d kicks in all for %d stops), want once", p.ID, kicks[p.ID], sumKicks(kicks), stops)
		}
	}

	// A stop placed below a later is kicked at a's next write, once; the
	// stopped r above both kicks each of them once too.
	k.addLocked(terminationPlace{ID: "late", NodeID: "d"})
	k.place("late", []string{"r", "a"})
	clear(kicks)
	write(a)
	write(a)
	if len(kicks) != 1 || kicks["late"] != 1 {
		t.Fatalf("two writes of a after a stop was placed below it kicked %v, want the new stop once", kicks)
	}
	clear(kicks)
	write(tree.Node{NodeID: "r", State: tree.NodeStateDraining, TerminationID: "other"})
	write(tree.Node{NodeID: "r", State: tree.NodeStateDraining, TerminationID: "other", LastSeenSeq: 1})
	if len(kicks) != stops+1 || sumKicks(kicks) != stops+1 {
		t.Fatalf("two writes of the stopped r kicked %d stops %d times, want each of %d once", len(kicks), sumKicks(kicks), stops+1)
	}

	// A node seen neither stopped nor confirmed is kicked for again once
	// it is (an exit confirmation undone, should one be).
	clear(kicks)
	x := tree.Node{NodeID: "r", State: tree.NodeStateRunning, ExitedAt: seen}
	k.reset(places)
	for _, p := range places {
		k.place(p.ID, []string{"r", "a"})
	}
	write(x)
	x.ExitedAt = time.Time{}
	write(x)
	x.ExitedAt = seen
	write(x)
	if len(kicks) != stops || sumKicks(kicks) != 2*stops {
		t.Fatalf("r confirmed, unconfirmed and confirmed again kicked %d stops %d times, want each of %d twice", len(kicks), sumKicks(kicks), stops)
	}

	// A rescan forgets what was kicked (and kicks every one itself).
	k.reset(places)
	for _, p := range places {
		k.place(p.ID, []string{"r", "a"})
	}
	clear(kicks)
	write(a)
	if len(kicks) != stops {
		t.Fatalf("a's write after a rescan kicked %d of the %d stops below it", len(kicks), stops)
	}
}

func sumKicks(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
