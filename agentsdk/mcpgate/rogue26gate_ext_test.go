package mcpgate_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
)

// The twenty-sixth rogue pass against the MCP gateway: the agent being
// stopped, and the tool server behind the gateway.

// A rogue tool server cannot have the gateway hold its tool list at any
// size. A listing was bounded in tools (MaxToolsPerUpstream) and pages
// (MaxToolPages), not in bytes: each page may be a whole answer
// (MaxUpstreamAnswerBytes, 16 MiB), so an upstream listing its tools with
// descriptions (or schemas) of a few hundred KiB had the gateway keep up to
// 4 GiB of them — and encode all of it again into every agent's tools/list,
// once a second relisted on the upstream's word. A listing whose tools come
// to more than MaxToolListBytes fails as one past the other bounds: at
// Start the gateway does not open, naming the upstream and the bound.
func TestRogue26AHostileUpstreamCannotListToolsOfAnySize(t *testing.T) {
	w := newWorld(t, "mcp:*")
	const pages, perPage = 24, 4
	description := strings.Repeat("d", 256<<10) // 1 MiB a page: 24 MiB in all
	var listed atomic.Int32
	hostile := hostileLister(t, func(int) (string, string) {
		page := int(listed.Add(1))
		var tools []string
		for i := range perPage {
			tools = append(tools, fmt.Sprintf(`{"name":"t%d_%d","description":"%s","inputSchema":{"type":"object"}}`, page, i, description))
		}
		next := ""
		if page < pages {
			next = fmt.Sprintf("p%d", page+1)
		}
		return strings.Join(tools, ","), next
	})
	gw, err := mcpgate.Open(context.Background(), mcpgate.OpenConfig{
		ControlPlane: w.srv.URL, Credential: w.srv.ToolServerToken(t, gateID), GateID: gateID, HTTP: w.srv.HTTP,
		Upstreams: []mcpgate.Upstream{{Name: "hostile", URL: hostile.URL}},
	})
	if err == nil {
		gw.Close()
		t.Fatalf("the gateway opened on an upstream listing %d MiB of tools (%d tools in %d pages); want it refused past %d bytes", pages*perPage/4, pages*perPage, pages, mcpgate.MaxToolListBytes)
	}
	if !strings.Contains(err.Error(), "hostile") || !strings.Contains(err.Error(), fmt.Sprint(mcpgate.MaxToolListBytes)) {
		t.Errorf("Open: %v; want it to name the upstream and the bound", err)
	}
	if n := int(listed.Load()); n >= pages {
		t.Errorf("the gateway read %d pages of %d; want it to stop at the bound", n, pages)
	}
}

// hostileLister is a Streamable HTTP upstream written by hand (the SDK's
// server would refuse to list what a rogue lists): its nth tools/list
// (from 1) answers list(n) — the tools, as JSON objects joined by commas,
// and the next cursor — and each tools/call tells the gateway its tools
// changed before answering "told".
func hostileLister(t *testing.T, list func(n int) (tools, next string)) *httptest.Server {
	t.Helper()
	var listings atomic.Int32
	event := func(wr io.Writer, msg string) { _, _ = fmt.Fprintf(wr, "event: message\ndata: %s\n\n", msg) }
	hostile := httptest.NewServer(http.HandlerFunc(func(wr http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			wr.WriteHeader(http.StatusMethodNotAllowed)
			return
		}
		var req struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.ID == nil {
			wr.WriteHeader(http.StatusAccepted) // a notification
			return
		}
		answer := func(result string) string {
			return `{"jsonrpc":"2.0","id":` + string(req.ID) + `,"result":` + result + `}`
		}
		wr.Header().Set("Mcp-Session-Id", "hostile")
		wr.Header().Set("Content-Type", "text/event-stream")
		switch req.Method {
		case "initialize":
			event(wr, answer(`{"protocolVersion":"2025-06-18","capabilities":{"tools":{"listChanged":true}},"serverInfo":{"name":"hostile","version":"1"}}`))
		case "tools/list":
			tools, next := list(int(listings.Add(1)))
			if next != "" {
				next = `,"nextCursor":"` + next + `"`
			}
			event(wr, answer(`{"tools":[`+tools+`]`+next+`}`))
		case "tools/call":
			event(wr, `{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}`)
			event(wr, answer(`{"content":[{"type":"text","text":"told"}]}`))
		default:
			event(wr, `{"jsonrpc":"2.0","id":`+string(req.ID)+`,"error":{"code":-32601,"message":"no"}}`)
		}
	}))
	t.Cleanup(hostile.Close)
	return hostile
}
