package supervisor

import (
	"context"
	"errors"
	"testing"

	"github.com/tetherhq/tether/internal/store/badgerstore"
)

// An abort whose mark ordered every cancel goes from its mark to its wait
// for acknowledgements with no cancel step of its own (the mark's last
// chunk says the cancels are sent), and its record is started by its first
// part and finished, calls and header and all, by its last chunk of nodes: a
// transaction fewer each, on etcd a commit and a pass's reads. Nothing is
// lost by it: the termination stops after every chunk (its context ends)
// and a fresh supervisor on the same store (a restart) takes it on from
// what is stored, and the record still lists every node exactly once.
func TestAnAbortTakesNoStepThatOnlyRecordsTheLastOne(t *testing.T) {
	ctx := context.Background()
	s, st := chunkTestSupervisor(t, badgerstore.BadgerOptions{}, 10)
	_, all := buildTree(t, st, 30, 3)
	term, err := s.Terminate(ctx, TerminateRequest{NodeID: all[0], Mode: ModeAbort, Reason: "abort", RequestedBy: "operator:test"})
	if err != nil {
		t.Fatal(err)
	}
	steps := map[string]int{}
	for range 1000 {
		stepCtx, stop := context.WithCancel(ctx)
		s.ChunkFault = func(step string, _ int) {
			steps[step]++
			stop() // the process ends after the chunk's commit
		}
		_, err := s.Reconcile(stepCtx, term.ID)
		stop()
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
		if term, err = s.Get(ctx, term.ID); err != nil {
			t.Fatal(err)
		}
		if term.Phase == PhaseTerminated {
			break
		}
		// A restart: nothing kept in memory.
		s = &Supervisor{Store: st, Clock: s.Clock, Tree: s.Tree, ChunkSize: s.ChunkSize, Log: s.Log}
	}
	if term.Phase != PhaseTerminated {
		t.Fatalf("the termination is %s, want terminated", term.Phase)
	}
	checkRecord(t, s, term, all)
	if !term.CancelsSent || !term.CancelsOrderedAtMark {
		t.Errorf("cancels sent %v, ordered at the mark %v; want both", term.CancelsSent, term.CancelsOrderedAtMark)
	}
	if steps["cancel"] != 0 {
		t.Errorf("the abort took %d cancel steps, want none (its mark ordered every cancel)", steps["cancel"])
	}
	// 31 nodes in chunks of 10: four chunks of nodes, the first starting
	// the record and the last writing the calls (none) and the header
	// with its nodes (a fifth transaction before).
	if want := 4; steps["record"] != want {
		t.Errorf("the record took %d transactions, want %d", steps["record"], want)
	}
}
