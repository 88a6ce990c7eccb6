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
	"github.com/tetherhq/tether/supervisor/tree"
)

// TestRogue39JAStoppedRoguesHeartbeatsDoNotReconcileItsStopsBelow: a rogue
// agent a stops each of its children, each stop waiting a day for an exit
// confirmation they never send; then its parent r drains a, with a day's
// windows too. a, draining, keeps heartbeating, and each heartbeat (one
// per tree.LastSeenEvery) writes its node. A stopped node kicked every
// unfinished termination rooted below it at each of its writes: each of
// a's heartbeats cost a reconcile of each of its stops, as many as it
// cared to keep. Now each is kicked once for a's being stopped. Counted,
// not timed: each heartbeat moves r's stop too (a is its member), and the
// test waits for that reconcile; a's stops are reconciled by none of them.
// A stop's own settling can still leave it a pass or two after the count
// starts (the pass its last write kicks, delivered late, and the kick of
// a's being stopped after it — CI saw one): the count allows each stop
// those two, and a heartbeat that kicked the stops would reconcile each
// at every one of the nine.
func TestRogue39JAStoppedRoguesHeartbeatsDoNotReconcileItsStopsBelow(t *testing.T) {
	const k, beats = 12, 8
	// settling: the passes a stop's own settling may still have due when
	// the count starts (see above).
	const settling = 2
	clk := clock.NewManual(epoch)
	var mu sync.Mutex
	counts := map[string]int{}
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) {
		cfg.TerminationReconciled = func(id string) {
			mu.Lock()
			counts[id]++
			mu.Unlock()
		}
	})
	count := func(id string) int {
		mu.Lock()
		defer mu.Unlock()
		return counts[id]
	}
	admin := srv.AdminClients()
	r := register(t, admin, "rogue")
	rClients := srv.Clients(r.Credential)
	a := spawn(t, rClients, r.Node.NodeId, "a")
	aClients := srv.Clients(a.Credential)
	children := make([]*tetherv1.SpawnBatchChild, k)
	for i := range children {
		children[i] = &tetherv1.SpawnBatchChild{Name: fmt.Sprintf("silent-%02d", i)}
	}
	resp, err := aClients.Agent.SpawnBatch(context.Background(), connect.NewRequest(&tetherv1.SpawnBatchRequest{ParentNodeId: a.Node.NodeId, Children: children}))
	if err != nil {
		t.Fatal(err)
	}
	var stops []string
	for _, c := range resp.Msg.Spawned {
		term := terminate(t, aClients, c.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 0, 24*time.Hour)
		stops = append(stops, term.TerminationId)
	}
	for _, id := range stops {
		waitState(t, srv, id, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	}
	marked := map[string]int{}
	for _, id := range stops {
		marked[id] = count(id)
	}
	drain := terminate(t, rClients, a.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, 24*time.Hour, 24*time.Hour, 24*time.Hour)
	waitState(t, srv, drain.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	// a's being stopped kicks each of its stops: once.
	testserver.WaitFor(t, time.Minute, "a's stop to kick each of a's stops", func() bool {
		for _, id := range stops {
			if count(id) <= marked[id] {
				return false
			}
		}
		return true
	})
	before := map[string]int{}
	for _, id := range stops {
		before[id] = count(id)
	}

	for i := range beats {
		clk.Advance(tree.LastSeenEvery)
		seen := count(drain.TerminationId)
		if _, err := aClients.Agent.Heartbeat(context.Background(), connect.NewRequest(&tetherv1.HeartbeatRequest{})); err != nil {
			t.Fatalf("heartbeat %d of a, draining: %v", i, err)
		}
		testserver.WaitFor(t, time.Minute, "a's heartbeat to move r's stop of it", func() bool { return count(drain.TerminationId) > seen })
	}
	// One more pass of the queue after the last heartbeat's: a's stops,
	// kicked in the same batch as r's, have had their turn.
	clk.Advance(tree.LastSeenEvery)
	seen := count(drain.TerminationId)
	if _, err := aClients.Agent.Heartbeat(context.Background(), connect.NewRequest(&tetherv1.HeartbeatRequest{})); err != nil {
		t.Fatal(err)
	}
	testserver.WaitFor(t, time.Minute, "a's last heartbeat to move r's stop of it", func() bool { return count(drain.TerminationId) > seen })
	total, most := 0, 0
	for _, id := range stops {
		total += count(id) - before[id]
		most = max(most, count(id)-before[id])
	}
	if most > settling {
		t.Fatalf("a's %d heartbeats, draining, reconciled its %d stops below it %d times, one of them %d times; want at most %d each, what its own settling leaves (its being stopped kicked each once)", beats+1, k, total, most, settling)
	}
	if got := getTermination(t, admin, drain.TerminationId).State; got != tetherv1.TerminationState_TERMINATION_STATE_RECONCILING {
		t.Fatalf("r's stop of a is %s, want still reconciling (its confirm timeout is a day)", got)
	}
}
