package bench

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

func init() {
	Register("supervisor/terminate", supervisorTerminate)
}

// supervisorTerminate measures the time from Terminate to terminated for
// subtrees of 100, 1,000 and 10,000 agents in abort mode, with a tool call in
// flight on one agent in ten and a gate that acknowledges every cancel order
// at once; the confirm timeout is zero, so the figure is the control plane's
// own work (marking, cancel orders and acks, revocation, the record), and
// the CPU time the process spent in that interval. It also reports the
// server's heap per registered agent.
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
		elapsed, cpuUsed, cpuOK, err := terminateMeasured(ctx, srv, root, size)
		if err != nil {
			return err
		}
		r.Add(fmt.Sprintf("supervisor/terminate-abort/agents=%d", size), float64(elapsed.Microseconds())/1000, "ms")
		if cpuOK {
			// The process's CPU time over the same interval (server and
			// the bench's gate and watcher): on a shared machine it scales
			// with the work where the wall-clock time scales with the load.
			r.Add(fmt.Sprintf("supervisor/terminate-abort-cpu/agents=%d", size), float64(cpuUsed.Microseconds())/1000, "ms")
		}
		if size == 10000 {
			r.Add("supervisor/server-heap-per-agent", perAgent, "bytes")
		}
	}
	return nil
}

// terminateMeasured terminates (aborts) the size-agent subtree under root
// with a tool call in flight on one agent in ten and a gate that
// acknowledges every cancel order at once, stops srv, and returns the
// termination's wall time and the process's CPU time over it (cpuOK false
// when the platform gives none). It fails unless the record lists every
// node and every call's cancel was acknowledged.
func terminateMeasured(ctx context.Context, srv *benchServer, root string, size int) (elapsed, cpu time.Duration, cpuOK bool, err error) {
	calls, stopGate, err := callsInFlight(ctx, srv, root, size/10)
	if err != nil {
		srv.Stop()
		return 0, 0, false, err
	}
	cpuBefore, cpuOK := processCPU()
	elapsed, nodes, err := timeTermination(ctx, srv, root)
	cpuAfter, _ := processCPU()
	acked := stopGate()
	srv.Stop()
	switch {
	case err != nil:
		return 0, 0, false, err
	case nodes != size:
		return 0, 0, false, fmt.Errorf("record of a %d-agent subtree lists %d nodes", size, nodes)
	case acked != calls:
		return 0, 0, false, fmt.Errorf("%d calls in flight, %d cancel acks", calls, acked)
	}
	return elapsed, cpuAfter - cpuBefore, cpuOK, nil
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
	elapsed, nodes, _, err := timeTerminationWithin(ctx, srv, root, 0)
	return elapsed, nodes, err
}

// timeTerminationWithin terminates root's subtree in abort mode and waits
// until it is terminated, at most within (zero: no bound but ctx's). It
// returns the time from the Terminate call, the nodes in the record, and
// the last state the watch reported, which says how far a termination
// that failed or ran out of time got.
func timeTerminationWithin(ctx context.Context, srv *benchServer, root string, within time.Duration) (time.Duration, int, string, error) {
	if within > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, within)
		defer cancel()
	}
	start := time.Now()
	resp, err := srv.Admin.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: root, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT,
		CancelAckTimeout: durationpb.New(5 * time.Second), ConfirmTimeout: durationpb.New(0),
	}))
	if err != nil {
		return time.Since(start), 0, "not started", fmt.Errorf("terminate: %w", err)
	}
	last := resp.Msg.Termination.State.String()
	stream, err := srv.Admin.Supervisor.WatchTermination(ctx, connect.NewRequest(&tetherv1.WatchTerminationRequest{TerminationId: resp.Msg.Termination.TerminationId}))
	if err != nil {
		return time.Since(start), 0, last, err
	}
	defer stream.Close()
	for stream.Receive() {
		last = stream.Msg().Termination.State.String()
		if stream.Msg().Termination.State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED {
			elapsed := time.Since(start)
			// A large record arrives in pages: count every page's nodes.
			rec, err := agentsdk.ReadRecord(ctx, srv.Admin.Supervisor, &tetherv1.GetRecordRequest{TerminationId: resp.Msg.Termination.TerminationId})
			if err != nil {
				return elapsed, 0, last, err
			}
			return elapsed, len(rec.Nodes), last, nil
		}
	}
	return time.Since(start), 0, last, fmt.Errorf("watch ended before the termination: %v", stream.Err())
}

