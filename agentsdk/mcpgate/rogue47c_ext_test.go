package mcpgate_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The forty-seventh rogue pass against the MCP gateway (helper C): a
// Streamable HTTP upstream that breaks a call's event stream after its
// cancel and answers on the resumed stream (MCP's SEP-1699: a server may
// close a long call's stream, the client resumes it with Last-Event-ID).

// httpResumedWorld is a world whose gateway, on a manual clock, fronts
// the Go SDK's server (upstream "runs", with an event store) whose tool
// put opens its event stream (a progress event), says it started, and on
// hearing the gateway's notifications/cancelled closes the call's stream
// (retry in 1 ms; with breakFirst, also before it says it started) and answers with a result once release is closed, on
// the stream the client resumes.
func httpResumedWorld(t *testing.T, breakFirst bool) (w *world, clk *clock.Manual, up *httpRunsOn, called <-chan error) {
	t.Helper()
	w = newWorld(t, "mcp:runs/*")
	up = &httpRunsOn{started: make(chan struct{}, 1), cancelled: make(chan struct{}, 1), release: make(chan struct{}), stop: make(chan struct{}), posts: make(chan struct{}, 8)}
	server := mcp.NewServer(&mcp.Implementation{Name: "runs-on", Version: "1"}, nil)
	mcp.AddTool(server, &mcp.Tool{Name: "put"}, func(ctx context.Context, req *mcp.CallToolRequest, _ map[string]any) (*mcp.CallToolResult, any, error) {
		if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: req.Params.GetProgressToken(), Progress: 1}); err != nil {
			return nil, nil, err
		}
		if breakFirst {
			// Ended before the cancel: the SDK's client resumes it.
			req.Extra.CloseSSEStream(mcp.CloseSSEStreamArgs{RetryAfter: time.Millisecond})
		}
		up.started <- struct{}{}
		select {
		case <-ctx.Done():
		case <-up.stop:
			return nil, nil, context.Canceled
		}
		// The stream ends; the answer waits in the event store for the
		// client's resumption.
		req.Extra.CloseSSEStream(mcp.CloseSSEStreamArgs{RetryAfter: time.Millisecond})
		up.cancelled <- struct{}{}
		select {
		case <-up.release:
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done all the same"}}}, nil, nil
		case <-up.stop:
			return nil, nil, context.Canceled
		}
	})
	sdk := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, &mcp.StreamableHTTPOptions{EventStore: mcp.NewMemoryEventStore(nil)})
	upHTTP := httptest.NewServer(sdk)
	t.Cleanup(upHTTP.Close)
	t.Cleanup(func() { close(up.stop) }) // (first: the handler lets go)
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
		params.SetProgressToken("p")
		_, err := cs.CallTool(context.Background(), params)
		done <- err
	}()
	select {
	case <-up.started:
	case err := <-done:
		t.Fatalf("the agent's call ended before the upstream took it: %v", err)
	case <-time.After(guardWait):
		t.Fatal("the upstream never took the call")
	}
	return w, clk, up, done
}

// An upstream whose call's event stream breaks after the cancel, and that
// answers the call with a result on the stream resumed (Last-Event-ID),
// ran the call: the record cannot say it stopped on its cancel. Until the
// forty-seventh pass the SDK's client resumed a call's stream only under
// the call's context, which the cancel had ended, so nobody resumed it:
// the stream's end was taken as the connection's, the cancel acknowledged
// at once, and the record read cancelled_acked (docs/design.md §11). The
// gateway now resumes a call's stream itself after the cancel, within
// mcpgate.CancelAnswerGrace, and hears the answer there. (The gateway's
// clock stands still: the grace never runs out in this test.)
func TestRogue47CHTTPUpstreamAnsweringOnAResumedStreamIsNotRecordedCancelled(t *testing.T) {
	for name, breakFirst := range map[string]bool{"broken after the cancel": false, "broken before and after the cancel": true} {
		t.Run(name, func(t *testing.T) {
			w, _, up, called := httpResumedWorld(t, breakFirst)
			call := abortRecordAfter(t, w, func() { recv(t, up.cancelled, "the upstream to hear the call cancelled and end its stream") }, func() { close(up.release) })
			if call.Resolution != tetherv1.CallResolution_CALL_RESOLUTION_COMPLETED {
				t.Fatalf("record: runs/put %v (%q), want completed: the upstream answered it with a result after its cancel, on the resumed stream", call.Resolution, call.Error)
			}
			if err := recv(t, called, "the agent's call"); rpcCode(err) == mcpgate.CodeCancelled {
				t.Fatalf("the agent was told its call was cancelled (%v): the upstream ran it", err)
			}
		})
	}
}

