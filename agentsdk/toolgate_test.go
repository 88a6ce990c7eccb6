package agentsdk_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane/embedded"
	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// A hostile agent hands a tool an input far larger than a request may be,
// and the tool's error echoes it: the gate still records the call's end
// (its error clipped to what the ledger keeps), and returns the tool's own error.
// Before, EndCall carried the whole error, the control plane refused the
// oversized request, and the call stayed in flight in the ledger.
func TestToolGateRecordsTheEndOfACallWhoseErrorIsHuge(t *testing.T) {
	ctx := context.Background()
	w := startShellWorld(t)
	operator, agent := w.operator, w.agent
	gate := agentsdk.NewToolGate(agentsdk.Dial(operator.BaseURL, w.gateToken, agentsdk.WithHTTPClient(operator.HTTP)), "shell-gate")
	t.Cleanup(gate.Close)
	<-gate.Ready()

	// 2 MiB of the agent's input, ending in a character split by any clip.
	input := strings.Repeat("é", 1<<20)
	toolErr := errors.New("no such file: " + input)
	err := gate.Call(ctx, w.rootToken, "shell", func(context.Context) error { return toolErr })
	if err != toolErr {
		t.Fatalf("Call returned %v, want only the tool's own error (the end was not recorded?)", shorten(err))
	}
	// ListCalls lists the calls still open: none, the end is recorded.
	open, err := operator.Tool.ListCalls(ctx, connect.NewRequest(&tetherv1.ListCallsRequest{NodeId: agent.NodeID()}))
	if err != nil {
		t.Fatal(err)
	}
	if len(open.Msg.Calls) != 0 {
		c := open.Msg.Calls[0]
		t.Fatalf("the ledger still holds call %s as %s: its end was never recorded", c.CallId, c.State)
	}
}

func shorten(err error) string {
	if err == nil {
		return "<nil>"
	}
	s := err.Error()
	if len(s) > 200 {
		return s[:200] + "..."
	}
	return s
}

// cancelAfter cancels a caller's context once a BeginCall request has been
// answered by the control plane, before the gate reads the answer: the
// moment a rogue MCP client picks to drop its request.
type cancelAfter struct {
	base   http.RoundTripper
	cancel context.CancelFunc
}

func (c *cancelAfter) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := c.base.RoundTrip(r)
	if strings.HasSuffix(r.URL.Path, "/BeginCall") {
		c.cancel()
	}
	return resp, err
}

// A caller that gives up after the control plane recorded the begin, but
// before the gate heard the answer, leaves no call in flight: the gate
// waits for the answer and ends the call without running the tool. Before,
// BeginCall failed with the caller's cancellation, the gate never learned
// the call id, and the ledger kept a call nobody would end (a drain waits
// for it; an abort then records the gate's unacknowledged cancel).
func TestToolGateEndsACallItsCallerLeftDuringTheBegin(t *testing.T) {
	ctx := context.Background()
	w := startShellWorld(t)
	operator, agent := w.operator, w.agent
	callCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	hc := &http.Client{Transport: &cancelAfter{base: operator.HTTP.Transport, cancel: cancel}}
	gate := agentsdk.NewToolGate(agentsdk.Dial(operator.BaseURL, w.gateToken, agentsdk.WithHTTPClient(hc)), "shell-gate")
	t.Cleanup(gate.Close)
	<-gate.Ready()

	ran := false
	err := gate.Call(callCtx, w.rootToken, "shell", func(context.Context) error { ran = true; return nil })
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Call returned %v, want the caller's cancellation", err)
	}
	if ran {
		t.Fatal("the tool ran for a caller that had left")
	}
	open, err := operator.Tool.ListCalls(ctx, connect.NewRequest(&tetherv1.ListCallsRequest{NodeId: agent.NodeID()}))
	if err != nil {
		t.Fatal(err)
	}
	if len(open.Msg.Calls) != 0 {
		t.Fatalf("the ledger still holds call %s as %s: nobody will end it", open.Msg.Calls[0].CallId, open.Msg.Calls[0].State)
	}
}

// shellWorld is an embedded control plane with one root agent holding
// tool:shell and a tool server's token for the gate "shell-gate".
type shellWorld struct {
	operator             *agentsdk.Conn
	agent                *agentsdk.Agent
	rootToken, gateToken string
}

