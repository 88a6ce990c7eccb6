package agentsdk_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/proto/tether/v1/tetherv1connect"
)

// The forty-fifth hostile pass on the MCP tether (letter F): the gate's
// path to the control plane (a proxy that replays, caches or crosses
// answers, as rogue43v's path does to a LeaseWorker) answers one call's
// BeginCall with the answer to another call the gate has in flight. The
// MCP gateway's calls are the Go ToolGate's (CallScoped), so an agent's
// call through `tether mcp wrap` is exposed the same.
//
// The gate took any call id it was answered: the second call ran under the
// first's id, its registration replaced the first's cancel and its end
// removed it, and its EndCall recorded the first call completed while the
// first's tool still ran. The first call was then deaf to its cancel (the
// control plane had none to order: the call was ended), and the second's
// own call stayed in flight in the ledger, its id unknown to the gate.

// rogue45FPath answers the second BeginCall it relays with the answer to
// the first, whatever the control plane answered the second.
type rogue45FPath struct {
	mu     sync.Mutex
	first  *tetherv1.BeginCallResponse
	begins int
}

func (p *rogue45FPath) interceptor() connect.UnaryInterceptorFunc {
	return func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			resp, err := next(ctx, req)
			if req.Spec().Procedure != tetherv1connect.ToolServiceBeginCallProcedure {
				return resp, err
			}
			p.mu.Lock()
			defer p.mu.Unlock()
			p.begins++
			switch {
			case p.begins == 1 && err == nil:
				p.first = proto.Clone(resp.Any().(*tetherv1.BeginCallResponse)).(*tetherv1.BeginCallResponse)
			case p.begins == 2 && p.first != nil: // whatever the control plane answered
				return connect.NewResponse(proto.Clone(p.first).(*tetherv1.BeginCallResponse)), nil
			}
			return resp, err
		}
	}
}

// TestRogue45FGateRefusesABeginCallAnswerNamingAnotherCallInFlight: call
// B runs (its tool waits for its context); call A's BeginCall is answered
// with B's answer. A's tool must not run under B's id, B must stay in
// flight in the ledger while its tool runs, and B must still hear its
// cancel when the agent is aborted.
func TestRogue45FGateRefusesABeginCallAnswerNamingAnotherCallInFlight(t *testing.T) {
	ctx := context.Background()
	w := startShellWorld(t)
	operator, agent := w.operator, w.agent
	path := &rogue45FPath{}
	gate := agentsdk.NewToolGate(agentsdk.Dial(operator.BaseURL, w.gateToken, agentsdk.WithHTTPClient(operator.HTTP),
		agentsdk.WithClientOptions(connect.WithInterceptors(path.interceptor()))), "shell-gate")
	t.Cleanup(gate.Close)
	<-gate.Ready()

	// Call B: its tool runs until its context ends (at the latest as the
	// test ends, its caller leaving).
	bctx, leave := context.WithCancel(ctx)
	t.Cleanup(leave)
	bStarted := make(chan struct{})
	bDone := make(chan error, 1)
	go func() {
		bDone <- gate.Call(bctx, w.rootToken, "shell", func(ctx context.Context) error {
			close(bStarted)
			<-ctx.Done()
			return ctx.Err()
		})
	}()
	select {
	case <-bStarted:
	case err := <-bDone:
		t.Fatalf("call B ended before its tool ran: %v", err)
	}

	// Call A: the path answers its BeginCall with B's answer.
	ranA := 0
	errA := gate.Call(ctx, w.rootToken, "shell", func(ctx context.Context) error {
		ranA++ // the side effect
		return nil
	})
	if ranA != 0 || errA == nil {
		t.Fatalf("call A answered with call B's begin: its tool ran %d time(s), Call returned %v; want not run, an error", ranA, errA)
	}
	if connect.CodeOf(errA) != connect.CodeInternal {
		t.Fatalf("call A returned %v, want internal", errA)
	}

	// The ledger: B still in flight while its tool runs (and A's own
	// call, begun at the control plane, whose id the gate never learned).
	open, err := operator.Tool.ListCalls(ctx, connect.NewRequest(&tetherv1.ListCallsRequest{NodeId: agent.NodeID()}))
	if err != nil {
		t.Fatal(err)
	}
	bID := path.first.GetCall().GetCallId()
	inFlight := false
	for _, c := range open.Msg.Calls {
		if c.CallId == bID {
			inFlight = true
		}
	}
	if !inFlight || len(open.Msg.Calls) != 2 {
		t.Fatalf("call B (%s) in flight: %v, open calls %v; want B and A's own call open", bID, inFlight, open.Msg.Calls)
	}

	// The abort: B's tool hears its cancel and the gate acknowledges it.
	if _, err := operator.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: agent.NodeID(), Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT,
		CancelAckTimeout: durationpb.New(30 * time.Second), ConfirmTimeout: durationpb.New(2 * time.Second), Reason: "rogue45f",
	})); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-bDone:
		if !errors.Is(err, agentsdk.ErrCancelled) {
			t.Fatalf("call B returned %v, want ErrCancelled", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("call B's tool never heard its cancel")
	}
}

// TestRogue45FGateRefusesABeginCallAnswerOfAnotherTool: the path answers a
// call of the tool "read" with the answer to an earlier call of "shell"
// (ended: no call the gate has in flight). The gate ran "read" under the
// "shell" call's id (its EndCall then refused: the call was ended), deaf
// to the cancel of the call the control plane had begun, if any: a call's
// answer names its tool, and one naming another is not this call's.
func TestRogue45FGateRefusesABeginCallAnswerOfAnotherTool(t *testing.T) {
	ctx := context.Background()
	w := startShellWorld(t)
	path := &rogue45FPath{}
	gate := agentsdk.NewToolGate(agentsdk.Dial(w.operator.BaseURL, w.gateToken, agentsdk.WithHTTPClient(w.operator.HTTP),
		agentsdk.WithClientOptions(connect.WithInterceptors(path.interceptor()))), "shell-gate")
	t.Cleanup(gate.Close)
	<-gate.Ready()
	if err := gate.Call(ctx, w.rootToken, "shell", func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	ran := 0
	err := gate.Call(ctx, w.rootToken, "read", func(context.Context) error {
		ran++ // the side effect
		return nil
	})
	if ran != 0 || connect.CodeOf(err) != connect.CodeInternal {
		t.Fatalf("a call of read answered with a call of shell: its tool ran %d time(s), Call returned %v; want not run, internal", ran, err)
	}
}
