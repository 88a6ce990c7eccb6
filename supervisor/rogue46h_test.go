package supervisor

import (
	"context"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/store/badgerstore"
)

// TestRogue46HAnAgentsStopWaitsTheLeastAckWindow: an agent's stop of its
// own child asked for no acknowledgement window gets the agents' least
// (MinAgentCancelAckTimeout), and one that asks longer keeps its own; an
// operator's keeps what it asks, zero included (the real server's test is
// controlplane's TestRogue46HAnOwnZeroWindowAbortDoesNotSilenceTheGate).
func TestRogue46HAnAgentsStopWaitsTheLeastAckWindow(t *testing.T) {
	s, _ := chunkTestSupervisor(t, badgerstore.BadgerOptions{}, 100)
	ctx := context.Background()
	var nodes []string
	for _, name := range []string{"p", "q"} {
		r, err := s.Tree.RegisterRoot(ctx, name, nil, "operator:test")
		if err != nil {
			t.Fatal(err)
		}
		c, err := s.Tree.Spawn(ctx, r.NodeID, "c", nil, "agent:"+r.NodeID, nil)
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, r.NodeID, c.NodeID)
	}
	for _, c := range []struct {
		what          string
		node, by, req string
		ack, want     int64 // seconds
	}{
		{"the agent's zero-window abort", nodes[1], "agent:" + nodes[0], nodes[0], 0, int64(MinAgentCancelAckTimeout.Seconds())},
		{"the agent's minute-long abort", nodes[3], "agent:" + nodes[2], nodes[2], 60, 60},
		{"the operator's zero-window abort", nodes[0], "operator:test", "", 0, 0},
	} {
		term, err := s.Terminate(ctx, TerminateRequest{NodeID: c.node, Mode: ModeAbort, Reason: "rogue46h",
			CancelAckTimeout: secs(c.ack), RequestedBy: c.by, RequesterNodeID: c.req})
		if err != nil {
			t.Fatalf("%s: %v", c.what, err)
		}
		if got := term.CancelAckTimeout; got != secs(c.want) {
			t.Errorf("%s waits %s for the gates' acknowledgements, want %s", c.what, got, secs(c.want))
		}
	}
}

func secs(n int64) time.Duration { return time.Duration(n) * time.Second }
