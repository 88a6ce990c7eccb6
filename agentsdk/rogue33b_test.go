package agentsdk_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue33BRunWaitsTheHintOfASessionRefusedForItsLineagesBudget: an
// agent whose lineage's budget is spent (by a rogue sibling sharing it, or
// by itself), and its node's own upkeep reserve (by itself: a runaway loop
// of its own), has its session refused resource_exhausted with a retry
// hint.
// Run reconnected on its own backoff (100ms, doubling to 5s), ignoring the
// hint: each attempt was refused, and spent the server's work, until the
// budget refilled. Run now waits the hint (through the Conn's
// RetryPolicy.Wait, which this test records) before reconnecting.
func TestRogue33BRunWaitsTheHintOfASessionRefusedForItsLineagesBudget(t *testing.T) {
	clk := clock.NewManual(time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC))
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) {
		cfg.RateLimit = 0.25 // a request every four seconds, bursts of 8
		cfg.RateBurst = 8
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	admin := agentsdk.Dial(srv.URL, srv.Admin, agentsdk.WithHTTPClient(srv.HTTP))
	root, err := agentsdk.RegisterRoot(ctx, admin, "root", nil)
	if err != nil {
		t.Fatal(err)
	}
	child, err := root.Spawn(ctx, "child", nil)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var waits []time.Duration
	policy := agentsdk.DefaultRetry
	policy.Clock = clk
	policy.Jitter = func() float64 { return 0 }
	policy.Wait = func(ctx context.Context, d time.Duration) error {
		mu.Lock()
		waits = append(waits, d)
		mu.Unlock()
		clk.Advance(time.Minute) // the budget refills
		return nil
	}
	agent, err := agentsdk.Join(ctx, srv.URL, child.Credential, testserver.H2CClient(), agentsdk.WithRetry(policy))
	if err != nil {
		t.Fatal(err)
	}
	// The rogue sibling, on the lineage's budget, spends it.
	rogue := agentsdk.Dial(srv.URL, child.Credential, agentsdk.WithHTTPClient(testserver.H2CClient()), agentsdk.WithRetry(agentsdk.RetryPolicy{}))
	var hint time.Duration
	for range 16 {
		_, err := rogue.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: child.Node.NodeId}))
		if connect.CodeOf(err) == connect.CodeResourceExhausted {
			var ok bool
			if hint, ok = agentsdk.RetryHint(err); !ok {
				t.Fatalf("the lineage's refusal has no hint: %v", err)
			}
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if hint < 2*time.Second {
		t.Fatalf("the lineage's budget was not spent, or its hint is short: %v", hint)
	}
	// And the node's own reserve for its upkeep (a session, heartbeats),
	// which only a holder of its credential can spend: the agent itself.
	spent := false
	for range 4 * controlplane.UpkeepReserveBurst {
		_, err := rogue.Agent.Heartbeat(ctx, connect.NewRequest(&tetherv1.HeartbeatRequest{NodeId: child.Node.NodeId}))
		if connect.CodeOf(err) == connect.CodeResourceExhausted {
			spent = true
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if !spent {
		t.Fatal("the node's upkeep reserve was never spent")
	}

	done := make(chan error, 1)
	go func() { done <- agent.Run(ctx) }()
	// A guard against a hang, not a measure: before the fix Run never
	// waited by the policy, so the server's clock never moved and the
	// session was refused for ever.
	guard := time.NewTimer(60 * time.Second)
	defer guard.Stop()
	select {
	case <-agent.Opened():
	case err := <-done:
		t.Fatalf("Run returned %v before its session opened", err)
	case <-guard.C:
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("the session never opened: Run reconnected without waiting the refusal's hint (waits by the policy: %v)", waits)
	}
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if len(waits) == 0 || waits[0] < hint {
		t.Errorf("Run's waits before reconnecting: %v, want the first of at least the hint %v", waits, hint)
	}
}
