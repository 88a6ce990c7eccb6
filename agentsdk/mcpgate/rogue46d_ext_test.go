package mcpgate_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The forty-sixth rogue pass against the MCP gateway (helper D): a rogue
// Streamable HTTP upstream and the control plane's cancel.

// httpRunsOn is a rogue Streamable HTTP upstream (the Go SDK's server)
// with one tool, put, that ignores its cancel: it says it started, says
// it heard the gateway's notifications/cancelled (its context ended), and
// answers with a result once release is closed, whatever its context says.
type httpRunsOn struct {
	started, cancelled, release, stop chan struct{}
	posts                             chan struct{} // a call's POST ended, at the upstream
}

// answerMode is how the rogue upstream answers the call's POST.
type answerMode int

const (
	answerLate answerMode = iota // an event stream, its headers sent with the answer
	answerOpen                   // an event stream opened before the cancel (a progress event)
	answerJSON                   // one JSON body
)

var answerModes = map[string]answerMode{"event stream": answerLate, "event stream open before the cancel": answerOpen, "JSON body": answerJSON}

// httpRunsOnWorld is a world whose gateway, on the manual clock clk,
// fronts the rogue upstream (upstream "runs", answering as mode says),
// with an agent's MCP session on it over Streamable HTTP and its call to
// runs/put under way at the upstream.
func httpRunsOnWorld(t *testing.T, mode answerMode) (w *world, clk *clock.Manual, up *httpRunsOn, called <-chan error) {
	t.Helper()
	w = newWorld(t, "mcp:runs/*")
	up = &httpRunsOn{started: make(chan struct{}, 1), cancelled: make(chan struct{}, 1), release: make(chan struct{}), stop: make(chan struct{}), posts: make(chan struct{}, 8)}
	server := mcp.NewServer(&mcp.Implementation{Name: "runs-on", Version: "1"}, nil)
	mcp.AddTool(server, &mcp.Tool{Name: "put"}, func(ctx context.Context, req *mcp.CallToolRequest, _ map[string]any) (*mcp.CallToolResult, any, error) {
		if mode == answerOpen {
			// The POST's event stream opens with it.
			if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: req.Params.GetProgressToken(), Progress: 1}); err != nil {
				return nil, nil, err
			}
		}
		up.started <- struct{}{}
		select {
		case <-ctx.Done():
			up.cancelled <- struct{}{}
		case <-up.stop:
			return nil, nil, context.Canceled
		}
		select {
		case <-up.release:
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done all the same"}}}, nil, nil
		case <-up.stop:
			return nil, nil, context.Canceled
		}
	})
	sdk := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, &mcp.StreamableHTTPOptions{JSONResponse: mode == answerJSON})
	clk, called = httpCallThrough(t, w, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		sdk.ServeHTTP(rw, r)
		if r.Method == http.MethodPost && bytes.Contains(body, []byte(`"tools/call"`)) {
			up.posts <- struct{}{}
		}
	}), up.stop, up.started, mode == answerOpen)
	return w, clk, up, called
}

