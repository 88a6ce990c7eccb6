package mcpgate_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The forty-eighth rogue pass against the MCP gateway (helper F): a
// Streamable HTTP upstream, at a revision of MCP that has the standalone
// event stream (2025-06-18: the client's GET), that ignores a call's
// cancel and answers the call with a result on that stream instead of the
// call's own (which it keeps open, silent). The Go SDK's client reads the
// standalone stream for as long as the connection lasts, and had forgotten
// the call at its cancel: the answer was read and dropped, and the record
// read cancelled_acked, the gateway's word that the call stopped on its
// cancel, of a call its upstream said it ran (docs/design.md §11).

// standaloneAnswer is the rogue upstream's side of the test: the call's
// JSON-RPC id as the gateway sent it, and the answers to write on the
// standalone stream.
type standaloneAnswer struct {
	mu     sync.Mutex
	callID json.RawMessage
	push   chan []byte
	open   chan struct{} // the gateway opened the standalone stream (1)
}

func (s *standaloneAnswer) id() json.RawMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.callID
}

// standaloneAnsweringWorld is a world whose gateway, on a manual clock,
// fronts the Go SDK's server (upstream "runs", at MCP 2025-06-18, without
// an event store: its events carry no id) whose tool put opens its call's
// event stream (a progress event), says it started and, once it has heard
// the call cancelled, ends the stream if endStream (CloseSSEStream: no
// answer, no event id to resume it from), says so, and answers nothing on
// the call's stream; what the test pushes is written on the standalone
// stream the gateway's client opened, by the rogue in front of the server.
func standaloneAnsweringWorld(t *testing.T, endStream bool) (w *world, clk *clock.Manual, up *httpRunsOn, sa *standaloneAnswer, called <-chan error) {
	t.Helper()
	w = newWorld(t, "mcp:runs/*")
	up = &httpRunsOn{started: make(chan struct{}, 1), cancelled: make(chan struct{}, 1), release: make(chan struct{}), stop: make(chan struct{}), posts: make(chan struct{}, 8)}
	sa = &standaloneAnswer{push: make(chan []byte, 4), open: make(chan struct{}, 1)}
	server := mcp.NewServer(&mcp.Implementation{Name: "standalone-answers", Version: "1"}, &mcp.ServerOptions{SupportedProtocolVersions: []string{"2025-06-18"}})
	mcp.AddTool(server, &mcp.Tool{Name: "put"}, func(ctx context.Context, req *mcp.CallToolRequest, _ map[string]any) (*mcp.CallToolResult, any, error) {
		if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: req.Params.GetProgressToken(), Progress: 1}); err != nil {
			return nil, nil, err
		}
		up.started <- struct{}{}
		select {
		case <-ctx.Done():
		case <-up.stop:
			return nil, nil, context.Canceled
		}
		if endStream {
			req.Extra.CloseSSEStream(mcp.CloseSSEStreamArgs{})
		}
		up.cancelled <- struct{}{}
		<-up.stop // the call's own stream says nothing more
		return nil, nil, context.Canceled
	})
	sdk := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil)
	clk, called = httpCallThrough(t, w, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPost:
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			var m struct {
				ID     json.RawMessage `json:"id"`
				Method string          `json:"method"`
			}
			if json.Unmarshal(body, &m) == nil && m.Method == "tools/call" {
				sa.mu.Lock()
				sa.callID = m.ID
				sa.mu.Unlock()
			}
			sdk.ServeHTTP(rw, r)
		case r.Method == http.MethodGet && r.Header.Get("Last-Event-ID") == "":
			// The standalone stream: the rogue's.
			rw.Header().Set("Content-Type", "text/event-stream")
			rw.WriteHeader(http.StatusOK)
			rw.(http.Flusher).Flush()
			select {
			case sa.open <- struct{}{}:
			default:
			}
			for {
				select {
				case msg := <-sa.push:
					fmt.Fprintf(rw, "event: message\ndata: %s\n\n", msg)
					rw.(http.Flusher).Flush()
				case <-r.Context().Done():
					return
				case <-up.stop:
					return
				}
			}
		default:
			sdk.ServeHTTP(rw, r)
		}
	}), up.stop, up.started, true)
	return w, clk, up, sa, called
}

