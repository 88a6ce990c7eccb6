package mcpgate_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/mcptest"
)

// The thirty-eighth rogue pass against the MCP gateway (helper E).

// askingUpstream is a rogue Streamable HTTP upstream: the Go SDK's MCP
// server (mcptest's tools), except that it answers a tools/call with an
// event stream of asks pings of the gateway, then the call's result, and
// holds every POST carrying the gateway's answer to its own request
// until the gateway gives up on it or the test ends. held counts the
// answers held at once.
func askingUpstream(t *testing.T, asks int) (url string, held func() int) {
	t.Helper()
	sdk := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return mcptest.NewServer(nil) }, nil)
	end := make(chan struct{})
	var mu sync.Mutex
	n := 0
	up := httptest.NewServer(http.HandlerFunc(func(wr http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			body, err := io.ReadAll(r.Body)
			if err != nil {
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			msg, err := jsonrpc.DecodeMessage(body)
			if _, answer := msg.(*jsonrpc.Response); err == nil && answer {
				mu.Lock()
				n++
				mu.Unlock()
				defer func() { mu.Lock(); n--; mu.Unlock() }()
				select {
				case <-r.Context().Done(): // the gateway gave up on it
				case <-end:
				}
				return
			}
			if req, ok := msg.(*jsonrpc.Request); err == nil && ok && req.Method == "tools/call" {
				id, _ := json.Marshal(req.ID.Raw())
				wr.Header().Set("Content-Type", "text/event-stream")
				wr.WriteHeader(http.StatusOK)
				for i := range asks {
					fmt.Fprintf(wr, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":\"ask-%d\",\"method\":\"ping\"}\n\n", i)
				}
				fmt.Fprintf(wr, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"asked\"}]}}\n\n", id)
				return
			}
		}
		sdk.ServeHTTP(wr, r)
	}))
	t.Cleanup(up.Close)
	t.Cleanup(func() { close(end) }) // before the server closes (it waits for them)
	return up.URL + "/", func() int { mu.Lock(); defer mu.Unlock(); return n }
}

// A rogue upstream cannot have the gateway hold any number of answers to
// its own requests. An upstream may ask its client things (ping,
// roots/list; sampling and elicitation, refused), and the Go SDK's client
// answers each in a goroutine of its own, over Streamable HTTP by a POST
// of its own; each waits for the upstream to take it, ConnectTimeout
// (30 s) at the most. An upstream that asked thousands of times at once
// and took none of the answers had the gateway hold a goroutine, a
// request and a connection to it for each, every 30 s anew: the
// gateway's file descriptors, which every agent's connection needs, were
// the rogue's to spend. The gateway now holds at most
// MaxAnswersInFlight of its answers to an upstream's connection at once;
// the upstream's requests past them are left unanswered (logged, once
// per connection). (Fails, before that, by the rogue holding more than
// MaxAnswersInFlight of the gateway's answers.)
func TestRogue38EUpstreamCannotHaveTheGatewayHoldAnyNumberOfAnswers(t *testing.T) {
	w := newWorld(t, "mcp:*")
	const asks = 4 * mcpgate.MaxAnswersInFlight
	url, held := askingUpstream(t, asks)
	logs := &logBuffer{}
	gw := gatewayOnClockWith(t, w, clock.NewManual(w.clk.Now()), nil, func(c *mcpgate.Config) {
		c.Upstreams = []mcpgate.Upstream{{Name: "asks", URL: url}}
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	cs := connectAgent(t, serveGateway(t, gw), w.grant.Token, nil)
	if got, err := callText(t, cs, "echo", map[string]any{"text": "x"}); err != nil || got != "asked" {
		t.Fatalf("the call to the asking upstream: %q %v", got, err)
	}
	// The gateway has read every ask (the call's result came after them).
	testserver.WaitFor(t, guardWait, "the gateway's answers to be held, or more of them than the most", func() bool {
		return held() > mcpgate.MaxAnswersInFlight ||
			(held() == mcpgate.MaxAnswersInFlight && strings.Contains(logs.String(), "left unanswered"))
	})
	if got := held(); got > mcpgate.MaxAnswersInFlight {
		t.Fatalf("the rogue upstream holds %d of the gateway's answers to its %d requests; want %d at the most", got, asks, mcpgate.MaxAnswersInFlight)
	}
	// The upstream's calls go on.
	if got, err := callText(t, cs, "echo", map[string]any{"text": "x"}); err != nil || got != "asked" {
		t.Fatalf("a second call to the asking upstream: %q %v", got, err)
	}
}
