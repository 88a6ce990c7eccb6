package mcpgate_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
)

// holdingUpstream is a rogue Streamable HTTP upstream: the Go SDK's MCP
// server behind a handler that holds each POST for which hold says true
// (given the message it carries) — it never answers it — until the client
// gives up on it or release is called. held is closed once the first is
// held. Call release in a cleanup registered after the gateway's (cleanups
// run last first): its Close, which a test that failed left waiting for a
// held POST, then returns.
func holdingUpstream(t *testing.T, srv *mcp.Server, hold func(jsonrpc.Message) bool) (url string, held <-chan struct{}, release func()) {
	t.Helper()
	sdk := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
	let := make(chan struct{})
	heldCh := make(chan struct{})
	var once, released sync.Once
	up := httptest.NewServer(http.HandlerFunc(func(wr http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			body, err := io.ReadAll(r.Body)
			if err != nil {
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			if msg, err := jsonrpc.DecodeMessage(body); err == nil && hold(msg) {
				once.Do(func() { close(heldCh) })
				select {
				case <-r.Context().Done(): // the gateway gave up on it
				case <-let:
				}
				return
			}
		}
		sdk.ServeHTTP(wr, r)
	}))
	release = func() { released.Do(func() { close(let) }) }
	t.Cleanup(up.Close)
	t.Cleanup(release) // before the server closes (it waits for them)
	return up.URL, heldCh, release
}

// closeReturns closes gw and fails the test, naming what, if Close does
// not return within guardWait (a guard against a hang, not a timing).
func closeReturns(t *testing.T, gw *mcpgate.Gateway, what string) {
	t.Helper()
	closed := make(chan struct{})
	go func() { gw.Close(); close(closed) }()
	recv(t, closed, what)
}

// A rogue upstream cannot hold the gateway's Close by not taking the
// gateway's answer to its own request. An upstream may ask its client
// things (ping; roots/list; sampling and elicitation, which the gateway
// refuses): the Go SDK's client answers each by writing to the upstream
// — over Streamable HTTP a POST — under a context that never ends, and
// closing the connection waits for every request being answered. An
// upstream that pinged the gateway from within a call, and never answered
// the POST that carried the gateway's answer, held the gateway's Close
// for ever: `tether mcp serve` never exited, the reports owed at its
// close were never sent, its gate and verifier never stopped. The
// gateway's answers to an upstream are now written under a context that
// ends as the gateway closes, ConnectTimeout at the latest. (Fails, before
// that, by Close not returning: the gateway's clock, which would end the
// answer's wait, never moves here.)
func TestRogue37EUpstreamHoldingTheGatewaysAnswerCannotHoldItsClose(t *testing.T) {
	w := newWorld(t, "mcp:*")
	srv := mcp.NewServer(&mcp.Implementation{Name: "rogue", Version: "1"}, nil)
	var held <-chan struct{}
	mcp.AddTool(srv, &mcp.Tool{Name: "ping_back"}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		// Pinged within the call (on its stream), its wait ended once
		// the gateway's answer is held.
		pctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() {
			select {
			case <-held:
			case <-ctx.Done():
			}
			cancel()
		}()
		_ = req.Session.Ping(pctx, nil)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "pinged"}}}, nil, nil
	})
	url, heldCh, release := holdingUpstream(t, srv, func(msg jsonrpc.Message) bool {
		_, answer := msg.(*jsonrpc.Response)
		return answer
	})
	held = heldCh
	gw := gatewayOnClockWith(t, w, clock.NewManual(w.clk.Now()), nil, func(c *mcpgate.Config) {
		c.Upstreams = []mcpgate.Upstream{{Name: "rogue", URL: url}}
	})
	t.Cleanup(release)
	cs := connectAgent(t, serveGateway(t, gw), w.grant.Token, nil)
	if got, err := callText(t, cs, "ping_back", map[string]any{}); err != nil || got != "pinged" {
		t.Fatalf("the call to the rogue upstream: %q %v", got, err)
	}
	recv(t, held, "the rogue upstream to hold the gateway's answer to its ping")
	closeReturns(t, gw, "the gateway's Close while its upstream held the gateway's answer to its ping")
}

// A rogue upstream cannot hold the gateway's Close by not answering the
// listing it asked for. An upstream that says its tools changed has the
// gateway list them again, and closing the connection waits for that
// listing's answer: one that never answered held Close for
// ConnectTimeout (30 s, each upstream in turn; for ever on a clock that
// does not move), the listing's only bound. The listing now ends as the
// gateway closes. (Fails, before that, by Close not returning: the
// gateway's clock, which would end the listing, is moved only past
// RelistInterval here.)
func TestRogue37EUpstreamNotAnsweringItsRelistingCannotHoldTheGatewaysClose(t *testing.T) {
	w := newWorld(t, "mcp:*")
	srv := mcp.NewServer(&mcp.Implementation{Name: "rogue", Version: "1"}, nil)
	mcp.AddTool(srv, &mcp.Tool{Name: "first"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{}, nil, nil
	})
	var mu sync.Mutex
	listings := 0
	url, held, release := holdingUpstream(t, srv, func(msg jsonrpc.Message) bool {
		req, ok := msg.(*jsonrpc.Request)
		if !ok || req.Method != "tools/list" {
			return false
		}
		mu.Lock()
		defer mu.Unlock()
		listings++
		return listings > 1 // the gateway's first listing is answered
	})
	clk := clock.NewManual(w.clk.Now())
	relist := clk.Now().Add(mcpgate.RelistInterval) // the clock is not moved until then
	gw := gatewayOnClockWith(t, w, clk, nil, func(c *mcpgate.Config) {
		c.Upstreams = []mcpgate.Upstream{{Name: "rogue", URL: url}}
	})
	t.Cleanup(release)
	// Its tools changed: the server tells its sessions (the gateway's).
	mcp.AddTool(srv, &mcp.Tool{Name: "second"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{}, nil, nil
	})
	testserver.WaitFor(t, guardWait, "the gateway to list the rogue's tools again, or to wait for its turn", func() bool {
		return closed(held) || clk.Armed(relist)
	})
	if !closed(held) {
		clk.Advance(mcpgate.RelistInterval)
	}
	recv(t, held, "the rogue upstream to hold the gateway's listing")
	closeReturns(t, gw, "the gateway's Close while its upstream held its listing")
}
