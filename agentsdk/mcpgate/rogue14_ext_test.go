package mcpgate_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/internal/mcptest"
)

// The fourteenth rogue pass against the gateway: a rogue upstream (a tool
// server the gateway forwards to) and a rogue agent on its sessions.

// serveGateway serves gw over Streamable HTTP and returns its MCP URL.
func serveGateway(t *testing.T, gw *mcpgate.Gateway) string {
	t.Helper()
	gwHTTP := httptest.NewUnstartedServer(nil)
	gwHTTP.Config.Handler = gw.Handler(mcpgate.HTTPOptions{BaseURL: "http://" + gwHTTP.Listener.Addr().String()})
	gwHTTP.Start()
	t.Cleanup(gwHTTP.Close)
	return gwHTTP.URL + mcpgate.EndpointPath
}

// hugeAnswer is how much the rogue upstream answers one call with.
const hugeAnswer = 96 << 20

// A rogue upstream cannot make the gateway hold an answer of any size. A
// Streamable HTTP upstream may answer a call with a plain JSON body
// instead of an event stream; the SDK's client reads such a body whole
// into memory (its events are bounded, 16 MiB each, its JSON bodies are
// not), so an upstream answering with a body that never ends — here, a
// tool result of 96 MiB — grew the gateway's memory without bound, the
// gateway every agent's calls to every upstream go through, and passed the
// whole answer on. The gateway now reads an upstream's JSON answer up to
// the size of one event and drops the connection beyond it: the caller is
// told the upstream failed, the rogue's write is cut short, and another
// upstream's calls go on.
func TestARogueUpstreamCannotMakeTheGatewayHoldAnAnswerOfAnySize(t *testing.T) {
	w := newWorld(t, "mcp:*")
	sdk := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return mcptest.NewServer(nil) }, &mcp.StreamableHTTPOptions{JSONResponse: true})
	var written atomic.Int64
	cut := make(chan error, 1)
	rogue := httptest.NewServer(http.HandlerFunc(func(wr http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			b, _ := io.ReadAll(r.Body)
			var req struct {
				ID     json.RawMessage `json:"id"`
				Method string          `json:"method"`
			}
			if json.Unmarshal(b, &req) == nil && req.Method == "tools/call" {
				wr.Header().Set("Content-Type", "application/json")
				head := `{"jsonrpc":"2.0","id":` + string(req.ID) + `,"result":{"content":[{"type":"text","text":"`
				n, err := io.WriteString(wr, head)
				written.Add(int64(n))
				chunk := bytes.Repeat([]byte("A"), 64<<10)
				for err == nil && written.Load() < hugeAnswer {
					n, err = wr.Write(chunk)
					written.Add(int64(n))
				}
				if err == nil {
					_, err = io.WriteString(wr, `"}]}}`)
				}
				cut <- err
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(b))
		}
		sdk.ServeHTTP(wr, r)
	}))
	t.Cleanup(rogue.Close)
	gw := w.open(t, mcpgate.Upstream{Name: "test", URL: w.upstream}, mcpgate.Upstream{Name: "rogue", URL: rogue.URL})
	endpoint := serveGateway(t, gw)
	victim := connectAgent(t, endpoint, otherAgent(t, w, "victim", "mcp:*"), nil)
	agent := connectAgent(t, endpoint, w.grant.Token, nil)

	text, err := callText(t, agent, "rogue_echo", map[string]any{"text": "x"})
	if err == nil || rpcCode(err) != mcpgate.CodeUnavailable {
		t.Errorf("the call the rogue upstream answered with %d bytes: %d bytes of text, %v; want the gateway's refusal (upstream unavailable)", written.Load(), len(text), err)
	}
	if werr := <-cut; werr == nil {
		t.Errorf("the gateway read all %d bytes of the rogue upstream's answer", written.Load())
	}
	if got, err := callText(t, victim, "test_echo", map[string]any{"text": "still here"}); err != nil || got != "still here" {
		t.Errorf("another upstream's call after the rogue's answer: %q, %v", got, err)
	}
}
