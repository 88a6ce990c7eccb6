package stoprule

import (
	"context"
	"fmt"
	"testing"

	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/ledger"
	"github.com/tetherhq/tether/supervisor/tree"
)

// The thirty-ninth hostile pass, stop rules: the rogue under a rule on its
// subtree's peak of calls in flight bursts in the gap between the moment
// the evaluator learns that a count is to start and the snapshot the
// count starts from.

// TestRogue39FABurstBeforeTheCountsSnapshotIsSeen: the evaluator learns
// that a node's count of its subtree's calls in flight is to start (a new
// leader's scan finds a rule reading the peak, or the evaluator reads a
// rule attached meanwhile), and starts it only later, from a snapshot of
// the node's records (startPeaks, after it has taken what its watches
// hold, up to 256 counts a round of its loop), skipping every change its
// watch handed it before that snapshot. A rogue that began a burst of six
// calls across its children and ended it in that gap — right after a
// leader change, or right after its operator attached the rule — was
// counted from the level after it, 0, and the rule never fired. Now the
// evaluator keeps the changes of a count it is to start, from the
// revision it learnt of it, and the count starts from its snapshot at
// the highest level those changes reached (each record's value before
// its first change taken as none: never above the true level, so an
// honest tree's workers peaking one after another still read their
// peak, not their sum).
func TestRogue39FABurstBeforeTheCountsSnapshotIsSeen(t *testing.T) {
	rogue39fBurstBeforeSnapshot(t, newRogue31cRig(t))
}

// TestRogue39FABurstBeforeTheCountsSnapshotIsSeenOnEtcd is the same on
// etcd.
func TestRogue39FABurstBeforeTheCountsSnapshotIsSeenOnEtcd(t *testing.T) {
	rogue39fBurstBeforeSnapshot(t, newRogue35kEtcdRig(t))
}

func rogue39fBurstBeforeSnapshot(t *testing.T, g *rogue31cRig) {
	w := newRogue38fWorld(t, g)
	ctx := context.Background()
	r := g.rules
	// An honest worker has a call open as the leader changes, which it
	// ends in the gap before its workers' work (its tree's level never
	// above three).
	held := g.openCall(w.workers[0])
	// A new leader: its scan finds the rules, its counts are to start.
	ix, wt, cancel := w.pass(t, r)
	defer func() { cancel() }()
	if len(ix.peakStart) == 0 {
		t.Fatal("the new leader marked no count to start")
	}
	// The gap: the rogue's burst, the honest tree's work, taken from the
	// watch before the counts' snapshot.
	w.burst(w.kids[0], w.kids[0], w.rogue, w.kids[1], w.kids[1], w.kids[2])
	g.endCall(held)
	w.honestWork()
	rogue37fSettle(t, g, ix, wt, 1)
	r.startPeaks(ctx, ix)
	for _, n := range []*tree.Node{w.rogue, w.planner} {
		if !w.fires(t, r, ix, n, w.six) {
			t.Errorf("a burst of six right after a leader change, before the count's snapshot, was not seen at %s", n.Name)
		}
		if w.fires(t, r, ix, n, w.seven) {
			t.Errorf("a burst of six read above six at %s", n.Name)
		}
	}
	if w.fires(t, r, ix, w.honest, w.hon) {
		t.Error("the honest tree's workers, one call then three each one after the other, read above three")
	}

	// A rule attached to a tree no count covered: the evaluator reads it,
	// and the rogue bursts before the count's snapshot.
	late := g.spawn(nil, "late")
	var lateKids []*tree.Node
	for i := range 2 {
		lateKids = append(lateKids, g.spawn(late, fmt.Sprintf("late%d", i)))
	}
	// The evaluator reads the spawns (its nodes' watch).
	for _, n := range append([]*tree.Node{late}, lateKids...) {
		ix.putNode(n)
	}
	rule, _, err := r.Add(ctx, Actor{ID: "operator:alice"}, &Rule{NodeID: late.NodeID, Name: "four", Expression: `observed.subtree_calls_in_flight_max >= 4`})
	if err != nil {
		t.Fatal(err)
	}
	rogue37fSettle(t, g, ix, wt, 2)
	if ix.byID[rule.RuleID] == nil || ix.peakStart[late.NodeID] == nil {
		t.Fatal("the evaluator did not take the rule, or marked no count to start")
	}
	w.burst(lateKids[0], lateKids[0], lateKids[1], lateKids[1])
	rogue37fSettle(t, g, ix, wt, 3)
	r.startPeaks(ctx, ix)
	if !w.fires(t, r, ix, late, rule) {
		t.Error("a burst of four after the rule was read, before the count's snapshot, was not seen")
	}
}

// TestRogue39FABurstOfAFreshNodeBeforeItsSpawnIsReadIsSeen: an operator's
// selector rule holds every node labelled role=rogue to fewer than four
// calls in flight over its subtree. The evaluator's two watches (the stop
// rules' records, the nodes) are read in either order: a fresh rogue,
// spawned under the label, had its children begin four calls and end them
// while the evaluator had read the records' changes and not yet the
// spawn. Those changes were of a node it did not know, and dropped; the
// count started at the spawn's reading from the level after the burst, 0
// (no ancestor of the rogue is under the rule to count it instead). Now
// the evaluator keeps the changes of nodes it does not know yet, while
// its nodes' watch has not passed them (the node's spawn may be still to
// come), and a count started at a spawn starts from them: the burst is
// seen.
func TestRogue39FABurstOfAFreshNodeBeforeItsSpawnIsReadIsSeen(t *testing.T) {
	rogue39fFreshNode(t, newRogue31cRig(t))
}

