package agentsdk_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/tree"
)

// The fortieth hostile pass on the Go agent SDK (letter A).

// rogue40aTools serves h behind gate's Middleware over HTTP/1.1 and over
// HTTP/2 (TLS), as tool servers do: no read or write timeout of their
// own.
func rogue40aTools(t *testing.T, gate *agentsdk.ToolGate, h http.Handler) map[string]*httptest.Server {
	t.Helper()
	tools := map[string]*httptest.Server{}
	for _, proto := range []string{"HTTP/1.1", "HTTP/2"} {
		s := httptest.NewUnstartedServer(gate.Middleware("shell", h))
		s.Config.ErrorLog = log.New(io.Discard, "", 0)
		if proto == "HTTP/2" {
			s.EnableHTTP2 = true
			s.StartTLS()
		} else {
			s.Start()
		}
		t.Cleanup(s.Close)
		tools[proto] = s
	}
	return tools
}

// rogue40aAbort aborts the agent with an hour to acknowledge each cancel
// and to confirm its exit, and waits (a guard against the hang, not a
// timing) for the abort to reconcile: every call it cancelled settled.
// It returns the termination's record once the exit is confirmed.
func rogue40aAbort(t *testing.T, w shellWorld, stillOpen func() string) *tetherv1.ReconciliationRecord {
	t.Helper()
	ctx := context.Background()
	term, err := w.operator.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: w.agent.NodeID(), Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT,
		CancelAckTimeout: durationpb.New(time.Hour), ConfirmTimeout: durationpb.New(time.Hour),
	}))
	if err != nil {
		t.Fatal(err)
	}
	id := term.Msg.Termination.TerminationId
	get := func() *tetherv1.Termination {
		got, err := w.operator.Supervisor.GetTermination(ctx, connect.NewRequest(&tetherv1.GetTerminationRequest{TerminationId: id}))
		if err != nil {
			t.Fatal(err)
		}
		return got.Msg.Termination
	}
	deadline := time.Now().Add(20 * time.Second) // a guard against the hang, not a timing
	for get().State != tetherv1.TerminationState_TERMINATION_STATE_RECONCILING {
		if time.Now().After(deadline) {
			t.Fatalf("the abort still waits for the gate's acknowledgements (an hour's window) 20 s after its orders: %s", stillOpen())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := w.operator.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: w.agent.NodeID()})); err != nil {
		t.Fatal(err)
	}
	testserver.WaitFor(t, 20*time.Second, "the abort to terminate", func() bool {
		return get().State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	rec, err := agentsdk.ReadRecord(ctx, w.operator.Supervisor, &tetherv1.GetRecordRequest{RecordId: get().RecordId})
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// rogue40aOpenCalls describes the agent's calls the ledger holds open.
func rogue40aOpenCalls(t *testing.T, w shellWorld) string {
	t.Helper()
	open, err := w.operator.Tool.ListCalls(context.Background(), connect.NewRequest(&tetherv1.ListCallsRequest{NodeId: w.agent.NodeID()}))
	if err != nil {
		t.Fatal(err)
	}
	states := make([]string, len(open.Msg.Calls))
	for i, c := range open.Msg.Calls {
		states[i] = c.State.String()
	}
	return fmt.Sprintf("%d calls open %v", len(open.Msg.Calls), states)
}

// TestRogue40ACallerHoldingBackItsBodyDoesNotHoldItsAbort: a gated HTTP
// tool begins its call, through Middleware, as its headers arrive, and
// reads its input from the request's body inside the call. A rogue agent
// sends the headers of its call and the first bytes of its body, and
// holds the rest back. Its abort's cancel order ended the handler's
// context, but not its read of the body, which the order did not reach:
// the handler never returned, the gate never acknowledged, the abort
// waited out its acknowledgement window and recorded the honest tool
// server's cancel unacknowledged — and the rogue, sending the rest of its
// body after its stop, had the tool run its side effect then. The order
// now cuts the body: a read ends with ErrCancelled, and a call whose body
// the order cut short is acknowledged.
func TestRogue40ACallerHoldingBackItsBodyDoesNotHoldItsAbort(t *testing.T) {
	ctx := context.Background()
	w := startShellWorld(t)
	gate := agentsdk.NewToolGate(agentsdk.Dial(w.operator.BaseURL, w.gateToken, agentsdk.WithHTTPClient(w.operator.HTTP)), "shell-gate")
	t.Cleanup(gate.Close)
	<-gate.Ready()

	started := make(chan struct{}, 2)
	var ran atomic.Int32     // side effects the tool ran
	var readErr atomic.Value // the error the tool's read of its body ended with
	tools := rogue40aTools(t, gate, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		var in struct{ Cmd string }
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			readErr.Store(err)
			http.Error(rw, "bad input: "+err.Error(), http.StatusBadRequest)
			return
		}
		ran.Add(1) // the tool's side effect
		rw.Write([]byte("ran " + in.Cmd))
	}))

	// The rogue agent's calls: headers and a first part of the body.
	rest := map[string]*io.PipeWriter{}
	for proto, tool := range tools {
		body, held := io.Pipe()
		rest[proto] = held
		// Run before the tool server's Close, which waits for its handlers.
		t.Cleanup(func() { held.CloseWithError(errors.New("rogue40a: the test is over")) })
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, tool.URL, body)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(agentsdk.CapabilityHeader, w.rootToken)
		go func() {
			if resp, err := tool.Client().Do(req); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
		go held.Write([]byte(`{"Cmd": `))
		<-started // the call is begun: in flight in the ledger
	}

	rec := rogue40aAbort(t, w, func() string { return rogue40aOpenCalls(t, w) })
	// What the rogue held back comes after its stop.
	for _, held := range rest {
		go func() {
			held.Write([]byte(`"rm -rf /srv/data"}`))
			held.Close()
		}()
	}
	acked := 0
	for _, c := range rec.ToolCalls {
		if c.Resolution == tetherv1.CallResolution_CALL_RESOLUTION_CANCELLED_ACKED && c.AcknowledgedBy == "tool:shell-gate" {
			acked++
		} else {
			t.Errorf("call %s is %s (acknowledged by %q), want cancelled_acked by tool:shell-gate: its body was cut by the order", c.CallId, c.Resolution, c.AcknowledgedBy)
		}
	}
	if acked != 2 {
		t.Fatalf("%d of the rogue's 2 calls acknowledged", acked)
	}
	if err, _ := readErr.Load().(error); !errors.Is(err, agentsdk.ErrCancelled) {
		t.Errorf("the tool's read of its body ended with %v, want ErrCancelled", err)
	}
	if n := ran.Load(); n != 0 {
		t.Fatalf("the tool ran %d side effects for calls its stop cancelled", n)
	}
}

