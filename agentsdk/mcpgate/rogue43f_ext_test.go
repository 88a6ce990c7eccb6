package mcpgate_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
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

// The forty-third rogue pass against the MCP gateway (helper F).

// A rogue upstream cannot have the gateway keep a relisting it made fail.
// At the 2026-07-28 revision of MCP the Go SDK's client keeps every page
// of a listing until the upstream says its tools changed or the
// connection ends; a listing past the gateway's bounds fails, and the
// gateway keeps the tools it had, but what the SDK kept of the failed
// listing's pages (up to MaxToolListBytes of tools and cursors, and the
// page that went past it, up to MaxUpstreamAnswerBytes more) stayed for as
// long as the upstream liked: told nothing more, the gateway never listed
// again (design.md §11 kept it as a limit). The gateway now has the SDK
// forget a listing that failed. (Fails, before that, by the gateway
// keeping 16,401 KiB after the upstream's relisting of 1 MiB tools failed
// at its 16th page.)
func TestRogue43FUpstreamCannotHaveTheGatewayKeepAFailedRelisting(t *testing.T) {
	const padBytes = 1 << 20
	w := newWorld(t, "mcp:*")
	srv := mcptest.NewServer(nil)
	sdk := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{Stateless: true})
	padding := strings.Repeat("x", padBytes)
	var mu sync.Mutex
	listings, pages := 0, 0
	served := func() int { mu.Lock(); defer mu.Unlock(); return pages }
	up := frontedUpstream(t, sdk, func(wr http.ResponseWriter, r *http.Request, body []byte) bool {
		msg, err := jsonrpc.DecodeMessage(body)
		req, ok := msg.(*jsonrpc.Request)
		if err != nil || !ok || req.Method != "tools/list" {
			return false
		}
		var params struct {
			Cursor string `json:"cursor"`
		}
		_ = json.Unmarshal(req.Params, &params)
		mu.Lock()
		if params.Cursor == "" {
			listings++
		}
		first := listings == 1
		if !first {
			pages++
		}
		page := pages
		mu.Unlock()
		if first {
			return false // the gateway's first listing is the SDK server's
		}
		// A relisting without end: a tool of 1 MiB a page.
		res := map[string]any{
			"tools":      []any{map[string]any{"name": fmt.Sprintf("t%d", page), "description": padding, "inputSchema": map[string]any{"type": "object"}}},
			"nextCursor": fmt.Sprintf("p%d", page+1),
			"ttlMs":      0,
		}
		answer, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": req.ID.Raw(), "result": res})
		if id := r.Header.Get("Mcp-Session-Id"); id != "" {
			wr.Header().Set("Mcp-Session-Id", id)
		}
		wr.Header().Set("Content-Type", "application/json")
		_, _ = wr.Write(answer)
		return true
	})
	logs := &logBuffer{}
	clk := clock.NewManual(w.clk.Now())
	relist := clk.Now().Add(mcpgate.RelistInterval)
	gw := gatewayOnClockWith(t, w, clk, nil, func(c *mcpgate.Config) {
		c.Upstreams = []mcpgate.Upstream{{Name: "rogue", URL: up.URL + "/"}}
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	t.Cleanup(gw.Close)
	cs := connectAgent(t, serveGateway(t, gw), w.grant.Token, nil)
	before := heapInUse()
	// Its tools changed: the server tells its sessions (the gateway's).
	mcp.AddTool(srv, &mcp.Tool{Name: "second"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{}, nil, nil
	})
	testserver.WaitFor(t, guardWait, "the gateway to wait for its relisting", func() bool { return clk.Armed(relist) || served() > 0 })
	clk.Advance(mcpgate.RelistInterval)
	testserver.WaitFor(t, guardWait, "the gateway's relisting to fail", func() bool {
		return strings.Contains(logs.String(), "relisting an upstream's tools failed")
	})
	kept := heapInUse() - before
	t.Logf("the relisting failed at its page %d; the gateway keeps %d KiB more than before it", served(), kept>>10)
	if n := served(); n < 16 {
		t.Fatalf("the relisting failed at its page %d; want it to fail past MaxToolListBytes, at its 16th: %s", n, logs.String())
	}
	if kept > 4<<20 {
		t.Fatalf("after the upstream's relisting of %d pages of %d KiB failed, the gateway keeps %d KiB more than before it; want at most %d KiB (a listing the gateway refused is not its to keep)",
			served(), padBytes>>10, kept>>10, 4<<10)
	}
	// The tools it had are kept, and served.
	if got, err := callText(t, cs, "echo", map[string]any{"text": "hi"}); err != nil || got != "hi" {
		t.Fatalf("the agent's call after the failed relisting: %q, %v", got, err)
	}
}
