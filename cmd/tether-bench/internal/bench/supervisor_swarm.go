package bench

import (
	"context"
	"fmt"
)

func init() {
	Register("supervisor/terminate-same-swarm", supervisorTerminateSameSwarm)
}

// sameSwarm is the number of agents each server of
// supervisor/terminate-same-swarm holds: the subtree terminated and the
// rest of the swarm.
const sameSwarm = 11000

// supervisorTerminateSameSwarm terminates a 1,000-agent and a
// 10,000-agent subtree, each in a server holding 11,000 agents (the rest
// under a root of their own, spawned after the subtree, so that the
// subtree's nodes are as far from the store's memory of recent values as
// an old subtree's would be), with the workload of supervisor/terminate
// (abort, a tool call in flight on one agent in ten, a gate that
// acknowledges at once).
//
// supervisor/terminate compares a 1,000-agent termination in a server of
// 1,000 agents with a 10,000-agent one in a server of 10,000: its ratio
// counts what grows with the swarm (the heap the collector scans, the
// store's memtables, the subtree's nodes still in the committer's memory)
// as if it grew with the subtree. Here the swarm is the same, so the ratio
// of the two terminations is the subtree's alone.
func supervisorTerminateSameSwarm(ctx context.Context, r *Report) error {
	cpu := map[int]float64{}
	wall := map[int]float64{}
	for _, size := range []int{1000, 10000} {
		srv, err := startServer(ctx, r)
		if err != nil {
			return err
		}
		root, err := buildSubtree(ctx, srv, size)
		if err == nil {
			_, err = buildSubtree(ctx, srv, sameSwarm-size)
		}
		if err != nil {
			srv.Stop()
			return err
		}
		elapsed, cpuUsed, cpuOK, err := terminateMeasured(ctx, srv, root, size)
		if err != nil {
			return err
		}
		wall[size] = float64(elapsed.Microseconds()) / 1000
		r.Add(fmt.Sprintf("supervisor/terminate-same-swarm/agents=%d", size), wall[size], "ms")
		if cpuOK {
			cpu[size] = float64(cpuUsed.Microseconds()) / 1000
			r.Add(fmt.Sprintf("supervisor/terminate-same-swarm-cpu/agents=%d", size), cpu[size], "ms")
		}
	}
	if wall[1000] > 0 {
		r.Add("supervisor/terminate-same-swarm/10k-over-1k", wall[10000]/wall[1000], "x")
	}
	if cpu[1000] > 0 {
		r.Add("supervisor/terminate-same-swarm-cpu/10k-over-1k", cpu[10000]/cpu[1000], "x")
	}
	return nil
}
