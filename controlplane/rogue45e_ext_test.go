package controlplane_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue45EAnotherTreesStopsAndLookAlikesDoNotMakeARolloutReadTheCluster:
// an operator's rollout of version=v1 to version=v2 waits, paused, for a
// replacement of the agent its first batch drained. A rogue in a tree of
// its own, nothing to do with the rollout, spawns children labelled like
// the replacements (any agent chooses its children's labels; none reports
// ready, so none is one), then stops each of them. Every write of a
// termination anywhere, and every write of a node matching either of the
// rollout's selectors, kicked every unfinished rollout, and each of its
// reconciles reads every node of the cluster (observe): each of the
// rogue's requests cost the server a read of the whole store, for as long
// as the rollout stayed unfinished (paused for days, say). Now a
// termination kicks only the rollout whose batch it is, and a node only
// when what the rollout reads of it changed (its state, its stop, its
// readiness) — a replacement's look-alike that is not ready is no fact of
// the rollout's. Counted, not timed: the rollout's observations during
// the rogue's 2·k requests. (Fails with one observation or more per
// request.)
func TestRogue45EAnotherTreesStopsAndLookAlikesDoNotMakeARolloutReadTheCluster(t *testing.T) {
	const k = 12
	clk := clock.NewManual(epoch)
	var observed atomic.Int64
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) {
		cfg.RolloutFault = func(point string) {
			if point == "observe" {
				observed.Add(1)
			}
		}
	})
	admin := srv.AdminClients()
	ctx := context.Background()
	registerLabelled(t, admin, "web-v1", map[string]string{"version": "v1"})
	r := rolloutPausedAtItsFirstDeadline(t, srv, admin, clk)

	rogue := register(t, admin, "rogue")
	rogueClients := srv.Clients(rogue.Credential)
	before := observed.Load()
	var children []string
	for i := range k {
		c, err := rogueClients.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{
			ParentNodeId: rogue.Node.NodeId, Name: fmt.Sprintf("look-alike-%02d", i), Labels: map[string]string{"version": "v2"},
		}))
		if err != nil {
			t.Fatal(err)
		}
		children = append(children, c.Msg.Node.NodeId)
	}
	for _, c := range children {
		term := terminate(t, rogueClients, c, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 0, 24*time.Hour)
		waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	}
	// The rollout's own last save (its pause) may still be observed once.
	if got := observed.Load() - before; got > 1 {
		t.Fatalf("the rogue's %d spawns of look-alikes and %d stops of them cost the paused rollout %d observations (each a read of every node), want at most 1", k, k, got)
	}
	// The rollout still moves on what is its own: a replacement ready.
	v2 := registerLabelled(t, admin, "web-v2", map[string]string{"version": "v2"})
	reportReady(t, admin, v2.Node.NodeId)
	waitRollout(t, srv, r.RolloutId, "to finish batch 0", func(r *tetherv1.Rollout) bool {
		return r.Batches[0].State == tetherv1.RolloutBatchState_ROLLOUT_BATCH_STATE_DONE
	})
}