// A rogue Streamable HTTP upstream that ignores a call's cancel and
// answers it with a result on its standalone stream, keeping the call's
// own stream open and silent, ran the call: the record cannot say it
// stopped on its cancel. Before the forty-eighth pass the gateway heard a
// late answer only on the call's POST and its resumptions; the SDK's
// client read the one on the standalone stream and dropped it (it had
// forgotten the call), the gateway waited out the grace and acknowledged
// the cancel: cancelled_acked. (The gateway's clock stands still: the
// grace runs out only when the test, having waited guardWait for the
// gateway to stop waiting, has it pass.)
func TestRogue48FHTTPUpstreamAnsweringOnItsStandaloneStreamIsNotRecordedCancelled(t *testing.T) {
	w, clk, up, sa, called := standaloneAnsweringWorld(t, false)
	recv(t, sa.open, "the gateway's client to open the upstream's standalone stream")
	call := abortRecordAfter(t, w, func() { recv(t, up.cancelled, "the upstream to hear the call cancelled") }, func() {
		grace := func() bool { return clk.Armed(clk.Now().Add(mcpgate.CancelAnswerGrace)) }
		waitUntil(t, grace, "the gateway to wait for a late answer")
		answerOnStandalone(t, sa)
		if !eventually(func() bool { return !grace() }) {
			// Still waiting: it did not hear the answer. The grace passes,
			// and the record says what the gateway concluded.
			clk.Advance(mcpgate.CancelAnswerGrace)
		}
	})
	wantRanOn(t, call, called)
}

// The same upstream ending the call's stream after the cancel, without the
// answer and without an event id to resume it from, then answering on its
// standalone stream, ran the call too. Before the forty-eighth pass the
// stream's end ended the gateway's wait at once (nothing could come on
// it), and the record read cancelled_acked; the wait now goes on, to the
// grace, while the connection has a standalone stream open.
func TestRogue48FHTTPUpstreamEndingTheCallsStreamWithoutIDsAndAnsweringOnItsStandaloneStreamIsNotRecordedCancelled(t *testing.T) {
	w, clk, up, sa, called := standaloneAnsweringWorld(t, true)
	recv(t, sa.open, "the gateway's client to open the upstream's standalone stream")
	call := abortRecordAfter(t, w, func() { recv(t, up.cancelled, "the upstream to hear the call cancelled and end its stream") }, func() {
		answerOnStandalone(t, sa)
		if !eventually(func() bool { return !clk.Armed(clk.Now().Add(mcpgate.CancelAnswerGrace)) }) {
			clk.Advance(mcpgate.CancelAnswerGrace) // (not heard)
		}
	})
	wantRanOn(t, call, called)
}

// answerOnStandalone has the rogue answer the call with a result on the
// standalone stream.
func answerOnStandalone(t *testing.T, sa *standaloneAnswer) {
	t.Helper()
	id := sa.id()
	if id == nil {
		t.Fatal("the upstream never saw the call's id")
	}
	sa.push <- []byte(fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"done all the same"}]}}`, id))
}

// wantRanOn fails unless the record has the call completed and the agent
// was not told it was cancelled.
func wantRanOn(t *testing.T, call *tetherv1.RecordToolCall, called <-chan error) {
	t.Helper()
	if call.Resolution != tetherv1.CallResolution_CALL_RESOLUTION_COMPLETED {
		t.Fatalf("record: runs/put %v (%q), want completed: the upstream answered it with a result after its cancel, on its standalone stream", call.Resolution, call.Error)
	}
	if err := recv(t, called, "the agent's call"); rpcCode(err) == mcpgate.CodeCancelled {
		t.Fatalf("the agent was told its call was cancelled (%v): the upstream ran it", err)
	}
}

// An upstream that says nothing after the cancel, on either stream, has the
// cancel acknowledged when the grace is over, as before: hearing the
// standalone stream costs an abort nothing more.
func TestRogue48FHTTPUpstreamSilentOnItsStandaloneStreamIsAcknowledgedAfterTheGrace(t *testing.T) {
	for name, endStream := range map[string]bool{"the call's stream open": false, "the call's stream ended without ids": true} {
		t.Run(name, func(t *testing.T) {
			w, clk, up, sa, called := standaloneAnsweringWorld(t, endStream)
			recv(t, sa.open, "the gateway's client to open the upstream's standalone stream")
			call := abortRecordAfter(t, w, func() { recv(t, up.cancelled, "the upstream to hear the call cancelled") }, func() { passGrace(t, clk) })
			wantAcked(t, call, called)
		})
	}
}

// waitUntil waits for cond, or the test fails (what names it) when it has
// not held within guardWait: a guard against a hang, not a timing.
func waitUntil(t *testing.T, cond func() bool, what string) {
	t.Helper()
	if !eventually(cond) {
		t.Fatalf("waited %s for %s", guardWait, what)
	}
}

// eventually reports whether cond held within guardWait (polled).
func eventually(cond func() bool) bool {
	deadline := time.Now().Add(guardWait)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}
