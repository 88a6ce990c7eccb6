package agentsdk_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// A rogue being drained cannot have its call through a tool's HTTP
// Middleware recorded failed by leaving it. The tool made its payment and
// waited for the bank's confirmation, as a Go handler does, under its
// request's context: the agent closed its connection, the context ended,
// the handler had nothing left to answer and returned, and the gate
// recorded the call failed ("context canceled") — on the word of the
// agent being stopped, though the payment was made, and the drain took the
// call for ended. The Middleware now runs the handler under a context its
// caller cannot cancel (the control plane's cancel order still does): the
// handler waits for the confirmation and answers, and the call is recorded
// completed.
func TestARogueCannotHaveItsCallThroughTheMiddlewareRecordedFailedByLeavingIt(t *testing.T) {
	ctx := context.Background()
	w := startShellWorld(t)
	operator, agent := w.operator, w.agent
	gate := agentsdk.NewToolGate(agentsdk.Dial(operator.BaseURL, w.gateToken, agentsdk.WithHTTPClient(operator.HTTP)), "shell-gate")
	t.Cleanup(gate.Close)
	<-gate.Ready()

	var paid atomic.Int32
	made, confirm, callerGone := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var confirmOnce, goneOnce sync.Once
	t.Cleanup(func() { confirmOnce.Do(func() { close(confirm) }) })
	pay := gate.Middleware("shell", http.HandlerFunc(func(wr http.ResponseWriter, r *http.Request) {
		paid.Add(1)
		close(made)
		select {
		case <-confirm:
		case <-r.Context().Done():
		}
		if r.Context().Err() != nil {
			return // its caller is gone: nothing to answer
		}
		_, _ = io.WriteString(wr, "paid")
	}))
	tool := httptest.NewServer(http.HandlerFunc(func(wr http.ResponseWriter, r *http.Request) {
		// (The request's own context: it ends when the agent leaves.)
		go func() { <-r.Context().Done(); goneOnce.Do(func() { close(callerGone) }) }()
		pay.ServeHTTP(wr, r)
	}))
	t.Cleanup(tool.Close)

	callCtx, leave := context.WithCancel(ctx)
	t.Cleanup(leave)
	go func() {
		req, err := http.NewRequestWithContext(callCtx, http.MethodPost, tool.URL, nil)
		if err != nil {
			return
		}
		req.Header.Set(agentsdk.CapabilityHeader, w.rootToken)
		hc := &http.Client{Transport: &http.Transport{}}
		if resp, err := hc.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	<-made
	term, err := operator.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: agent.NodeID(), Mode: tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, Reason: "test",
		DrainWindow: durationpb.New(time.Hour), CancelAckTimeout: durationpb.New(time.Minute), ConfirmTimeout: durationpb.New(time.Hour),
	}))
	if err != nil {
		t.Fatal(err)
	}
	id := term.Msg.Termination.TerminationId
	state := func() *tetherv1.Termination {
		got, err := operator.Supervisor.GetTermination(ctx, connect.NewRequest(&tetherv1.GetTerminationRequest{TerminationId: id}))
		if err != nil {
			t.Fatal(err)
		}
		return got.Msg.Termination
	}
	testserver.WaitFor(t, 20*time.Second, "the drain", func() bool {
		return state().State == tetherv1.TerminationState_TERMINATION_STATE_DRAINING
	})

	leave() // the rogue closes its connection
	<-callerGone
	confirmOnce.Do(func() { close(confirm) }) // the bank confirms
	testserver.WaitFor(t, 20*time.Second, "the drain to end", func() bool {
		return state().State == tetherv1.TerminationState_TERMINATION_STATE_RECONCILING
	})
	if _, err := operator.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: agent.NodeID()})); err != nil {
		t.Fatal(err)
	}
	testserver.WaitFor(t, 20*time.Second, "the termination", func() bool {
		return state().State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	rec, err := operator.Supervisor.GetRecord(ctx, connect.NewRequest(&tetherv1.GetRecordRequest{RecordId: state().RecordId}))
	if err != nil {
		t.Fatal(err)
	}
	calls := rec.Msg.Record.ToolCalls
	if len(calls) != 1 {
		t.Fatalf("the record lists %v, want the payment once", calls)
	}
	if c := calls[0]; c.Resolution != tetherv1.CallResolution_CALL_RESOLUTION_COMPLETED || c.EndedBy != "tool:shell-gate" || c.Error != "" {
		t.Errorf("the payment the tool made, left by the rogue being drained: %s ended by %q (%q); want completed, ended by tool:shell-gate, as the tool answered",
			c.Resolution, c.EndedBy, c.Error)
	}
	if n := paid.Load(); n != 1 {
		t.Errorf("the tool made %d payments, want 1", n)
	}
}
