package supervisor

import (
	"testing"

	"github.com/tetherhq/tether/internal/store/badgerstore"
)

// Forty-third hostile pass (letter P): a large subtree's stops.

// TestRogue43PAPlannersStopDoesNotWaitBehindItsRogueChildsTerminations: in
// each tree the agents' stops took one turn of the terminations' loop, so
// an honest planner's stop of a worker below its rogue child waited behind
// each of the rogue's own terminations that moved at once. The rogue stops
// its 50 children with a confirm deadline just before the planner's stop
// of its other child waits to; once those deadlines pass, the planner's
// stop waited for the rogue's terminations one by one (49 passes before
// its own). Each requesting agent now has a turn of its own. Counted, not
// timed, as rogue41c: the loop is held in the first of the rogue's passes
// while the planner's deadline passes, then the passes are counted until
// the planner's termination has its next.
func TestRogue43PAPlannersStopDoesNotWaitBehindItsRogueChildsTerminations(t *testing.T) {
	const k = 50
	s, _ := chunkTestSupervisor(t, badgerstore.BadgerOptions{}, 100)
	loop, ctx := runHeldLoop(t, s)
	p, err := s.Tree.RegisterRoot(ctx, "planner", nil, "operator:test")
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.Tree.Spawn(ctx, p.NodeID, "rogue", nil, "agent:"+p.NodeID, nil)
	if err != nil {
		t.Fatal(err)
	}
	rogue := "agent:" + r.NodeID
	ids := loop.stopRogueChildren(t, ctx, s, r.NodeID, k, "x", false)
	w, err := s.Tree.Spawn(ctx, r.NodeID, "worker", nil, rogue, nil)
	if err != nil {
		t.Fatal(err)
	}
	term, err := s.Terminate(ctx, TerminateRequest{NodeID: w.NodeID, Mode: ModeAbort, ConfirmTimeout: DefaultConfirmTimeout * 4 / 3, Reason: "stop it", RequestedBy: "agent:" + p.NodeID, RequesterNodeID: p.NodeID})
	if err != nil {
		t.Fatal(err)
	}
	stopID := term.ID
	for _, id := range append([]string{stopID}, ids...) {
		rogue41cWaitPhase(t, s, id, PhaseReconciling)
	}
	before := loop.passesBefore(t, s, DefaultConfirmTimeout/3, stopID)
	if before < 0 {
		t.Fatal("the planner's termination was not reconciled after its deadline")
	}
	t.Logf("%d passes ran before the planner's termination's, after its deadline", before)
	if before > 2 {
		t.Fatalf("%d passes of the 50 stops of the rogue's children ran before its planner's stop's, its deadline passed; want at most 2 (each requesting agent takes a turn of its own)", before)
	}
	for _, id := range ids {
		rogue41cWaitPhase(t, s, id, PhaseTerminated)
	}
}
