package controlplane_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestARoguesTerminationsThatMoveAtOnceDoNotDelayAnotherTreesStop: a rogue
// terminates its 50 children one by one, each with the same hour's confirm
// timeout, so that the 50 terminations come due at the same instant. The
// terminations' loop served the keys ready at once in the order they were
// kicked: an operator's stop of another tree, requested a moment after
// those deadlines passed, waited for every one of the rogue's terminations
// to write its record. The loop now serves the trees in turn. Counted,
// not timed: the loop is held in the first of the rogue's reconciles while
// the operator's stop is requested, then the reconciles are counted until
// the operator's termination has its first: one turn of the rogue's tree
// and one of the terminations no longer placed (a finished termination's
// last pass, which finds nothing to do) may come first. (Fails with 49.)
// The same holds for an operator's stop of the rogue itself, in the
// rogue's own tree: an operator's stops take a turn of their own there.
func TestARoguesTerminationsThatMoveAtOnceDoNotDelayAnotherTreesStop(t *testing.T) {
	t.Run("another tree", func(t *testing.T) { roguesTerminationsAtOnce(t, false) })
	t.Run("the rogue itself", func(t *testing.T) { roguesTerminationsAtOnce(t, true) })
}

func roguesTerminationsAtOnce(t *testing.T, stopTheRogue bool) {
	const k = 50
	clk := clock.NewManual(epoch)
	var (
		mu      sync.Mutex
		order   []string
		rogues  = map[string]bool{}
		holding bool
		held    = make(chan struct{})
		release = make(chan struct{})
	)
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) {
		cfg.TerminationReconciled = func(id string) {
			mu.Lock()
			order = append(order, id)
			hold := holding && rogues[id]
			if hold {
				holding = false
			}
			mu.Unlock()
			if hold {
				close(held)
				<-release
			}
		}
	})
	admin := srv.AdminClients()
	ctx := context.Background()
	rogue := register(t, admin, "rogue")
	rogueClients := srv.Clients(rogue.Credential)
	children := make([]*tetherv1.SpawnBatchChild, k)
	for i := range children {
		children[i] = &tetherv1.SpawnBatchChild{Name: fmt.Sprintf("silent-%02d", i)}
	}
	resp, err := rogueClients.Agent.SpawnBatch(ctx, connect.NewRequest(&tetherv1.SpawnBatchRequest{ParentNodeId: rogue.Node.NodeId, Children: children}))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, c := range resp.Msg.Spawned {
		term := terminate(t, rogueClients, c.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 0, time.Hour)
		ids = append(ids, term.TerminationId)
	}
	mu.Lock()
	for _, id := range ids {
		rogues[id] = true
	}
	mu.Unlock()
	for _, id := range ids {
		waitState(t, srv, id, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	}
	victim := register(t, admin, "victim")
	worker := spawn(t, srv.Clients(victim.Credential), victim.Node.NodeId, "worker")

	// The rogue's 50 confirm deadlines pass at once; the loop is held in
	// the first of their reconciles while the operator stops the worker.
	mu.Lock()
	holding = true
	mu.Unlock()
	clk.Advance(time.Hour)
	<-held
	target := worker.Node.NodeId
	if stopTheRogue {
		target = rogue.Node.NodeId
	}
	stop := terminate(t, admin, target, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 0, 0)
	mu.Lock()
	from := len(order)
	mu.Unlock()
	close(release)
	waitState(t, srv, stop.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)

	mu.Lock()
	before := -1
	for i, id := range order[from:] {
		if id == stop.TerminationId {
			before = i
			break
		}
	}
	mu.Unlock()
	if before < 0 {
		t.Fatal("the operator's termination was never reconciled")
	}
	t.Logf("%d of the rogue's reconciles ran before the operator's termination's first", before)
	if before > 2 {
		t.Fatalf("%d of the rogue's terminations were reconciled before the operator's stop, requested after their deadlines passed; want at most 2 (the trees take turns: one pass of one of the rogue's terminations, and one of a termination the loop no longer places, such as a finished one's last pass)", before)
	}
	// Each of the rogue's terminations still ends (its records are
	// written in the trees' turns).
	// (Fifty records under a loaded -race run: a longer wait than one
	// termination's.)
	testserver.WaitFor(t, 2*time.Minute, "the rogue's terminations to end", func() bool {
		for _, id := range ids {
			if getTermination(t, admin, id).State != tetherv1.TerminationState_TERMINATION_STATE_TERMINATED {
				return false
			}
		}
		return true
	})
}
