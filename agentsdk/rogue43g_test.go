package agentsdk_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/proto/tether/v1/tetherv1connect"
)

// The agent being stopped has its call begun (BeginCall recorded) just as
// its abort is ordered: the control plane writes the cancel order of the
// call it recorded, and the gate hears it before BeginCall's answer (a
// round trip the agent's path, or a loaded control plane, stretches). The
// gate held the order (an early order) and cancelled the call's context the
// moment it registered it, but then ran the handler all the same: a tool
// that does its side effect before it looks at its context (most never
// look) did it after its stop, and the ledger read the call completed by
// the agent the stop was about. Now the gate runs no handler whose cancel
// is already ordered: it acknowledges the cancel and returns ErrCancelled.
// The TypeScript gate the same (rogue43G.test.ts).
func TestRogue43GEarlyCancelOrderStopsTheCallBeforeItsHandlerRuns(t *testing.T) {
	ctx := context.Background()
	w := startShellWorld(t)
	operator, agent := w.operator, w.agent
	// The gate's own path to the control plane holds BeginCall's answer
	// until the abort was ordered and the gate holds the call's cancel
	// order (what a slow answer does, made certain).
	var gate *agentsdk.ToolGate
	terminationID := ""
	slowBegin := connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			resp, err := next(ctx, req)
			if err == nil && req.Spec().Procedure == tetherv1connect.ToolServiceBeginCallProcedure {
				term, terr := operator.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
					NodeId: agent.NodeID(), Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT,
					CancelAckTimeout: durationpb.New(30 * time.Second), ConfirmTimeout: durationpb.New(2 * time.Second), Reason: "rogue43g",
				}))
				if terr != nil {
					return nil, terr
				}
				terminationID = term.Msg.GetTermination().GetTerminationId()
				testserver.WaitFor(t, 20*time.Second, "the gate holding the call's cancel order", func() bool { return gate.HeldOrders() == 1 })
			}
			return resp, err
		}
	})
	gate = agentsdk.NewToolGate(agentsdk.Dial(operator.BaseURL, w.gateToken, agentsdk.WithHTTPClient(operator.HTTP),
		agentsdk.WithClientOptions(connect.WithInterceptors(slowBegin))), "shell-gate")
	t.Cleanup(gate.Close)
	<-gate.Ready()

	ran := 0
	err := gate.Call(ctx, w.rootToken, "shell", func(ctx context.Context) error {
		ran++ // the side effect: done before any look at the context
		return nil
	})
	if terminationID == "" {
		t.Fatal("the abort was not ordered while BeginCall's answer was held")
	}
	if ran != 0 {
		t.Fatalf("the tool ran %d time(s) after its cancel was ordered (Call returned %v)", ran, err)
	}
	if !errors.Is(err, agentsdk.ErrCancelled) {
		t.Fatalf("Call returned %v, want ErrCancelled", err)
	}
	if n := gate.HeldOrders(); n != 0 {
		t.Fatalf("the gate still holds %d orders", n)
	}
	// The record: the call stopped on its cancel, acknowledged by the gate.
	if _, err := operator.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: agent.NodeID()})); err != nil {
		t.Fatal(err)
	}
	var term *tetherv1.Termination
	testserver.WaitFor(t, 20*time.Second, "the abort to terminate", func() bool {
		got, err := operator.Supervisor.GetTermination(ctx, connect.NewRequest(&tetherv1.GetTerminationRequest{TerminationId: terminationID}))
		if err != nil {
			t.Fatal(err)
		}
		term = got.Msg.Termination
		return term.State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	rec, err := agentsdk.ReadRecord(ctx, operator.Supervisor, &tetherv1.GetRecordRequest{RecordId: term.RecordId})
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.ToolCalls) != 1 || rec.ToolCalls[0].Resolution != tetherv1.CallResolution_CALL_RESOLUTION_CANCELLED_ACKED {
		t.Fatalf("the record lists %v, want one call cancelled_acked", rec.ToolCalls)
	}
}
