package bench

import (
	"context"
	"fmt"
	"github.com/tetherhq/tether/supervisor/tree"
	"sync/atomic"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/internal/etcdlocal"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

func init() {
	Register("supervisor/spawn", onServer(supervisorSpawn))
	Register("supervisor/spawn-etcd", supervisorSpawnEtcd)
}

// supervisorSpawn measures durable spawns with credential issuance: each
// call registers a child in the tree (committed to Badger with SyncWrites
// before it is answered) and mints the child's agent credential (an
// EdDSA-signed JWT). With 1, 8 and 64 clients, each a parent agent on its
// own connection spawning under its own node with its own credential, as
// separate agents growing their subtrees would. Besides the rate, it
// reports the rate per CPU-second of the whole process (server and
// clients), which on a shared machine tracks the work where the wall-clock
// rate tracks the load, and beside it the RPC floor: the same clients
// reading their own node (GetNode, authenticated and authorised as a
// spawn is, writing nothing), so that the CPU a spawn costs beyond one
// round trip of the RPC stack is measured in the same run. The 64 clients
// then do the same again over HTTP/1.1 (agentsdk.UnaryHTTP1Client, one
// connection each), whose server path costs less per call. Last, 64
// clients in a process of their own do both again (measureSpawnsApart), so
// that the server's CPU per spawn is measured without theirs in it.
func supervisorSpawn(ctx context.Context, r *Report, srv *benchServer) error {
	if err := measureSpawns(ctx, r, srv, "supervisor/spawn-durable", []int{1, 8, 64}, true); err != nil {
		return err
	}
	if err := measureSpawnsWith(ctx, r, srv, "supervisor/spawn-durable-http1", []int{64}, true, http1Dial(srv.URL)); err != nil {
		return err
	}
	for _, http1 := range []bool{false, true} {
		if err := measureSpawnsApart(ctx, r, srv, 64, http1); err != nil {
			return err
		}
	}
	return measureSpawnBatches(ctx, r, srv, 8, 64)
}

// measureSpawnBatches measures SpawnBatch for fan-out: workers clients,
// each spawning batch children per call under its own parent (a fresh
// parent when one is full), in agents per second: the same durable
// spawns and credentials as Spawn, one RPC and one transaction a batch.
func measureSpawnBatches(ctx context.Context, r *Report, srv *benchServer, workers, batch int) error {
	root, err := srv.Admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "bench-spawn-batch-root"}))
	if err != nil {
		return err
	}
	req := &tetherv1.SpawnBatchRequest{}
	for range batch {
		req.Children = append(req.Children, &tetherv1.SpawnBatchChild{Name: "agent"})
	}
	clients := make([]*agentsdk.Conn, workers)
	parents := make([]string, workers)
	calls := make([]int, workers)
	newParent := func(ctx context.Context, w int) error {
		resp, err := clients[w].Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: root.Msg.Node.NodeId, Name: "parent"}))
		if err == nil {
			parents[w], calls[w] = resp.Msg.Node.NodeId, 0
		}
		return err
	}
	for w := range clients {
		clients[w] = agentsdk.Dial(srv.URL, srv.AdminToken)
		if err := newParent(ctx, w); err != nil {
			return err
		}
	}
	var spawned atomic.Int64
	perParent := tree.DefaultLimits.MaxChildren / batch
	op := func(ctx context.Context, w int) error {
		if calls[w] == perParent {
			if err := newParent(ctx, w); err != nil {
				return err
			}
		}
		m := proto.CloneOf(req)
		m.ParentNodeId = parents[w]
		resp, err := clients[w].Agent.SpawnBatch(ctx, connect.NewRequest(m))
		if err != nil {
			return err
		}
		if len(resp.Msg.Spawned) != batch || resp.Msg.Spawned[batch-1].Credential == "" {
			return fmt.Errorf("a batch of %d spawned %d", batch, len(resp.Msg.Spawned))
		}
		calls[w]++
		spawned.Add(int64(batch))
		return nil
	}
	cpuBefore, cpuOK := processCPU()
	rate, err := Throughput(ctx, workers, r.Duration, op)
	if err != nil {
		return err
	}
	cpuAfter, _ := processCPU()
	name := fmt.Sprintf("supervisor/spawn-batch-durable/clients=%d/batch=%d", workers, batch)
	r.Add(name, rate*float64(batch), "agents/s")
	if cpu := cpuAfter - cpuBefore; cpuOK && cpu > 0 {
		r.Add(name+"/per-cpu-second", float64(spawned.Load())/cpu.Seconds(), "agents/cpu-s")
	}
	return nil
}

// supervisorSpawnEtcd is supervisor/spawn on a local single-member etcd:
// every spawn is its own etcd transaction, so besides the rate it reports
// how many attempts per spawn lost a race (the spawns of one tree share
// their ancestors' stop-rule counters).
func supervisorSpawnEtcd(ctx context.Context, r *Report) error {
	return withEtcdServer(ctx, r, "supervisor/spawn-etcd", "tether-bench-etcd-spawn-*", func(_ *etcdlocal.Cluster, srv *benchServer) error {
		return measureSpawns(ctx, r, srv, "supervisor/spawn-etcd", []int{1, 64}, false)
	})
}

// measureSpawns measures spawns with each number of clients in turn, and
// with floor the RPC floor beside them (measureRPCFloor).
func measureSpawns(ctx context.Context, r *Report, srv *benchServer, name string, levels []int, floor bool) error {
	return measureSpawnsWith(ctx, r, srv, name, levels, floor, func(cred string) *agentsdk.Conn { return agentsdk.Dial(srv.URL, cred) })
}

