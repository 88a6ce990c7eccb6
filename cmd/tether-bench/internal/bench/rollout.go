package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

func init() {
	Register("supervisor/rollout", supervisorRollout)
}

// supervisorRollout measures the time from Rollout to completed for 300
// agents, each holding a job lease, replaced by v2 agents in batches of 10
// and of 30 through the real server. The launchers are stand-ins driven by
// the rollout's watch stream: as a batch appears they confirm the old
// agents' exits and register and ready the replacements, at once — so the
// figure is the control plane's own work per batch (the termination and its
// record, readiness, the lease handover), not an agent's drain.
func supervisorRollout(ctx context.Context, r *Report) error {
	const agents = 300
	for _, batch := range []int{10, 30} {
		srv, err := startServer(ctx, r)
		if err != nil {
			return err
		}
		elapsed, err := timeRollout(ctx, srv, agents, batch)
		srv.Stop()
		if err != nil {
			return fmt.Errorf("rollout of %d agents in batches of %d: %w", agents, batch, err)
		}
		r.Add(fmt.Sprintf("supervisor/rollout/agents=%d,batch=%d", agents, batch), float64(elapsed.Microseconds())/1000, "ms")
	}
	return nil
}

// parallel runs fn for every item with 32 workers and returns the first error.
func parallel[T any](items []T, fn func(T) error) error {
	jobs := make(chan T)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for it := range jobs {
				if err := fn(it); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	for _, it := range items {
		jobs <- it
	}
	close(jobs)
	wg.Wait()
	return first
}

func timeRollout(ctx context.Context, srv *benchServer, agents, batch int) (time.Duration, error) {
	admin := srv.Admin
	idx := make([]int, agents)
	for i := range idx {
		idx[i] = i
	}
	if err := parallel(idx, func(i int) error {
		n, err := admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{
			Name: fmt.Sprintf("agent-%03d", i), Labels: map[string]string{"app": "bench", "version": "v1"},
		}))
		if err != nil {
			return err
		}
		_, err = admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{
			JobId: fmt.Sprintf("job-%03d", i), HolderIdentity: n.Msg.Node.NodeId, LeaseDuration: durationpb.New(10 * time.Minute), AckTimeout: durationpb.New(10 * time.Minute),
		}))
		return err
	}); err != nil {
		return 0, err
	}
	start := time.Now()
	resp, err := admin.Supervisor.Rollout(ctx, connect.NewRequest(&tetherv1.RolloutRequest{
		Selector: "app=bench,version=v1", TargetSelector: "app=bench,version=v2", Batch: uint32(batch),
		DrainWindow: durationpb.New(time.Minute), ConfirmTimeout: durationpb.New(time.Minute),
	}))
	if err != nil {
		return 0, err
	}
	stream, err := admin.Supervisor.WatchRollout(ctx, connect.NewRequest(&tetherv1.WatchRolloutRequest{RolloutId: resp.Msg.Rollout.RolloutId}))
	if err != nil {
		return 0, err
	}
	defer stream.Close()
	launched := 0
	for stream.Receive() {
		ro := stream.Msg().Rollout
		for ; launched < len(ro.Batches); launched++ {
			// The stand-in launchers of this batch: each old process exits
			// and its replacement starts and reports ready.
			if err := parallel(ro.Batches[launched].NodeIds, func(node string) error {
				if _, err := admin.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: node})); err != nil {
					return err
				}
				n, err := admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{
					Name: "replacement", Labels: map[string]string{"app": "bench", "version": "v2"},
				}))
				if err != nil {
					return err
				}
				_, err = admin.Agent.ReportReady(ctx, connect.NewRequest(&tetherv1.ReportReadyRequest{NodeId: n.Msg.Node.NodeId}))
				return err
			}); err != nil {
				return 0, err
			}
		}
		switch ro.State {
		case tetherv1.RolloutState_ROLLOUT_STATE_COMPLETED:
			elapsed := time.Since(start)
			if c := ro.GetCounts(); c.GetDrained() != uint32(agents) || c.GetLeasesHandedOver() != uint32(agents) || len(ro.Batches) != (agents+batch-1)/batch {
				return 0, fmt.Errorf("completed with counts %+v in %d batches", c, len(ro.Batches))
			}
			return elapsed, nil
		case tetherv1.RolloutState_ROLLOUT_STATE_PAUSED, tetherv1.RolloutState_ROLLOUT_STATE_ABORTED:
			return 0, fmt.Errorf("rollout %s: %s", ro.State, ro.Reason)
		}
	}
	return 0, fmt.Errorf("watch ended before the rollout completed: %v", stream.Err())
}