// An upstream that ends the call's stream after its cancel and says
// nothing on the stream resumed has the cancel acknowledged when the grace
// is over, as before: the resumption costs an abort no more than
// mcpgate.CancelAnswerGrace of the gateway's clock.
func TestRogue47CHTTPUpstreamSilentOnAResumedStreamIsAcknowledgedAfterTheGrace(t *testing.T) {
	w, clk, up, called := httpResumedWorld(t, false)
	call := abortRecordAfter(t, w, func() { recv(t, up.cancelled, "the upstream to hear the call cancelled and end its stream") }, func() {
		testserver.WaitFor(t, guardWait, "the gateway to wait for a late answer", func() bool {
			return clk.Armed(clk.Now().Add(mcpgate.CancelAnswerGrace))
		})
		clk.Advance(mcpgate.CancelAnswerGrace)
	})
	if call.Resolution != tetherv1.CallResolution_CALL_RESOLUTION_CANCELLED_ACKED {
		t.Fatalf("record: runs/put %v (%q), want cancelled_acked", call.Resolution, call.Error)
	}
	if err := recv(t, called, "the agent's call"); rpcCode(err) != mcpgate.CodeCancelled {
		t.Fatalf("the agent's call ended with %v, want code %d", err, mcpgate.CodeCancelled)
	}
}

// A rogue upstream that ends each resumed stream at once, with a new event
// id and no answer, has the gateway resume the call's stream
// mcpgate.MaxStreamResumptions times, not for as long as the grace lasts:
// then the cancel is acknowledged (the gateway's clock standing still).
func TestRogue47CHTTPUpstreamEndingEveryResumptionIsResumedABoundedNumberOfTimes(t *testing.T) {
	w := newWorld(t, "mcp:runs/*")
	started, cancelled, stop := make(chan struct{}, 1), make(chan struct{}, 1), make(chan struct{})
	server := mcp.NewServer(&mcp.Implementation{Name: "resume-loop", Version: "1"}, nil)
	mcp.AddTool(server, &mcp.Tool{Name: "put"}, func(ctx context.Context, req *mcp.CallToolRequest, _ map[string]any) (*mcp.CallToolResult, any, error) {
		if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: req.Params.GetProgressToken(), Progress: 1}); err != nil {
			return nil, nil, err
		}
		started <- struct{}{}
		select {
		case <-ctx.Done():
		case <-stop:
			return nil, nil, context.Canceled
		}
		req.Extra.CloseSSEStream(mcp.CloseSSEStreamArgs{RetryAfter: time.Millisecond})
		cancelled <- struct{}{}
		<-stop
		return nil, nil, context.Canceled
	})
	sdk := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, &mcp.StreamableHTTPOptions{EventStore: mcp.NewMemoryEventStore(nil)})
	var resumptions atomic.Int64
	upHTTP := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.Header.Get("Last-Event-ID") != "" {
			n := resumptions.Add(1)
			rw.Header().Set("Content-Type", "text/event-stream")
			rw.WriteHeader(http.StatusOK)
			fmt.Fprintf(rw, "id: loop-%d\ndata: \n\n", n)
			return
		}
		sdk.ServeHTTP(rw, r)
	}))
	t.Cleanup(upHTTP.Close)
	t.Cleanup(func() { close(stop) })
	clk := clock.NewManual(time.Now().UTC())
	gw, err := mcpgate.Open(context.Background(), mcpgate.OpenConfig{
		ControlPlane: w.srv.URL, Credential: w.srv.ToolServerToken(t, gateID), GateID: gateID, HTTP: w.srv.HTTP, Clock: clk,
		Upstreams: []mcpgate.Upstream{{Name: "runs", URL: upHTTP.URL}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Close)
	cs := connectAgent(t, serveGateway(t, gw), w.grant.Token, nil)
	called := make(chan error, 1)
	go func() {
		params := &mcp.CallToolParams{Name: "put", Arguments: map[string]any{}}
		params.SetProgressToken("p")
		_, err := cs.CallTool(context.Background(), params)
		called <- err
	}()
	recv(t, started, "the upstream to take the call")
	call := abortRecordAfter(t, w, func() { recv(t, cancelled, "the upstream to hear the call cancelled and end its stream") }, func() {})
	if call.Resolution != tetherv1.CallResolution_CALL_RESOLUTION_CANCELLED_ACKED {
		t.Fatalf("record: runs/put %v (%q), want cancelled_acked", call.Resolution, call.Error)
	}
	if err := recv(t, called, "the agent's call"); rpcCode(err) != mcpgate.CodeCancelled {
		t.Fatalf("the agent's call ended with %v, want code %d", err, mcpgate.CodeCancelled)
	}
	if n := resumptions.Load(); n != mcpgate.MaxStreamResumptions {
		t.Fatalf("the upstream saw %d resumptions of the call's stream, want %d", n, mcpgate.MaxStreamResumptions)
	}
}
