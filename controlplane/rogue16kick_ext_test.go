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
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestARoguesUnfinishedTerminationsAreNotReconciledForAnotherTreesChanges:
// a rogue terminates its children one by one, each with a day's confirm
// timeout that its children never answer, and so keeps that many
// terminations unfinished. Every committed change of the ledger, the tree
// or a termination anywhere kicked every unfinished termination, and the
// loop reconciled them one at a time: each spawn on another tree cost a
// reconcile of each of the rogue's terminations, and another tree's
// termination waited behind them at each of its steps. A change now kicks
// only the terminations it may move (the one a call or a node names, those
// whose subtree holds the node, those below a node that stopped). Counted,
// not timed: after a restart (whose rescan reconciles each of the rogue's
// terminations once), another tree's spawns and its operator's termination
// run to its record without one reconcile of the rogue's terminations.
// (Fails with the rogue's terminations reconciled hundreds of times.)
func TestARoguesUnfinishedTerminationsAreNotReconciledForAnotherTreesChanges(t *testing.T) {
	const k, spawns = 50, 10
	dir := t.TempDir()
	srv := testserver.StartIn(t, dir)
	admin := srv.AdminClients()
	rogue := register(t, admin, "rogue")
	rogueClients := srv.Clients(rogue.Credential)
	children := make([]*tetherv1.SpawnBatchChild, k)
	for i := range children {
		children[i] = &tetherv1.SpawnBatchChild{Name: fmt.Sprintf("silent-%02d", i)}
	}
	resp, err := rogueClients.Agent.SpawnBatch(context.Background(), connect.NewRequest(&tetherv1.SpawnBatchRequest{ParentNodeId: rogue.Node.NodeId, Children: children}))
	if err != nil {
		t.Fatal(err)
	}
	rogues := map[string]bool{}
	for _, c := range resp.Msg.Spawned {
		term := terminate(t, rogueClients, c.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 0, 24*time.Hour)
		rogues[term.TerminationId] = true
	}
	for id := range rogues {
		waitState(t, srv, id, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	}
	victim := register(t, admin, "victim")
	srv.Stop()

	// Restarted, counting each termination's reconciles.
	var mu sync.Mutex
	counts := map[string]int{}
	again := testserver.StartIn(t, dir, func(cfg *controlplane.Config) {
		cfg.TerminationReconciled = func(id string) {
			mu.Lock()
			counts[id]++
			mu.Unlock()
		}
	})
	rogueReconciles := func() (total, reconciled int) {
		mu.Lock()
		defer mu.Unlock()
		for id := range rogues {
			total += counts[id]
			if counts[id] > 0 {
				reconciled++
			}
		}
		return total, reconciled
	}
	// The rescan reconciles each of them once; then they wait a day.
	testserver.WaitFor(t, time.Minute, "the rescan to reconcile the rogue's terminations", func() bool {
		_, n := rogueReconciles()
		return n == k
	})
	before, _ := rogueReconciles()

	victimClients := again.Clients(victim.Credential)
	var last string
	for i := range spawns {
		last = spawn(t, victimClients, victim.Node.NodeId, fmt.Sprintf("worker-%d", i)).Node.NodeId
	}
	term := terminate(t, again.AdminClients(), last, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 0, 0)
	waitState(t, again, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	after, _ := rogueReconciles()
	mu.Lock()
	victims := counts[term.TerminationId]
	mu.Unlock()
	t.Logf("the rogue's %d terminations: %d reconciles during another tree's %d spawns and its termination (%d reconciles of its own)", k, after-before, spawns, victims)
	if after != before {
		t.Fatalf("the rogue's terminations were reconciled %d times for another tree's changes; want none", after-before)
	}
	// The rogue's own terminations are still waiting for their children.
	for id := range rogues {
		if got := getTermination(t, again.AdminClients(), id).State; got != tetherv1.TerminationState_TERMINATION_STATE_RECONCILING {
			t.Fatalf("the rogue's termination %s is %s, want still reconciling (its confirm timeout is a day)", id, got)
		}
	}
}
