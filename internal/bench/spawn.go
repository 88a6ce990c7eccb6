package bench

import (
	"context"
	"fmt"
	"sync/atomic"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/agentsdk"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

func init() {
	Register("supervisor/spawn", supervisorSpawn)
}

// supervisorSpawn measures durable spawns with credential issuance: each
// call registers a child in the tree (committed to Badger with SyncWrites
// before it is answered) and mints the child's agent credential (an
// EdDSA-signed JWT). With 1, 8 and 64 clients, each on its own connection
// and spawning under its own parent, as separate agents growing their
// subtrees would. Besides the rate, it reports the rate per CPU-second of
// the whole process (server and clients), which on a shared machine tracks
// the work where the wall-clock rate tracks the load.
func supervisorSpawn(ctx context.Context, r *Report) error {
	srv, err := startServer(ctx, r)
	if err != nil {
		return err
	}
	defer srv.Stop()
	root, err := srv.Admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "bench-spawn-root"}))
	if err != nil {
		return err
	}
	for _, workers := range []int{1, 8, 64} {
		clients := make([]*agentsdk.Conn, workers)
		parents := make([]string, workers)
		for i := range clients {
			clients[i] = agentsdk.Dial(srv.URL, srv.AdminToken)
			resp, err := clients[i].Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: root.Msg.Node.NodeId, Name: "parent"}))
			if err != nil {
				return err
			}
			parents[i] = resp.Msg.Node.NodeId
		}
		var spawned atomic.Int64
		spawn := func(ctx context.Context, worker int) error {
			resp, err := clients[worker].Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: parents[worker], Name: "agent"}))
			if err != nil {
				return err
			}
			if resp.Msg.Credential == "" {
				return fmt.Errorf("spawn of %s returned no credential", resp.Msg.Node.NodeId)
			}
			spawned.Add(1)
			return nil
		}
		cpuBefore, cpuOK := processCPU()
		storeBefore := badgerStats(srv)
		rate, err := Throughput(ctx, workers, r.Duration, spawn)
		if err != nil {
			return err
		}
		cpuAfter, _ := processCPU()
		storeAfter := badgerStats(srv)
		if syncs := storeAfter.Batches - storeBefore.Batches; syncs > 0 {
			// The whole run, warm-up included: how many spawns shared a sync.
			r.Add(fmt.Sprintf("supervisor/spawn-durable/clients=%d/spawns-per-sync", workers), float64(spawned.Load())/float64(syncs), "agents")
		}
		r.Add(fmt.Sprintf("supervisor/spawn-durable/clients=%d", workers), rate, "agents/s")
		if cpu := cpuAfter - cpuBefore; cpuOK && cpu > 0 {
			// The whole run, warm-up included, over its CPU time.
			r.Add(fmt.Sprintf("supervisor/spawn-durable-per-cpu-second/clients=%d", workers), float64(spawned.Load())/cpu.Seconds(), "agents/cpu-s")
		}
	}
	return nil
}