// callsInFlight begins n tool calls on agents of the subtree (each agent
// with its own root grant) through a gate that acknowledges every cancel
// order as soon as it arrives. stop ends the gate and says how many cancels
// it acknowledged.
func callsInFlight(ctx context.Context, srv *benchServer, root string, n int) (int, func() int, error) {
	calls, stop, _, err := callsInFlightCounted(ctx, srv, root, n)
	return calls, stop, err
}

// callsInFlightCounted is callsInFlight that also returns acked, which
// says how many acknowledgements have been answered so far.
func callsInFlightCounted(ctx context.Context, srv *benchServer, root string, n int) (int, func() int, func() uint64, error) {
	nodes, err := srv.Admin.Agent.ListNodes(ctx, connect.NewRequest(&tetherv1.ListNodesRequest{RootNodeId: root}))
	if err != nil {
		return 0, nil, nil, err
	}
	var ids []string
	for i := 0; i < n; i++ {
		ids = append(ids, nodes.Msg.Nodes[(i*10)%len(nodes.Msg.Nodes)].NodeId)
	}
	return callsInFlightCountedOn(ctx, srv, ids)
}

// callsInFlightOn is callsInFlight on the given nodes, one call each.
func callsInFlightOn(ctx context.Context, srv *benchServer, nodes []string) (int, func() int, error) {
	calls, stop, _, err := callsInFlightCountedOn(ctx, srv, nodes)
	return calls, stop, err
}

// callsInFlightCountedOn is callsInFlightCounted on the given nodes.
func callsInFlightCountedOn(ctx context.Context, srv *benchServer, nodes []string) (int, func() int, func() uint64, error) {
	n := len(nodes)
	// The gate reports as a tool server, with its own token.
	minted, err := srv.Admin.Auth.CreateToken(ctx, connect.NewRequest(&tetherv1.CreateTokenRequest{ToolServer: "bench-gate"}))
	if err != nil {
		return 0, nil, nil, err
	}
	gate := agentsdk.Dial(srv.URL, minted.Msg.Token)
	for _, node := range nodes {
		g, err := srv.Admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: node, Scopes: []string{"tool:*"}, Ttl: durationpb.New(time.Hour)}))
		if err != nil {
			return 0, nil, nil, err
		}
		if _, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: g.Msg.Token, Tool: "shell", GateId: "bench-gate"})); err != nil {
			return 0, nil, nil, err
		}
	}
	gateCtx, cancel := context.WithCancel(ctx)
	stream, err := gate.Tool.WatchCancels(gateCtx, connect.NewRequest(&tetherv1.WatchCancelsRequest{GateId: "bench-gate"}))
	if err != nil {
		cancel()
		return 0, nil, nil, err
	}
	var count atomic.Int64
	done := make(chan struct{})
	// A gate's handlers return independently, so their acks go out
	// concurrently: 32 at a time here.
	orders := make(chan string, n)
	var acks sync.WaitGroup
	for w := 0; w < 32; w++ {
		acks.Add(1)
		go func() {
			defer acks.Done()
			for id := range orders {
				if _, err := gate.Tool.CancelAck(gateCtx, connect.NewRequest(&tetherv1.CancelAckRequest{CallId: id, GateId: "bench-gate"})); err == nil {
					count.Add(1)
				}
			}
		}()
	}
	go func() {
		defer close(done)
		for stream.Receive() {
			orders <- stream.Msg().CallId
		}
		close(orders)
		acks.Wait()
	}()
	stop := func() int {
		// The termination can finish before the last CancelAck answer
		// reaches this client: wait for the answers, within a bound.
		for deadline := time.Now().Add(10 * time.Second); count.Load() < int64(n) && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		cancel()
		stream.Close()
		<-done
		return int(count.Load())
	}
	return n, stop, func() uint64 { return uint64(count.Load()) }, nil
}
