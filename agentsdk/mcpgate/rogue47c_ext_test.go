package mcpgate_test

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
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
	clk, called = httpCallThrough(t, w, sdk, up.stop, up.started, true)
	return w, clk, up, called
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
	call := abortRecordAfter(t, w, func() { recv(t, up.cancelled, "the upstream to hear the call cancelled and end its stream") }, func() { passGrace(t, clk) })
	wantAcked(t, call, called)
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
	_, called := httpCallThrough(t, w, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.Header.Get("Last-Event-ID") != "" {
			n := resumptions.Add(1)
			rw.Header().Set("Content-Type", "text/event-stream")
			rw.WriteHeader(http.StatusOK)
			fmt.Fprintf(rw, "id: loop-%d\ndata: \n\n", n)
			return
		}
		sdk.ServeHTTP(rw, r)
	}), stop, started, true)
	call := abortRecordAfter(t, w, func() { recv(t, cancelled, "the upstream to hear the call cancelled and end its stream") }, func() {})
	wantAcked(t, call, called)
	if n := resumptions.Load(); n != mcpgate.MaxStreamResumptions {
		t.Fatalf("the upstream saw %d resumptions of the call's stream, want %d", n, mcpgate.MaxStreamResumptions)
	}
}
