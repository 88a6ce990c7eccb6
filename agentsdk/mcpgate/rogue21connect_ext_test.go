package mcpgate_test

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/mcptest"
)

// An upstream that never answers its connection cannot hang the gateway.
// The gateway connected to an upstream (MCP's initialize, or the
// 2026-07-28 revision's server/discover) with no deadline: at Open, one
// upstream that never answered kept the gateway from ever serving (`tether
// mcp serve` listens first: every agent's connection waited); when
// reconnecting, the attempt waited for ever and was never made again, and
// each agent's call meanwhile was begun in the ledger and failed on the
// ended connection. Each attempt now has ConnectTimeout (on the gateway's
// clock): Open fails saying so, and a reconnection is tried again, backing
// off, while calls are refused before they are begun, saying the gateway
// is reconnecting; the gateway's Close does not wait for an attempt.
func TestAnUpstreamThatNeverAnswersItsConnectionCannotHangTheGateway(t *testing.T) {
	w := newWorld(t, "mcp:slow/*")
	events := &mcptest.Events{}
	sdk := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return mcptest.NewServer(events) }, nil)
	var hang atomic.Bool
	var connects, held atomic.Int64
	stop := make(chan struct{})
	up := frontedUpstream(t, sdk, func(wr http.ResponseWriter, r *http.Request, body []byte) bool {
		if strings.Contains(string(body), `"method":"initialize"`) || strings.Contains(string(body), `"method":"server/discover"`) {
			connects.Add(1)
			if hang.Load() {
				held.Add(1)
				defer held.Add(-1)
				select { // never answered
				case <-r.Context().Done():
				case <-stop:
				}
				return true
			}
		}
		if strings.Contains(string(body), "END THE CONNECTION") {
			http.Error(wr, "no such session", http.StatusNotFound) // the SDK's client ends the connection
			return true
		}
		return false
	})
	t.Cleanup(func() { close(stop) }) // before the upstream closes
	const timeout = time.Minute
	gclk := clock.NewManual(time.Now().UTC())
	open := func() (*mcpgate.Gateway, error) {
		return mcpgate.Open(context.Background(), mcpgate.OpenConfig{
			ControlPlane: w.srv.URL, Credential: w.srv.ToolServerToken(t, gateID), GateID: gateID, HTTP: w.srv.HTTP,
			Upstreams: []mcpgate.Upstream{{Name: "slow", URL: up.URL}}, ConnectTimeout: timeout, Clock: gclk,
		})
	}

	// At Open.
	hang.Store(true)
	opened := make(chan error, 1)
	go func() {
		gw, err := open()
		if gw != nil {
			gw.Close()
		}
		opened <- err
	}()
	testserver.WaitFor(t, guardWait, "the gateway to connect", func() bool { return connects.Load() == 1 })
	gclk.Advance(timeout)
	if err := within(t, opened, "Open to return"); err == nil || !strings.Contains(err.Error(), "slow") || !strings.Contains(err.Error(), "did not answer") {
		t.Fatalf("Open against an upstream that never answers: %v; want an error naming it and saying it did not answer", err)
	}

	// When reconnecting.
	hang.Store(false)
	gw, err := open()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Close)
	cs := connectAgent(t, serveGateway(t, gw), w.grant.Token, nil)
	endConnection := func() {
		t.Helper()
		before := connects.Load()
		if _, err := callText(t, cs, "echo", map[string]any{"text": "END THE CONNECTION"}); rpcCode(err) != mcpgate.CodeUnavailable {
			t.Fatalf("the call answered 404: %v; want unavailable", err)
		}
		testserver.WaitFor(t, guardWait, "the gateway to reconnect", func() bool {
			if connects.Load() > before {
				return true
			}
			gclk.Advance(mcpgate.MaxReconnectBackoff) // a connection that ended soon after it was made is made again after a backoff
			return false
		})
	}
	hang.Store(true)
	endConnection()
	_, err = callText(t, cs, "echo", map[string]any{"text": "while reconnecting"})
	if rpcCode(err) != mcpgate.CodeUnavailable || !strings.Contains(err.Error(), "reconnecting") {
		t.Errorf("a call while the gateway reconnects: %v; want it refused (%d), saying the gateway is reconnecting", err, mcpgate.CodeUnavailable)
	}
	if n := events.Calls("echo"); n != 0 {
		t.Errorf("the upstream ran %d calls", n)
	}
	tried := connects.Load()
	testserver.WaitFor(t, guardWait, "the gateway to try again once its attempt timed out", func() bool {
		gclk.Advance(timeout)
		return connects.Load() > tried
	})
	hang.Store(false)
	testserver.WaitFor(t, guardWait, "the agent's calls to go through again", func() bool {
		if held.Load() > 0 {
			gclk.Advance(timeout) // the attempt under way times out
		} else {
			gclk.Advance(time.Second) // the backoff passes (an attempt under way has its minute)
		}
		got, err := callText(t, cs, "echo", map[string]any{"text": "back"})
		return err == nil && got == "back"
	})

	// Closing, with an attempt under way.
	hang.Store(true)
	endConnection()
	closed := make(chan struct{})
	go func() { gw.Close(); close(closed) }()
	within(t, closed, "the gateway to close while it reconnects")
}
