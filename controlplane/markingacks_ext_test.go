package controlplane_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestAcknowledgementsWhileTheSubtreeIsStillBeingMarkedAreJudgedOnTheTermination:
// an abort marks its subtree one node a chunk, and is held after the chunk
// that marks the first child (its calls ordered cancelled, the termination
// still marking, no acknowledgement deadline yet). The gate acknowledges
// both of that child's calls then: both count (the second through the path
// that reads the call and its termination before the acknowledgement's
// transaction, taken while a termination seen here has no deadline). The
// mark then ends (deadline 2 s on); at the deadline's instant the gate
// acknowledges the second child's call, still on that path: refused
// failed_precondition, and the record says cancel_unacknowledged for it
// and cancelled_acked for the other two.
func TestAcknowledgementsWhileTheSubtreeIsStillBeingMarkedAreJudgedOnTheTermination(t *testing.T) {
	clk := clock.NewManual(epoch)
	var mu sync.Mutex
	held, release := make(chan struct{}), make(chan struct{})
	hold := true
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) {
		cfg.TerminationChunk = 1
		cfg.TerminationFault = func(step string, n int) {
			mu.Lock()
			stop := hold && step == "mark" && n == 2
			if stop {
				hold = false
			}
			mu.Unlock()
			if stop {
				close(held)
				<-release
			}
		}
	})
	released := false
	free := func() {
		if !released {
			released = true
			close(release)
		}
	}
	t.Cleanup(free)
	admin := srv.AdminClients()
	ctx := context.Background()
	root := register(t, admin, "root")
	first := spawn(t, admin, root.Node.NodeId, "first").Node.NodeId
	second := spawn(t, admin, root.Node.NodeId, "second").Node.NodeId
	gate := srv.Clients(srv.ToolServerToken(t, "gate-1"))
	begin := func(node string) string {
		t.Helper()
		issued, err := admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: node, Scopes: []string{"tool:*"}, Ttl: durationpb.New(time.Hour)}))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: issued.Msg.Token, Tool: "shell", GateId: "gate-1"}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg.Call.CallId
	}
	// The mark lists a parent's children in id order: the first it marks
	// gets two calls.
	if second < first {
		first, second = second, first
	}
	a1, a2, b1 := begin(first), begin(first), begin(second)
	ack := func(call string) error {
		_, err := gate.Tool.CancelAck(ctx, connect.NewRequest(&tetherv1.CancelAckRequest{CallId: call, GateId: "gate-1"}))
		return err
	}

	term := terminate(t, admin, root.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 2*time.Second, time.Hour)
	select {
	case <-held:
	case <-time.After(20 * time.Second):
		t.Fatal("the mark's second chunk did not commit")
	}
	if got := getTermination(t, admin, term.TerminationId).State; got != tetherv1.TerminationState_TERMINATION_STATE_REQUESTED {
		t.Fatalf("held after the mark's second chunk, the termination is %s, want still requested", got)
	}
	for node, want := range map[string]tetherv1.NodeState{first: tetherv1.NodeState_NODE_STATE_ABORTING, second: tetherv1.NodeState_NODE_STATE_RUNNING} {
		got, err := admin.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: node}))
		if err != nil {
			t.Fatal(err)
		}
		if got.Msg.Node.State != want {
			t.Fatalf("held after the mark's second chunk, node %s is %s, want %s", node, got.Msg.Node.State, want)
		}
	}
	for _, c := range []string{a1, a2} {
		if err := ack(c); err != nil {
			t.Fatalf("an acknowledgement while the subtree is still being marked: %v", err)
		}
	}
	free()
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_ABORTING)
	clk.Advance(2 * time.Second)
	err := ack(b1)
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "cancel_unacknowledged") {
		t.Errorf("an acknowledgement at the deadline's instant: %v; want failed_precondition saying the call is recorded cancel_unacknowledged", err)
	}
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	clk.Advance(time.Hour)
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	want := map[string]tetherv1.CallResolution{
		a1: tetherv1.CallResolution_CALL_RESOLUTION_CANCELLED_ACKED,
		a2: tetherv1.CallResolution_CALL_RESOLUTION_CANCELLED_ACKED,
		b1: tetherv1.CallResolution_CALL_RESOLUTION_CANCEL_UNACKNOWLEDGED,
	}
	for _, c := range record(t, admin, term.TerminationId).ToolCalls {
		if c.Resolution != want[c.CallId] {
			t.Errorf("call %s recorded %s, want %s", c.CallId, c.Resolution, want[c.CallId])
		}
		delete(want, c.CallId)
	}
	if len(want) != 0 {
		t.Errorf("calls missing from the record: %v", want)
	}
}