// http1Dial dials each client with agentsdk.UnaryHTTP1Client, one HTTP/1.1
// connection for its unary calls.
func http1Dial(url string) func(string) *agentsdk.Conn {
	return func(cred string) *agentsdk.Conn {
		return agentsdk.Dial(url, cred, agentsdk.WithHTTPClient(agentsdk.UnaryHTTP1Client(url, nil, 1)))
	}
}

// measureSpawnsWith is measureSpawns with each client dialled by dial.
func measureSpawnsWith(ctx context.Context, r *Report, srv *benchServer, name string, levels []int, floor bool, dial func(credential string) *agentsdk.Conn) error {
	root, err := srv.Admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "bench-spawn-root"}))
	if err != nil {
		return err
	}
	for _, workers := range levels {
		clients := make([]*agentsdk.Conn, workers)
		parents := make([]string, workers)
		for i := range clients {
			resp, err := srv.Admin.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: root.Msg.Node.NodeId, Name: "parent"}))
			if err != nil {
				return err
			}
			// The parent agent, with the credential its spawn returned.
			clients[i] = dial(resp.Msg.Credential)
			parents[i] = resp.Msg.Node.NodeId
		}
		if floor {
			if err := measureRPCFloor(ctx, r, name, clients, parents); err != nil {
				return err
			}
		}
		var spawned atomic.Int64
		spawn := func(ctx context.Context, worker int) error {
			if err := spawnOnce(ctx, clients[worker], parents[worker]); err != nil {
				return err
			}
			spawned.Add(1)
			return nil
		}
		cpuBefore, cpuOK := processCPU()
		storeBefore, etcdBefore := badgerStats(srv), etcdStats(srv)
		rate, err := Throughput(ctx, workers, r.Duration, spawn)
		if err != nil {
			return err
		}
		cpuAfter, _ := processCPU()
		storeAfter, etcdAfter := badgerStats(srv), etcdStats(srv)
		if syncs := storeAfter.Batches - storeBefore.Batches; syncs > 0 {
			// The whole run, warm-up included: how many spawns shared a sync.
			r.Add(fmt.Sprintf("%s/clients=%d/spawns-per-sync", name, workers), float64(spawned.Load())/float64(syncs), "agents")
		}
		if n := spawned.Load(); n > 0 && etcdAfter.Updates > etcdBefore.Updates {
			// Conflicts of the whole run, warm-up included, per spawn.
			r.Add(fmt.Sprintf("%s/clients=%d/conflicts-per-spawn", name, workers), float64(etcdAfter.Conflicts-etcdBefore.Conflicts)/float64(n), "conflicts")
		}
		r.Add(fmt.Sprintf("%s/clients=%d", name, workers), rate, "agents/s")
		if cpu := cpuAfter - cpuBefore; cpuOK && cpu > 0 && etcdAfter.Updates == 0 {
			// Not on etcd, whose work is in another process.
			// The whole run, warm-up included, over its CPU time.
			r.Add(fmt.Sprintf("%s-per-cpu-second/clients=%d", name, workers), float64(spawned.Load())/cpu.Seconds(), "agents/cpu-s")
		}
	}
	return nil
}

// measureSpawnsApart is measureSpawns at one level with the clients in a
// process of their own (runClientsApart), so that this process's CPU time
// is the server's alone: it reports the server's CPU time per spawn and
// per call of the RPC floor beside it (the same clients reading their own
// nodes), and the clients'. With http1 the clients use
// agentsdk.UnaryHTTP1Client.
func measureSpawnsApart(ctx context.Context, r *Report, srv *benchServer, workers int, http1 bool) error {
	name := "supervisor/spawn-durable-apart"
	if http1 {
		name = "supervisor/spawn-durable-http1-apart"
	}
	root, err := srv.Admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "bench-spawn-apart-root"}))
	if err != nil {
		return err
	}
	job := clientJob{URL: srv.URL, HTTP1: http1}
	for range workers {
		resp, err := srv.Admin.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: root.Msg.Node.NodeId, Name: "parent"}))
		if err != nil {
			return err
		}
		job.Credentials = append(job.Credentials, resp.Msg.Credential)
		job.Parents = append(job.Parents, resp.Msg.Node.NodeId)
	}
	job.Op = "get-node"
	if err := measureApart(ctx, r, fmt.Sprintf("%s/rpc-floor/clients=%d", name, workers), job); err != nil {
		return err
	}
	job.Op = "spawn"
	return measureApart(ctx, r, fmt.Sprintf("%s/clients=%d", name, workers), job)
}

// measureRPCFloor measures the clients of a spawn measurement reading
// their own nodes (GetNode): the same connections, credentials,
// authentication and authorisation as their spawns, and no write. It
// reports the rate and the rate per CPU-second of the process.
func measureRPCFloor(ctx context.Context, r *Report, name string, clients []*agentsdk.Conn, parents []string) error {
	var reads atomic.Int64
	op := func(ctx context.Context, w int) error {
		err := readOwnNode(ctx, clients[w], parents[w])
		if err == nil {
			reads.Add(1)
		}
		return err
	}
	cpuBefore, cpuOK := processCPU()
	rate, err := Throughput(ctx, len(clients), r.Duration, op)
	if err != nil {
		return err
	}
	cpuAfter, _ := processCPU()
	r.Add(fmt.Sprintf("%s/rpc-floor/clients=%d", name, len(clients)), rate, "calls/s")
	if cpu := cpuAfter - cpuBefore; cpuOK && cpu > 0 {
		r.Add(fmt.Sprintf("%s/rpc-floor-per-cpu-second/clients=%d", name, len(clients)), float64(reads.Load())/cpu.Seconds(), "calls/cpu-s")
	}
	return nil
}
