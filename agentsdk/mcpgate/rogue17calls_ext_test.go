package mcpgate_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/mcptest"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The seventeenth rogue pass against the record of a stopped agent's calls
// (what the gateway reports of how each one ended).

// payIn names one payment.
type payIn struct {
	ID string `json:"id"`
}

// A rogue being drained cannot turn its call in flight into a failed one
// in the record by cancelling it itself. Its payment reached the upstream,
// which made it at once and then waited on its bank's confirmation (MCP's
// cancellation is advisory: an upstream that has done its side effect may
// ignore it). The agent sent notifications/cancelled for its own call: the
// gateway abandoned the upstream call and reported it failed, "context
// canceled", in its own name — the record said the payment failed, on the
// word of the agent being stopped, though the upstream had made it, and
// the drain took the call for ended. A call the gateway has begun now ends
// on the upstream's answer or the control plane's cancel, never on the
// agent's: the record lists the payment completed, as the upstream
// answered.
func TestARogueCannotHaveItsCallInFlightRecordedFailedByCancellingIt(t *testing.T) {
	w := newWorld(t, "mcp:*")
	var paid atomic.Int32
	made, confirm := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() {
		select {
		case <-confirm:
		default:
			close(confirm)
		}
	})
	up := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server {
		s := mcptest.NewServer(nil)
		mcp.AddTool(s, &mcp.Tool{Name: "pay", Description: "pays, then waits for the bank's confirmation"}, func(_ context.Context, _ *mcp.CallToolRequest, in payIn) (*mcp.CallToolResult, any, error) {
			paid.Add(1)
			close(made)
			<-confirm // committed: a cancel no longer undoes it
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "paid " + in.ID}}}, nil, nil
		})
		return s
	}, nil))
	t.Cleanup(up.Close)
	endpoint := serveGateway(t, w.open(t, mcpgate.Upstream{Name: "bank", URL: up.URL}))
	rogue := openRaw(t, endpoint, w.grant.Token)

	// The call, on a request of its own (its answer is the rogue's to
	// drop).
	callCtx, dropCall := context.WithCancel(context.Background())
	t.Cleanup(dropCall)
	go func() {
		req, err := http.NewRequestWithContext(callCtx, http.MethodPost, endpoint, strings.NewReader(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"pay","arguments":{"id":"p-1"}}}`))
		if err != nil {
			return
		}
		req.Header.Set("Authorization", "Bearer "+w.grant.Token)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Session-Id", rogue.id)
		req.Header.Set("Mcp-Protocol-Version", rawVersion)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	recv(t, made, "made")
	term := terminate(t, w, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Hour, time.Minute)
	waitState(t, w, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)

	// The rogue cancels its own call; a call of its session after that is
	// read by the gateway after the cancel (one session's messages are
	// read in order, and a cancel is acted on as it is read).
	if resp, body := rogue.post(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7,"reason":"never mind"}}`); resp.StatusCode/100 != 2 {
		t.Fatalf("notifications/cancelled: %s: %.300s", resp.Status, body)
	}
	if resp, body := rogue.post(`{"jsonrpc":"2.0","id":8,"method":"tools/list","params":{}}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("tools/list after the cancel: %s: %.300s", resp.Status, body)
	}
	close(confirm) // the bank confirms: the upstream answers
	waitState(t, w, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	confirmExit(t, w)
	waitState(t, w, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)

	calls := callsByTool(t, recordOf(t, w, term.TerminationId))["bank/pay"]
	if len(calls) != 1 {
		t.Fatalf("record: %v; want the payment listed once", calls)
	}
	c := calls[0]
	if c.Resolution != tetherv1.CallResolution_CALL_RESOLUTION_COMPLETED || c.EndedBy != "tool:"+gateID || c.Error != "" {
		t.Errorf("the payment the upstream made, cancelled by the rogue being drained: %s ended by %q (%q); want completed, ended by the gateway, as the upstream answered",
			c.Resolution, c.EndedBy, c.Error)
	}
	if n := paid.Load(); n != 1 {
		t.Errorf("the upstream made %d payments, want 1", n)
	}
}

// A gateway that shuts down (`tether mcp wrap` stopped) with a call in
// flight still stops: the agent's leaving no longer ends the call, but the
// gateway's own shutdown does, and the record says so in the gateway's
// words — not "context canceled", and not that the call failed at the
// upstream, which was never heard from.
func TestAStdioGatewayShuttingDownRecordsItsCallInFlightInItsOwnWords(t *testing.T) {
	w := newWorld(t, "mcp:stdio/*")
	bin := filepath.Join(t.TempDir(), "mcpserver")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/tetherhq/tether/examples/mcpserver").CombinedOutput(); err != nil {
		t.Fatalf("build examples/mcpserver: %v\n%s", err, out)
	}
	events := t.TempDir()
	gw := w.open(t, mcpgate.Upstream{Name: "stdio", Command: []string{bin, "--events", events}})
	toGateway, agentOut := io.Pipe()
	agentIn, fromGateway := io.Pipe()
	ctx, shutDown := context.WithCancel(context.Background())
	t.Cleanup(shutDown)
	served := make(chan error, 1)
	go func() { served <- gw.ServeStdio(ctx, mcpgate.StaticToken(w.grant.Token), toGateway, fromGateway) }()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "stdio-agent"}, nil).Connect(context.Background(), &mcp.IOTransport{Reader: agentIn, Writer: agentOut}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	called := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "slow", Arguments: map[string]any{"id": "s"}})
		called <- err
	}()
	// The upstream is another process: its event is a file.
	testserver.WaitFor(t, guardWait, "the slow call to start upstream", func() bool {
		select {
		case err := <-called:
			t.Fatalf("the slow call ended before it started upstream: %v", err)
		default:
		}
		_, err := os.Stat(filepath.Join(events, "s.started"))
		return err == nil
	})
	term := terminate(t, w, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Hour, time.Minute)
	waitState(t, w, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)

	shutDown()
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("ServeStdio: %v", err)
		}
	case <-time.After(guardWait): // a guard: it returns at once or never
		t.Fatal("ServeStdio did not return after its context ended: it waits for the call in flight")
	}
	waitState(t, w, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	confirmExit(t, w)
	waitState(t, w, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	calls := callsByTool(t, recordOf(t, w, term.TerminationId))["stdio/slow"]
	if len(calls) != 1 {
		t.Fatalf("record: %v; want the slow call listed once", calls)
	}
	if c := calls[0]; c.Resolution != tetherv1.CallResolution_CALL_RESOLUTION_FAILED || c.EndedBy != "tool:"+gateID || !strings.Contains(c.Error, "gateway shut down") {
		t.Errorf("the call in flight when the gateway shut down: %s ended by %q (%q); want failed by the gateway, saying it shut down", c.Resolution, c.EndedBy, c.Error)
	}
}