func startShellWorld(t *testing.T) shellWorld {
	t.Helper()
	ctx := context.Background()
	srv := startEmbedded(t)
	operator := agentsdk.Dial(srv.URL, srv.AdminToken)
	agent, err := agentsdk.RegisterRoot(ctx, operator, "worker", nil)
	if err != nil {
		t.Fatal(err)
	}
	root, err := operator.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{
		HolderNodeId: agent.NodeID(), Scopes: []string{"tool:shell"}, Ttl: durationpb.New(time.Hour),
	}))
	if err != nil {
		t.Fatal(err)
	}
	minted, err := operator.Auth.CreateToken(ctx, connect.NewRequest(&tetherv1.CreateTokenRequest{ToolServer: "shell-gate"}))
	if err != nil {
		t.Fatal(err)
	}
	return shellWorld{operator: operator, agent: agent, rootToken: root.Msg.Token, gateToken: minted.Msg.Token}
}

// startEmbedded starts an embedded control plane on a scratch directory,
// stopped when the test ends.
func startEmbedded(t *testing.T) *embedded.Server {
	t.Helper()
	dir := t.TempDir()
	srv, err := embedded.Start(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop(); os.RemoveAll(dir) })
	return srv
}

// embeddedRoot starts an embedded control plane (startEmbedded) and has
// its operator register a root agent called name.
func embeddedRoot(t *testing.T, name string) (srv *embedded.Server, operator *agentsdk.Conn, root *agentsdk.Agent) {
	t.Helper()
	srv = startEmbedded(t)
	operator = agentsdk.Dial(srv.URL, srv.AdminToken)
	root, err := agentsdk.RegisterRoot(context.Background(), operator, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	return srv, operator, root
}

// spawnChild has parent spawn a child called name, unlabelled.
func spawnChild(t *testing.T, parent *agentsdk.Agent, name string) agentsdk.Child {
	t.Helper()
	child, err := parent.Spawn(context.Background(), name, nil)
	if err != nil {
		t.Fatal(err)
	}
	return child
}

// A rogue tool (or the agent behind it) would like a call whose side
// effect happened recorded as cancelled. After the cancel order reaches a
// call, the gate reports what the handler did: a handler that returned a
// result is recorded completed, one that returned its own error failed, and
// only one that stopped because of the cancellation (its context's error)
// is acknowledged. Through the real server, in abort mode: every call is
// settled once its report lands, so the abort does not wait out its hour of
// acknowledgement timeout. Before, the gate sent CancelAck for all three,
// and the record said cancelled_acked for calls that ran to the end.
func TestToolGateAfterACancelReportsWhatTheHandlerDid(t *testing.T) {
	ctx := context.Background()
	w := startShellWorld(t)
	operator, agent := w.operator, w.agent
	gate := agentsdk.NewToolGate(agentsdk.Dial(operator.BaseURL, w.gateToken, agentsdk.WithHTTPClient(operator.HTTP)), "shell-gate")
	t.Cleanup(gate.Close)
	<-gate.Ready()

	toolErr := errors.New("disk full")
	handlers := map[string]func(ctx context.Context) error{
		"completed": func(ctx context.Context) error { <-ctx.Done(); return nil },
		"failed":    func(ctx context.Context) error { <-ctx.Done(); return toolErr },
		"stopped":   func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() },
	}
	type outcome struct {
		name string
		err  error
	}
	started := make(chan string, len(handlers)+1)
	done := make(chan outcome, len(handlers)+1)
	for name, h := range handlers {
		go func() {
			err := gate.Call(ctx, w.rootToken, "shell", func(ctx context.Context) error {
				started <- name
				return h(ctx)
			})
			done <- outcome{name, err}
		}()
	}
	// An HTTP tool that writes its answer after the order: completed.
	recorder := httptest.NewRecorder()
	httpReq := httptest.NewRequest("POST", "/shell", nil).WithContext(ctx)
	httpReq.Header.Set(agentsdk.CapabilityHeader, w.rootToken)
	go func() {
		gate.Middleware("shell", http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			started <- "http"
			<-r.Context().Done()
			rw.Write([]byte("written anyway"))
		})).ServeHTTP(recorder, httpReq)
		done <- outcome{"http", nil}
	}()
	for range len(handlers) + 1 {
		<-started
	}

	term, err := operator.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: agent.NodeID(), Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT,
		CancelAckTimeout: durationpb.New(time.Hour), ConfirmTimeout: durationpb.New(time.Hour),
	}))
	if err != nil {
		t.Fatal(err)
	}
	for range len(handlers) + 1 {
		o := <-done
		switch o.name {
		case "completed":
			if o.err != nil {
				t.Errorf("a call that completed after the order returned %v, want nil", o.err)
			}
		case "failed":
			if o.err != toolErr {
				t.Errorf("a call that failed after the order returned %v, want the tool's own error", o.err)
			}
		case "stopped":
			if !errors.Is(o.err, agentsdk.ErrCancelled) {
				t.Errorf("a call the cancel stopped returned %v, want ErrCancelled", o.err)
			}
		case "http":
			if recorder.Body.String() != "written anyway" {
				t.Errorf("the HTTP tool's answer: %q", recorder.Body.String())
			}
		}
	}
	id := term.Msg.Termination.TerminationId
	state := func() tetherv1.TerminationState {
		got, err := operator.Supervisor.GetTermination(ctx, connect.NewRequest(&tetherv1.GetTerminationRequest{TerminationId: id}))
		if err != nil {
			t.Fatal(err)
		}
		return got.Msg.Termination.State
	}
	// Every call is settled: the abort moves on without its hour.
	testserver.WaitFor(t, 20*time.Second, "the abort to reconcile", func() bool {
		return state() == tetherv1.TerminationState_TERMINATION_STATE_RECONCILING
	})
	if _, err := operator.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: agent.NodeID()})); err != nil {
		t.Fatal(err)
	}
	testserver.WaitFor(t, 20*time.Second, "the abort to terminate", func() bool {
		return state() == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	got, err := operator.Supervisor.GetTermination(ctx, connect.NewRequest(&tetherv1.GetTerminationRequest{TerminationId: id}))
	if err != nil {
		t.Fatal(err)
	}
	rec, err := operator.Supervisor.GetRecord(ctx, connect.NewRequest(&tetherv1.GetRecordRequest{RecordId: got.Msg.Termination.RecordId}))
	if err != nil {
		t.Fatal(err)
	}
	count := map[tetherv1.CallResolution]int{}
	for _, c := range rec.Msg.Record.ToolCalls {
		count[c.Resolution]++
		if c.Resolution == tetherv1.CallResolution_CALL_RESOLUTION_CANCELLED_ACKED {
			if c.AcknowledgedBy != "tool:shell-gate" {
				t.Errorf("call %s acknowledged by %q, want tool:shell-gate", c.CallId, c.AcknowledgedBy)
			}
		} else if c.AcknowledgedBy != "" {
			t.Errorf("call %s is %s but acknowledged by %q", c.CallId, c.Resolution, c.AcknowledgedBy)
		}
	}
	want := map[tetherv1.CallResolution]int{
		tetherv1.CallResolution_CALL_RESOLUTION_COMPLETED:       2,
		tetherv1.CallResolution_CALL_RESOLUTION_FAILED:          1,
		tetherv1.CallResolution_CALL_RESOLUTION_CANCELLED_ACKED: 1,
	}
	if len(count) != len(want) || count[tetherv1.CallResolution_CALL_RESOLUTION_COMPLETED] != 2 ||
		count[tetherv1.CallResolution_CALL_RESOLUTION_FAILED] != 1 || count[tetherv1.CallResolution_CALL_RESOLUTION_CANCELLED_ACKED] != 1 {
		t.Fatalf("record: %v, want %v", count, want)
	}
}

// A call its caller cancels before the gate heard the cancel order (an
// agent's run cancelled on its own abort signal can come first) stopped
// after the order existed, and the abort waits for its acknowledgement:
// the gate acknowledges it. A call its caller cancels with no order is
// failed, the caller's cancellation as its error. The gate here never hears
// its orders (its cancel stream is held up), so only the caller stops the
// handlers. Before, the Go gate reported the first failed, and the record
// said failed where the TypeScript and Python gates' said cancelled_acked.
func TestToolGateAcknowledgesACallItsCallerStoppedOnlyIfTheCancelWasOrdered(t *testing.T) {
	ctx := context.Background()
	w := startShellWorld(t)
	operator, agent := w.operator, w.agent
	hc := &http.Client{Transport: deafToCancels{base: operator.HTTP.Transport}}
	gate := agentsdk.NewToolGate(agentsdk.Dial(operator.BaseURL, w.gateToken, agentsdk.WithHTTPClient(hc)), "shell-gate")
	t.Cleanup(gate.Close)

	// call runs a call whose handler waits for its caller to cancel it.
	call := func() (ids chan string, cancel context.CancelFunc, done chan error) {
		callCtx, cancel := context.WithCancel(ctx)
		ids, done = make(chan string, 1), make(chan error, 1)
		go func() {
			done <- gate.Call(callCtx, w.rootToken, "shell", func(ctx context.Context) error {
				ids <- "started"
				<-ctx.Done()
				return ctx.Err()
			})
		}()
		<-ids
		return ids, cancel, done
	}
	openCalls := func() []*tetherv1.ToolCall {
		open, err := operator.Tool.ListCalls(ctx, connect.NewRequest(&tetherv1.ListCallsRequest{NodeId: agent.NodeID()}))
		if err != nil {
			t.Fatal(err)
		}
		return open.Msg.Calls
	}

	// No order: failed, with the caller's cancellation.
	_, cancel, done := call()
	if calls := openCalls(); len(calls) != 1 {
		t.Fatalf("%d calls open, want 1", len(calls))
	}
	unordered := openCalls()[0].CallId
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("a call its caller cancelled returned %v, want context.Canceled", err)
	}
	if calls := openCalls(); len(calls) != 0 {
		t.Fatalf("call %s is still %s: the gate did not end it", calls[0].CallId, calls[0].State)
	}

	// Ordered: the abort's order exists when the caller cancels.
	_, cancel, done = call()
	term, err := operator.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: agent.NodeID(), Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT,
		CancelAckTimeout: durationpb.New(time.Hour), ConfirmTimeout: durationpb.New(time.Hour),
	}))
	if err != nil {
		t.Fatal(err)
	}
	testserver.WaitFor(t, 20*time.Second, "the cancel order", func() bool {
		calls := openCalls()
		return len(calls) == 1 && calls[0].State == tetherv1.CallState_CALL_STATE_CANCEL_REQUESTED
	})
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("a call its caller cancelled after the order returned %v, want context.Canceled", err)
	}

	id := term.Msg.Termination.TerminationId
	state := func() tetherv1.TerminationState {
		got, err := operator.Supervisor.GetTermination(ctx, connect.NewRequest(&tetherv1.GetTerminationRequest{TerminationId: id}))
		if err != nil {
			t.Fatal(err)
		}
		return got.Msg.Termination.State
	}
	// Acknowledged: the abort does not wait out its hour.
	testserver.WaitFor(t, 20*time.Second, "the abort to reconcile", func() bool {
		return state() == tetherv1.TerminationState_TERMINATION_STATE_RECONCILING
	})
	if _, err := operator.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: agent.NodeID()})); err != nil {
		t.Fatal(err)
	}
	testserver.WaitFor(t, 20*time.Second, "the abort to terminate", func() bool {
		return state() == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	got, err := operator.Supervisor.GetTermination(ctx, connect.NewRequest(&tetherv1.GetTerminationRequest{TerminationId: id}))
	if err != nil {
		t.Fatal(err)
	}
	rec, err := operator.Supervisor.GetRecord(ctx, connect.NewRequest(&tetherv1.GetRecordRequest{RecordId: got.Msg.Termination.RecordId}))
	if err != nil {
		t.Fatal(err)
	}
	// (The call cancelled with no order ended before the abort: it is not
	// the abort's to list, and the control plane refuses to acknowledge a
	// call with no order.)
	calls := rec.Msg.Record.ToolCalls
	if len(calls) != 1 || calls[0].CallId == unordered {
		t.Fatalf("the record lists %v, want the one call cancelled after the order", calls)
	}
	if c := calls[0]; c.Resolution != tetherv1.CallResolution_CALL_RESOLUTION_CANCELLED_ACKED || c.AcknowledgedBy != "tool:shell-gate" {
		t.Errorf("the call cancelled after the order: %s acknowledged by %q, error %q; want cancelled_acked by tool:shell-gate", c.Resolution, c.AcknowledgedBy, c.Error)
	}
}

// deafToCancels holds up the gate's cancel stream until the gate closes:
// the gate never hears an order.
type deafToCancels struct{ base http.RoundTripper }

func (d deafToCancels) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.HasSuffix(r.URL.Path, "/WatchCancels") {
		<-r.Context().Done()
		return nil, r.Context().Err()
	}
	return d.base.RoundTrip(r)
}
