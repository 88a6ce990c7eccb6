package bench

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

func init() {
	Register("supervisor/terminate", supervisorTerminate)
}

// supervisorTerminate measures the time from Terminate to terminated for
// subtrees of 100, 1,000 and 10,000 agents in abort mode (nothing to wait
// for: no calls outlive their cancel, and the confirm timeout is zero, so
// the figure is the control plane's own work — marking, cancel orders,
// revocation, the record), and the server's memory per registered agent.
func supervisorTerminate(ctx context.Context, r *Report) error {
	for _, size := range []int{100, 1000, 10000} {
		srv, err := startServer(ctx, r)
		if err != nil {
			return err
		}
		heapBefore := heapInUse()
		root, err := buildSubtree(ctx, srv, size)
		if err != nil {
			srv.Stop()
			return err
		}
		perAgent := float64(heapInUse()-heapBefore) / float64(size)
		elapsed, nodes, err := timeTermination(ctx, srv, root)
		srv.Stop()
		if err != nil {
			return err
		}
		if nodes != size {
			return fmt.Errorf("record of a %d-agent subtree lists %d nodes", size, nodes)
		}
		r.Add(fmt.Sprintf("supervisor/terminate-abort/agents=%d", size), float64(elapsed.Microseconds())/1000, "ms")
		if size == 10000 {
			r.Add("supervisor/server-heap-per-agent", perAgent, "bytes")
		}
	}
	return nil
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// buildSubtree registers a root and size-1 descendants (a tree of fan-out
// 10) through the real API with 64 concurrent clients.
func buildSubtree(ctx context.Context, srv *benchServer, size int) (string, error) {
	root, err := srv.Admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "bench-root"}))
	if err != nil {
		return "", err
	}
	ids := make([]string, 1, size)
	ids[0] = root.Msg.Node.NodeId
	var mu sync.Mutex
	for len(ids) < size {
		level := append([]string(nil), ids...)
		want := min(size-len(ids), len(level)*10)
		jobs := make(chan string, want)
		for i := 0; i < want; i++ {
			jobs <- level[i%len(level)]
		}
		close(jobs)
		var wg sync.WaitGroup
		var firstErr error
		for w := 0; w < 64; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for parent := range jobs {
					resp, err := srv.Admin.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: parent, Name: "agent"}))
					mu.Lock()
					if err != nil && firstErr == nil {
						firstErr = err
					} else if err == nil {
						ids = append(ids, resp.Msg.Node.NodeId)
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if firstErr != nil {
			return "", firstErr
		}
	}
	return ids[0], nil
}

func timeTermination(ctx context.Context, srv *benchServer, root string) (time.Duration, int, error) {
	start := time.Now()
	resp, err := srv.Admin.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: root, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT,
		CancelAckTimeout: durationpb.New(5 * time.Second), ConfirmTimeout: durationpb.New(0),
	}))
	if err != nil {
		return 0, 0, err
	}
	stream, err := srv.Admin.Supervisor.WatchTermination(ctx, connect.NewRequest(&tetherv1.WatchTerminationRequest{TerminationId: resp.Msg.Termination.TerminationId}))
	if err != nil {
		return 0, 0, err
	}
	defer stream.Close()
	for stream.Receive() {
		if stream.Msg().Termination.State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED {
			elapsed := time.Since(start)
			rec, err := srv.Admin.Supervisor.GetRecord(ctx, connect.NewRequest(&tetherv1.GetRecordRequest{TerminationId: resp.Msg.Termination.TerminationId}))
			if err != nil {
				return 0, 0, err
			}
			return elapsed, len(rec.Msg.Record.Nodes), nil
		}
	}
	return 0, 0, fmt.Errorf("watch ended before the termination: %v", stream.Err())
}
