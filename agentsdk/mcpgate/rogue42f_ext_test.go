package mcpgate_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/mcptest"
)

// The forty-second rogue pass against the MCP gateway (helper F).

// paddedListingUpstream is a rogue Streamable HTTP upstream: the Go SDK's
// MCP server (mcptest's tools, the 2026-07-28 revision of MCP), except
// that it answers tools/list in pages pages, one tool on the first and
// none after, each page padded as pad says (its _meta, its cacheScope, its
// resultType, or the cursor of the page after it) with padBytes bytes. listed counts the
// pages it was asked for.
func paddedListingUpstream(t *testing.T, pages, padBytes int, pad string) (url string, listed func() int) {
	t.Helper()
	sdk := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return mcptest.NewServer(nil) }, &mcp.StreamableHTTPOptions{Stateless: true})
	padding := strings.Repeat("x", padBytes)
	var mu sync.Mutex
	n := 0
	up := frontedUpstream(t, sdk, func(wr http.ResponseWriter, _ *http.Request, body []byte) bool {
		msg, err := jsonrpc.DecodeMessage(body)
		if req, ok := msg.(*jsonrpc.Request); err == nil && ok && req.Method == "tools/list" {
			var params struct {
				Cursor string `json:"cursor"`
			}
			_ = json.Unmarshal(req.Params, &params)
			page := 1
			if params.Cursor != "" {
				_, _ = fmt.Sscanf(params.Cursor, "p%d", &page)
			}
			mu.Lock()
			n++
			mu.Unlock()
			res := map[string]any{"tools": []any{}, "ttlMs": 0}
			if page == 1 {
				res["tools"] = []any{map[string]any{"name": "echo", "inputSchema": map[string]any{"type": "object"}}}
			}
			if page < pages {
				res["nextCursor"] = fmt.Sprintf("p%d-", page+1)
			}
			switch pad {
			case "meta":
				res["_meta"] = map[string]any{"pad": padding}
			case "cacheScope":
				res["cacheScope"] = padding
			case "resultType":
				res["resultType"] = padding
			case "cursor":
				if page < pages {
					res["nextCursor"] = fmt.Sprintf("p%d-%s", page+1, padding)
				}
			}
			answer, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": req.ID.Raw(), "result": res})
			wr.Header().Set("Content-Type", "application/json")
			_, _ = wr.Write(answer)
			return true
		}
		return false
	})
	return up.URL + "/", func() int { mu.Lock(); defer mu.Unlock(); return n }
}

// heapInUse is the bytes of the test process's live heap, after a
// collection.
func heapInUse() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// A rogue upstream cannot have the gateway keep what it pads its tool list
// with for as long as the connection lasts. Since the 2026-07-28 revision
// of MCP (SEP-2549) the Go SDK's client keeps every page of a listing
// (the whole result, under the cursor that asked for it) until the
// upstream says its tools changed, or the connection ends: the gateway's
// bounds on a listing (MaxToolListBytes, MaxToolPages) counted the tools
// only, so an upstream whose pages carried up to 16 MiB of _meta,
// cacheScope, resultType or cursor each had the gateway keep 256 of them, 4 GiB, which
// every agent's calls share. The gateway now keeps only the tools of each
// page (the SDK finds a tool's x-mcp-header parameters there), and counts
// the cursors, which the SDK keeps as its keys, with the tools against
// MaxToolListBytes. (Fails, before that, by the gateway keeping 64 MiB
// after a listing of 64 pages of 1 MiB padding each, whatever it pads.)
func TestRogue42FUpstreamCannotHaveTheGatewayKeepItsListingsPadding(t *testing.T) {
	const pages, padBytes = 64, 1 << 20
	for _, pad := range []string{"meta", "cacheScope", "resultType", "cursor"} {
		t.Run(pad, func(t *testing.T) {
			w := newWorld(t, "mcp:*")
			url, listed := paddedListingUpstream(t, pages, padBytes, pad)
			before := heapInUse()
			gw, err := mcpgate.Open(context.Background(), mcpgate.OpenConfig{
				ControlPlane: w.srv.URL, Credential: w.srv.ToolServerToken(t, gateID), GateID: gateID, HTTP: w.srv.HTTP,
				Upstreams: []mcpgate.Upstream{{Name: "padded", URL: url}},
				// The connect timeout on a clock of the test's, never advanced:
				// however slow the host, the listing is the upstream's to end.
				Clock: clock.NewManual(w.clk.Now()),
			})
			if err == nil {
				defer gw.Close()
			}
			kept := heapInUse() - before
			t.Logf("%s: %d pages listed, the gateway keeps %d KiB after its listing (err %v)", pad, listed(), kept>>10, err)
			if kept > pages*padBytes/4 {
				t.Fatalf("after listing an upstream's %d pages of %d KiB of %s padding each, the gateway keeps %d KiB more; want at most %d KiB (the padding is not the gateway's to keep)",
					listed(), padBytes>>10, pad, kept>>10, pages*padBytes/4>>10)
			}
			switch {
			case pad == "cursor":
				// The cursors are kept by the SDK as long as the connection
				// lasts: 64 MiB of them is more than a listing may be.
				if err == nil || !strings.Contains(err.Error(), "cursors") {
					t.Fatalf("an upstream paging with 1 MiB cursors: the gateway opened (%v); want it refused, naming the cursors", err)
				}
			case err != nil:
				t.Fatalf("an upstream whose listing is padded with %s: the gateway did not open: %v", pad, err)
			default:
				cs := connectAgent(t, serveGateway(t, gw), w.grant.Token, nil)
				if got, err := callText(t, cs, "echo", map[string]any{"text": "hi"}); err != nil || !strings.Contains(got, "hi") {
					t.Fatalf("the agent's call to the padded upstream's tool: %q, %v", got, err)
				}
			}
		})
	}
}
