package stoprule

import (
	"context"
	"testing"

	"github.com/tetherhq/tether/supervisor/ledger"
	"github.com/tetherhq/tether/supervisor/tree"
)

// The fortieth hostile pass, stop rules: the count of a subtree's peak of
// calls in flight starts from a snapshot the evaluator's watch has not
// caught up with.

// TestRogue40JABurstTheWatchHasNotHandedYetIsSeen: a count of a node's
// subtree calls in flight starts (a leader's scan, a rule read, a node
// spawned under one) from a snapshot read at the store's latest revision,
// while the evaluator's watch has handed it the changes only up to an
// earlier one (the watch trails the commits; an evaluation slice, which
// the rogue's own tree's turns make as long as they like, lets them pile
// up). The changes committed between the two reached the evaluator later,
// older than the snapshot, and were dropped as held by it: a rogue whose
// children began six calls and ended them in that moment was counted from
// the level after the burst, 0, and the rule never fired. And the changes
// the watch had handed were replayed over the snapshot's values of the
// records they did not change, values those records reached only later:
// an honest tree whose first worker ran three calls and ended them before
// its second worker began three was read at six. Now a count whose
// snapshot is ahead of the watch waits for the watch to pass it (the
// evaluator writes a mark of its own under the stop rules' records to be
// sure one comes), keeping every change meanwhile, and starts from the
// snapshot with all the changes before it: the burst reads six, the
// honest tree three.
func TestRogue40JABurstTheWatchHasNotHandedYetIsSeen(t *testing.T) {
	rogue40jBurstNotHandedYet(t, newRogue31cRig(t))
}

// TestRogue40JABurstTheWatchHasNotHandedYetIsSeenOnEtcd is the same on
// etcd.
func TestRogue40JABurstTheWatchHasNotHandedYetIsSeenOnEtcd(t *testing.T) {
	rogue40jBurstNotHandedYet(t, newRogue35kEtcdRig(t))
}

func rogue40jBurstNotHandedYet(t *testing.T, g *rogue31cRig) {
	w := newRogue38fWorld(t, g)
	ctx := context.Background()
	r := g.rules
	// A new leader: its scan finds the rules, its counts are to start.
	ix, wt, cancel := w.pass(t, r)
	defer func() { cancel() }()
	if len(ix.peakStart) == 0 {
		t.Fatal("the new leader marked no count to start")
	}
	// The honest tree's first worker runs three calls at once and ends
	// them; the watch hands it.
	w.burst(w.workers[0], w.workers[0], w.workers[0])
	rogue37fSettle(t, g, ix, wt, 1)
	// Committed, not handed yet as the counts' snapshot is read: the
	// honest second worker begins three calls, the rogue's burst of six.
	var held []*ledger.ToolCall
	for range 3 {
		held = append(held, g.openCall(w.workers[1]))
	}
	w.burst(w.kids[0], w.kids[0], w.rogue, w.kids[1], w.kids[1], w.kids[2])
	r.startPeaks(ctx, ix)
	// The watch catches up; the loop goes round.
	rogue37fSettle(t, g, ix, wt, 2)
	r.startPeaks(ctx, ix)
	w.burstSeen(t, r, ix, "committed before the count's snapshot and handed after it")
	for _, c := range held {
		g.endCall(c)
	}
}

// TestRogue40JABurstBetweenARescansWatchAndItsScanIsSeen: a pass ended by
// a watch that fell behind (which a rogue flooding the store can cause)
// hands its counts to the next, whose scan reads each again, its watch
// begun before the scan. The changes committed between the watch's
// beginning and the scan reached the new pass after the scan, older than
// its snapshot, and were dropped as held by it: a burst of six the
// rogue's children began and ended in that moment was not counted. Now
// the scan's counts start once the watch has handed every change up to
// the scan, those before it replayed: the burst reads six, an honest
// tree's workers peaking one after another (one still holding its calls
// as the scan reads) three.
func TestRogue40JABurstBetweenARescansWatchAndItsScanIsSeen(t *testing.T) {
	rogue40jBurstBeforeRescan(t, newRogue31cRig(t))
}

// TestRogue40JABurstBetweenARescansWatchAndItsScanIsSeenOnEtcd is the
// same on etcd.
func TestRogue40JABurstBetweenARescansWatchAndItsScanIsSeenOnEtcd(t *testing.T) {
	rogue40jBurstBeforeRescan(t, newRogue35kEtcdRig(t))
}

func rogue40jBurstBeforeRescan(t *testing.T, g *rogue31cRig) {
	w := newRogue38fWorld(t, g)
	ctx := context.Background()
	r := g.rules
	ix, wt, cancel := w.pass(t, r)
	rogue37fSettle(t, g, ix, wt, 1)
	r.startPeaks(ctx, ix)
	rogue37fSettle(t, g, ix, wt, 2)
	r.startPeaks(ctx, ix)
	for _, n := range []*tree.Node{w.planner, w.rogue, w.honest} {
		if ix.peaks[n.NodeID] == nil {
			t.Fatalf("no count of %s before the rescan", n.Name)
		}
	}
	// The watch falls behind: the pass ends, the next begins its watch.
	r.endPass(ctx, ix)
	cancel()
	wctx, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	wt2, err := g.st.Watch(wctx, []byte(prefixAll))
	if err != nil {
		t.Fatal(err)
	}
	// Between the watch and the scan: the rogue's burst, and the honest
	// tree's workers one after the other, the second holding its calls.
	w.burst(w.kids[0], w.kids[0], w.rogue, w.kids[1], w.kids[1], w.kids[2])
	w.burst(w.workers[0], w.workers[0], w.workers[0])
	var held []*ledger.ToolCall
	for range 3 {
		held = append(held, g.openCall(w.workers[1]))
	}
	ix2, err := r.load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rogue37fSettle(t, g, ix2, wt2, 3)
	r.startPeaks(ctx, ix2)
	w.burstSeen(t, r, ix2, "between the rescan's watch and its scan")
	for _, c := range held {
		g.endCall(c)
	}
}

// burstSeen checks what the rogue40j tests read once the watch caught
// up: the rogue's burst of six (what says when it came) fires the rule
// at six, not seven, at the rogue and its planner, and the honest tree's
// three calls one after the other do not read above three.
func (w *rogue38fWorld) burstSeen(t *testing.T, r *Rules, ix *index, what string) {
	t.Helper()
	for _, n := range []*tree.Node{w.rogue, w.planner} {
		if !w.fires(t, r, ix, n, w.six) {
			t.Errorf("a burst of six "+what+" was not seen at %s (count %d)", n.Name, ix.peaks[n.NodeID].now())
		}
		if w.fires(t, r, ix, n, w.seven) {
			t.Errorf("a burst of six read above six at %s", n.Name)
		}
	}
	if w.fires(t, r, ix, w.honest, w.hon) {
		t.Errorf("the honest tree's workers, three calls each one after the other, read %d, above three", ix.peaks[w.honest.NodeID].now())
	}
}