// TestRogue39FABurstOfAFreshNodeBeforeItsSpawnIsReadIsSeenOnEtcd is the
// same on etcd.
func TestRogue39FABurstOfAFreshNodeBeforeItsSpawnIsReadIsSeenOnEtcd(t *testing.T) {
	rogue39fFreshNode(t, newRogue35kEtcdRig(t))
}

func rogue39fFreshNode(t *testing.T, g *rogue31cRig) {
	ctx := context.Background()
	r := g.rules
	w := &rogue38fWorld{g: g}
	r.Fault = func(point string) error {
		if point == "before-file" {
			return errRogue38FFired
		}
		return nil
	}
	planner := g.spawn(nil, "planner")
	rule, _, err := r.Add(ctx, Actor{ID: "operator:alice"}, &Rule{Selector: map[string]string{"role": "rogue"}, Name: "four", Expression: `observed.subtree_calls_in_flight_max >= 4`})
	if err != nil {
		t.Fatal(err)
	}
	ix, wt, cancel := w.pass(t, r)
	defer cancel()
	spawn := func(parent *tree.Node, name string, labels map[string]string) *tree.Node {
		t.Helper()
		n, err := g.agents.Spawn(ctx, parent.NodeID, name, labels, "test", nil)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	rogue := spawn(planner, "rogue", map[string]string{"role": "rogue"})
	kids := []*tree.Node{spawn(rogue, "kid0", nil), spawn(rogue, "kid1", nil)}
	// An honest worker under the label beside it: one call then three,
	// one after the other.
	honest := spawn(planner, "honest", map[string]string{"role": "rogue"})
	g.endCall(g.openCall(honest))
	for range 3 {
		c := []*ledger.ToolCall{g.openCall(honest), g.openCall(honest), g.openCall(honest)}
		for _, x := range c {
			g.endCall(x)
		}
	}
	w.burst(kids[0], kids[0], kids[1], kids[1])
	// The records' watch first, then the nodes' (the spawns).
	rogue37fSettle(t, g, ix, wt, 1)
	for _, n := range append([]*tree.Node{rogue, honest}, kids...) {
		ix.putNode(n)
	}
	r.startPeaks(ctx, ix)
	if !w.fires(t, r, ix, rogue, rule) {
		t.Error("a fresh rogue's burst of four, its changes read before its spawn, was not seen")
	}
	if w.fires(t, r, ix, honest, rule) {
		t.Error("an honest node's calls, three at a time, read above three")
	}
	if len(ix.unseen) != 0 {
		t.Errorf("the evaluator still keeps the changes of %d nodes it knows or has passed", len(ix.unseen))
	}
	// A node it does not know whose spawn the nodes' watch then passes
	// (terminated, not judged): its changes are let go.
	rev := max(ix.rulesRev, ix.nodesRev) + 1
	ix.keepChange("ghost", rev, ownRecord, 1)
	if len(ix.unseen) != 1 {
		t.Fatalf("the change of a node not known yet was not kept (%d kept)", len(ix.unseen))
	}
	r.applyEvents(ix, []store.Event{{Type: store.EventDelete, Key: []byte(tree.NodePrefix + "ghost"), Revision: rev}})
	if len(ix.unseen) != 0 {
		t.Error("the changes of a node whose spawn the nodes' watch has passed are still kept")
	}
}

// TestRogue39FABurstPushedOutOfTheKeptChangesIsStillSeen: the changes a
// count to start keeps are bounded (maxPendingChanges), the older half
// let go past the bound. A rogue whose count was still to start began a
// burst of six across its children, ended it, then churned one call
// after another until the burst's changes were let go: the count started
// from what was left, and read one. Now the changes let go are folded
// into what is kept (the highest level they reached, and each record's
// last value), so the burst is seen; an honest subtree churning as much,
// three at a time, still reads three.
func TestRogue39FABurstPushedOutOfTheKeptChangesIsStillSeen(t *testing.T) {
	for _, tc := range []struct {
		name  string
		burst int
		want  int64
	}{{"rogue", 6, 6}, {"honest", 3, 3}} {
		t.Run(tc.name, func(t *testing.T) {
			q := &pendingPeak{from: 10}
			rev := uint64(10)
			change := func(record string, v int64) {
				rev++
				q.add(rev, record, v)
			}
			// The burst: each of tc.burst shards rises to one, then falls.
			for i := range tc.burst {
				change(fmt.Sprintf("s%d", i), 1)
			}
			for i := range tc.burst {
				change(fmt.Sprintf("s%d", i), 0)
			}
			// The churn: one call after another in one shard, then one
			// left open.
			for range maxPendingChanges {
				change("churn", 1)
				change("churn", 0)
			}
			change("churn", 1)
			// The count's snapshot: the churning shard's one call open.
			p := newSubtreePeak(rev, 0, map[string]uint64{"churn": 1})
			p.replay(q)
			if p.now() != tc.want {
				t.Errorf("the count started at %d, want %d", p.now(), tc.want)
			}
			if len(q.changes) > maxPendingChanges {
				t.Errorf("%d changes kept, over the bound %d", len(q.changes), maxPendingChanges)
			}
		})
	}
}
