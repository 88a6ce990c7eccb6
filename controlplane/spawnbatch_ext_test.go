package controlplane_test

import (
	"context"
	"fmt"
	"github.com/tetherhq/tether/supervisor/tree"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

func batchOf(parent string, names ...string) *connect.Request[tetherv1.SpawnBatchRequest] {
	req := &tetherv1.SpawnBatchRequest{ParentNodeId: parent}
	for _, n := range names {
		req.Children = append(req.Children, &tetherv1.SpawnBatchChild{Name: n})
	}
	return connect.NewRequest(req)
}

func names(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return out
}

// TestSpawnBatch: a batch spawns children as Spawn would, in one call and
// all or none. A rogue agent cannot use it to grow another agent's
// subtree, to spawn under a stopping parent, to pass the fan-out limit or
// the maximum batch, or to multiply its rate budget (a batch of n costs n
// calls); every refusal names what was wrong and spawns nothing.
func TestSpawnBatch(t *testing.T) {
	clk := clock.NewManual(time.Now().UTC())
	const burst = 6
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) {
		cfg.TreeLimits = tree.Limits{MaxDepth: 4, MaxChildren: 8, MaxLabels: 4}
		cfg.RateLimit, cfg.RateBurst = 1, burst
	})
	refill := func() { clk.Advance(time.Minute) }
	ctx := context.Background()
	admin := srv.AdminClients()
	root := register(t, admin, "planner")
	planner := srv.Clients(root.Credential)

	// The planner fans out three workers under itself; each credential is
	// its own worker's.
	refill()
	resp, err := planner.Agent.SpawnBatch(ctx, batchOf(root.Node.NodeId, "w-0", "w-1", "w-2"))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Msg.Spawned) != 3 {
		t.Fatalf("spawned %d children, want 3", len(resp.Msg.Spawned))
	}
	seen := map[string]bool{}
	for i, s := range resp.Msg.Spawned {
		if s.Node.Name != fmt.Sprintf("w-%d", i) || s.Node.ParentNodeId != root.Node.NodeId || seen[s.Node.NodeId] {
			t.Fatalf("child %d: %v", i, s.Node)
		}
		seen[s.Node.NodeId] = true
		refill()
		who, err := srv.Clients(s.Credential).Auth.WhoAmI(ctx, connect.NewRequest(&tetherv1.WhoAmIRequest{}))
		if err != nil || who.Msg.NodeId != s.Node.NodeId {
			t.Fatalf("child %d's credential: %v, %v", i, who, err)
		}
	}
	assertNodeCount(t, admin, 4)
	worker := srv.Clients(resp.Msg.Spawned[0].Credential)
	workerID := resp.Msg.Spawned[0].Node.NodeId

	// A worker cannot grow its parent's (or anyone else's) subtree.
	refill()
	_, err = worker.Agent.SpawnBatch(ctx, batchOf(root.Node.NodeId, "sneaky"))
	wantLimit(t, "a worker batching under its parent", err, connect.CodePermissionDenied, "may spawn only under its own node")
	assertNodeCount(t, admin, 4)

	// Bounds and bad input: nothing is spawned, the message says why.
	refill()
	_, err = planner.Agent.SpawnBatch(ctx, batchOf(root.Node.NodeId))
	wantLimit(t, "an empty batch", err, connect.CodeInvalidArgument, "1 to 256")
	refill()
	_, err = admin.Agent.SpawnBatch(ctx, batchOf(root.Node.NodeId, names("many", controlplane.MaxSpawnBatch+1)...))
	wantLimit(t, "a batch of 257", err, connect.CodeInvalidArgument, "257 given", "1 to 256")
	refill()
	_, err = planner.Agent.SpawnBatch(ctx, batchOf(root.Node.NodeId, "ok", "not ok!"))
	wantLimit(t, "a batch with one bad name", err, connect.CodeInvalidArgument, "children[1]", "name")
	assertNodeCount(t, admin, 4)

	// The fan-out limit counts the whole batch: 3 + 6 > 8 spawns none.
	refill()
	_, err = planner.Agent.SpawnBatch(ctx, batchOf(root.Node.NodeId, names("more", 6)...))
	wantLimit(t, "a batch past the fan-out limit", err, connect.CodeResourceExhausted, "6 more", "maximum of 8")
	assertNodeCount(t, admin, 4)

	// A batch of n costs n calls of the lineage's budget: past the burst,
	// refused before anything is written.
	refill()
	_, err = worker.Agent.SpawnBatch(ctx, batchOf(workerID, names("burst", burst+1)...))
	wantLimit(t, "a batch bigger than the burst", err, connect.CodeResourceExhausted, "rate limit")
	assertNodeCount(t, admin, 4)
	refill()
	if _, err := worker.Agent.SpawnBatch(ctx, batchOf(workerID, names("sub", burst)...)); err != nil {
		t.Fatalf("a batch of the burst: %v", err)
	}
	assertNodeCount(t, admin, 4+burst)

	// Once the worker is draining, no batch lands under it: not its own,
	// not an operator's. (The request alone marks nothing: a batch before
	// the mark is covered by the termination instead, so wait for it.)
	refill()
	terminate(t, admin, workerID, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Hour, time.Minute, time.Hour)
	testserver.WaitFor(t, 20*time.Second, "the worker to be marked", func() bool {
		var marked bool
		err := srv.Store().View(ctx, func(tx store.ReadTxn) error {
			n, err := tree.GetNodeIn(tx, workerID)
			marked = err == nil && n.State != tree.NodeStateRunning
			return err
		})
		return err == nil && marked
	})
	for _, c := range []*testserver.Clients{worker, admin} {
		refill()
		_, err = c.Agent.SpawnBatch(ctx, batchOf(workerID, "late-0", "late-1"))
		wantLimit(t, "a batch under a draining parent", err, connect.CodeFailedPrecondition, "parent_node_id", workerID)
	}
	assertNodeCount(t, admin, 4+burst)
}
