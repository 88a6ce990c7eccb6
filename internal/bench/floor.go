package bench

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/agentsdk"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

func init() {
	Register("floor/fsync-and-rpc", floorFsyncAndRPC)
}

// floorFsyncAndRPC measures the two floors every durable, remote operation
// stands on, in one closed loop that alternates them so both see the same
// load: one fsync (overwrite 200 bytes of a file in the bench directory,
// then fsync it: what a commit costs the disk at the least) and one RPC
// (an agent's authenticated GetNode of itself through the real server on
// loopback, which writes nothing). A durable call answered by one process
// cannot be faster than their sum; lease/renew's lone-floor figures take
// the same RPC and the store's commit (two syncs on Badger) beside a renew.
func floorFsyncAndRPC(ctx context.Context, r *Report) error {
	srv, err := startServer(ctx, r)
	if err != nil {
		return err
	}
	defer srv.Stop()
	root, err := srv.Admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "bench-floor"}))
	if err != nil {
		return err
	}
	agent := agentsdk.Dial(srv.URL, root.Msg.Credential)
	f, err := os.Create(filepath.Join(srv.dir, "fsync-floor"))
	if err != nil {
		return err
	}
	defer f.Close()
	var fsyncs, rpcs []time.Duration
	deadline := time.Now().Add(r.Duration)
	for time.Now().Before(deadline) {
		if err := ctx.Err(); err != nil {
			return err
		}
		start := time.Now()
		if _, err := f.WriteAt(storeValue, 0); err != nil {
			return err
		}
		if err := f.Sync(); err != nil {
			return err
		}
		fsyncs = append(fsyncs, time.Since(start))
		start = time.Now()
		if _, err := agent.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: root.Msg.Node.NodeId})); err != nil {
			return err
		}
		rpcs = append(rpcs, time.Since(start))
	}
	pct := func(ds []time.Duration, p float64) float64 {
		slices.Sort(ds)
		return ms(ds[min(len(ds)-1, int(p*float64(len(ds))))])
	}
	r.Add("floor/fsync/p50", pct(fsyncs, 0.5), "ms")
	r.Add("floor/fsync/p99", pct(fsyncs, 0.99), "ms")
	r.Add("floor/rpc/p50", pct(rpcs, 0.5), "ms")
	r.Add("floor/rpc/p99", pct(rpcs, 0.99), "ms")
	r.Add("floor/rpc-plus-fsync/p50", pct(rpcs, 0.5)+pct(fsyncs, 0.5), "ms")
	return nil
}