// httpCallThrough opens a gateway, on a new manual clock, fronting the
// Streamable HTTP upstream h (upstream "runs"; stop is closed before h is
// let go), has the world's agent call runs/put through it (with a
// progress token if progress), and waits for started: the upstream took
// the call. called is the agent's call's end. The forty-sixth and
// forty-seventh passes' rogue upstreams share it.
func httpCallThrough(t *testing.T, w *world, h http.Handler, stop chan struct{}, started <-chan struct{}, progress bool) (clk *clock.Manual, called <-chan error) {
	t.Helper()
	upHTTP := httptest.NewServer(h)
	t.Cleanup(upHTTP.Close)
	t.Cleanup(func() { close(stop) }) // (first: the handler lets go)
	clk = clock.NewManual(time.Now().UTC())
	gw, err := mcpgate.Open(context.Background(), mcpgate.OpenConfig{
		ControlPlane: w.srv.URL, Credential: w.srv.ToolServerToken(t, gateID), GateID: gateID, HTTP: w.srv.HTTP, Clock: clk,
		Upstreams: []mcpgate.Upstream{{Name: "runs", URL: upHTTP.URL}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Close)
	cs := connectAgent(t, serveGateway(t, gw), w.grant.Token, nil)
	done := make(chan error, 1)
	go func() {
		params := &mcp.CallToolParams{Name: "put", Arguments: map[string]any{}}
		if progress {
			params.SetProgressToken("p")
		}
		_, err := cs.CallTool(context.Background(), params)
		done <- err
	}()
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("the agent's call ended before the upstream took it: %v", err)
	case <-time.After(guardWait):
		t.Fatal("the upstream never took the call")
	}
	return clk, done
}

// passGrace waits for the gateway to wait, on clk, for a late answer and
// has mcpgate.CancelAnswerGrace of clk pass.
func passGrace(t *testing.T, clk *clock.Manual) {
	t.Helper()
	testserver.WaitFor(t, guardWait, "the gateway to wait for a late answer", func() bool {
		return clk.Armed(clk.Now().Add(mcpgate.CancelAnswerGrace))
	})
	clk.Advance(mcpgate.CancelAnswerGrace)
}

// wantAcked fails unless the record has call cancelled_acked and the
// agent's call ended with mcpgate.CodeCancelled.
func wantAcked(t *testing.T, call *tetherv1.RecordToolCall, called <-chan error) {
	t.Helper()
	if call.Resolution != tetherv1.CallResolution_CALL_RESOLUTION_CANCELLED_ACKED {
		t.Fatalf("record: runs/put %v (%q), want cancelled_acked", call.Resolution, call.Error)
	}
	if err := recv(t, called, "the agent's call"); rpcCode(err) != mcpgate.CodeCancelled {
		t.Fatalf("the agent's call ended with %v, want code %d", err, mcpgate.CodeCancelled)
	}
}

// httpAbortRecord aborts the world's agent, waits for the upstream to
// hear the call's cancel, runs then (the upstream has heard it, the
// gateway's clock stands still), and returns the record's one call of
// runs/put.
func httpAbortRecord(t *testing.T, w *world, up *httpRunsOn, then func()) *tetherv1.RecordToolCall {
	t.Helper()
	return abortRecordAfter(t, w, func() { recv(t, up.cancelled, "the upstream to hear the call cancelled") }, then)
}

// abortRecordAfter aborts the world's agent with no acknowledgement
// window and an hour to confirm, waits for heard (the upstream has heard
// the call cancelled), runs then, confirms the exit, and returns the
// record's one call of runs/put. The stdio (linux) and Streamable HTTP
// rogue upstreams share it.
func abortRecordAfter(t *testing.T, w *world, heard, then func()) *tetherv1.RecordToolCall {
	t.Helper()
	term := terminate(t, w, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Hour)
	heard()
	then()
	waitState(t, w, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	confirmExit(t, w)
	waitState(t, w, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	calls := callsByTool(t, recordOf(t, w, term.TerminationId))
	if len(calls["runs/put"]) != 1 {
		t.Fatalf("record: %v, want one call of runs/put", calls)
	}
	return calls["runs/put"][0]
}

// A rogue Streamable HTTP upstream that ignores notifications/cancelled
// and answers the call with a result after its cancel cannot have the
// record say the call stopped on its cancel. The forty-fourth pass had the
// gateway listen for a stdio upstream's late answer; over Streamable HTTP
// the SDK's client ended the call's POST, and with it the answer's stream
// or body, as it cancelled the call, so the gateway heard nothing and
// acknowledged the cancel at once: the record read cancelled_acked, the
// gateway's word that the call stopped, of a call the upstream ran to its
// end, and the agent was told its call was cancelled. The gateway now
// keeps the call's POST open for mcpgate.CancelAnswerGrace after the
// cancel and reads the upstream's answer on it, as over stdio. (Fails,
// before that, with the call cancelled_acked.)
func TestRogue46DHTTPUpstreamThatRunsOnPastItsCancelIsNotRecordedCancelled(t *testing.T) {
	for name, mode := range answerModes {
		t.Run(name, func(t *testing.T) {
			w, _, up, called := httpRunsOnWorld(t, mode)
			call := httpAbortRecord(t, w, up, func() { close(up.release) })
			if call.Resolution != tetherv1.CallResolution_CALL_RESOLUTION_COMPLETED {
				t.Fatalf("record: runs/put %v (%q), want completed: the upstream answered it with a result after its cancel", call.Resolution, call.Error)
			}
			if err := recv(t, called, "the agent's call"); rpcCode(err) == mcpgate.CodeCancelled {
				t.Fatalf("the agent was told its call was cancelled (%v): the upstream ran it", err)
			}
		})
	}
}

// An upstream over Streamable HTTP that says nothing more of a call once
// cancelled has the cancel acknowledged when the grace is over, as over
// stdio: the wait costs an abort mcpgate.CancelAnswerGrace of the
// gateway's clock at most, and the call's POST is let go then.
func TestRogue46DHTTPUpstreamSilentAfterItsCancelIsAcknowledgedAfterTheGrace(t *testing.T) {
	for name, mode := range answerModes {
		t.Run(name, func(t *testing.T) {
			w, clk, up, called := httpRunsOnWorld(t, mode)
			wantAcked(t, httpAbortRecord(t, w, up, func() { passGrace(t, clk) }), called)
			// The call's POST is not held past the grace: the upstream's
			// handler of it ends (the tool itself still waits).
			recv(t, up.posts, "the call's POST to end at the upstream")
		})
	}
}