// TestRogue40ACallerNotReadingItsAnswerDoesNotHoldItsAbort: a gated HTTP
// tool writes a long answer (a download, a log). A rogue agent reads none
// of it: once the connection's buffers and the flow-control window are
// full the handler's write waits, for ever, and no context reaches it.
// The abort's cancel order was not heard (the handler checks its context
// between writes), the abort waited out its acknowledgement window and
// recorded the honest tool server's cancel unacknowledged. The order now
// cuts the answer once the handler has begun it: its write fails, and the
// call, which answered, is recorded completed.
func TestRogue40ACallerNotReadingItsAnswerDoesNotHoldItsAbort(t *testing.T) {
	ctx := context.Background()
	w := startShellWorld(t)
	gate := agentsdk.NewToolGate(agentsdk.Dial(w.operator.BaseURL, w.gateToken, agentsdk.WithHTTPClient(w.operator.HTTP)), "shell-gate")
	t.Cleanup(gate.Close)
	<-gate.Ready()

	chunk := bytes.Repeat([]byte("x"), 64<<10)
	writing := make(chan struct{}, 2)
	tools := rogue40aTools(t, gate, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		// Its answer is its result: 256 MiB, written whole unless the
		// connection fails.
		for i := 0; i < 4096; i++ {
			if _, err := rw.Write(chunk); err != nil {
				return
			}
			if i == 0 {
				writing <- struct{}{}
			}
		}
	}))
	for _, tool := range tools {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, tool.URL, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(agentsdk.CapabilityHeader, w.rootToken)
		resp, err := tool.Client().Do(req) // the headers; the answer is never read
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		<-writing
	}

	rec := rogue40aAbort(t, w, func() string { return rogue40aOpenCalls(t, w) })
	completed := 0
	for _, c := range rec.ToolCalls {
		if c.Resolution == tetherv1.CallResolution_CALL_RESOLUTION_COMPLETED {
			completed++
		} else {
			t.Errorf("call %s is %s, want completed: its tool answered", c.CallId, c.Resolution)
		}
	}
	if completed != 2 {
		t.Fatalf("%d of the rogue's 2 calls completed", completed)
	}
}

// TestRogue40AChildWhoseSessionsItsParentHoldsHearsItsStop: a parent hands
// its child the credential Spawn gave it, and keeps a copy. A rogue parent
// opens, as its child, every session a node may hold open
// (tree.MaxOpenSessions) and reads none of them: the honest child's own
// session is refused resource_exhausted at each reconnection, and its Run,
// which heard signals over its session alone, never heard its stop — the
// operator's drain of the rogue's subtree went to the rogue's sessions,
// and the child worked on, its Context live, until its credential was
// refused at the record. Run now asks, as each refused session ends, the
// unary Heartbeat, whose answer carries the node's signal (and a fresh
// credential).
func TestRogue40AChildWhoseSessionsItsParentHoldsHearsItsStop(t *testing.T) {
	ctx := context.Background()
	srv, operator, parent := embeddedRoot(t, "rogue40a-parent")
	child := spawnChild(t, parent, "rogue40a-honest-child")
	asChild := agentsdk.Dial(srv.URL, child.Credential)
	for i := 0; i < tree.MaxOpenSessions; i++ {
		held := asChild.Agent.Session(ctx)
		t.Cleanup(func() { held.CloseRequest(); held.CloseResponse() })
		if err := held.Send(&tetherv1.SessionRequest{Kind: &tetherv1.SessionRequest_Hello{Hello: &tetherv1.SessionHello{NodeId: child.Node.NodeId}}}); err != nil {
			t.Fatal(err)
		}
		if msg, err := held.Receive(); err != nil || msg.GetOpened() == nil {
			t.Fatalf("the rogue's session %d as its child: %v %v", i, msg, err)
		}
	}

	honest, err := agentsdk.Join(ctx, srv.URL, child.Credential, nil)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- honest.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-ran })

	if _, err := operator.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: parent.NodeID(), Mode: tetherv1.TerminationMode_TERMINATION_MODE_DRAIN,
		DrainWindow: durationpb.New(time.Hour), ConfirmTimeout: durationpb.New(time.Hour),
	})); err != nil {
		t.Fatal(err)
	}
	select {
	case <-honest.Draining():
	case <-time.After(20 * time.Second): // a guard against the hang, not a timing
		t.Fatal("the honest child, its sessions held by its rogue parent, never heard the drain of its subtree")
	}
}
