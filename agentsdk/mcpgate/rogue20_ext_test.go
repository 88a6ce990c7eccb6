package mcpgate_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/controlplane/testserver"
)

// The twentieth rogue pass against the gateway: a rogue agent holding its
// own valid token, and a rogue upstream.

// firstMessage is the first JSON-RPC message of an answer (a JSON body, or
// the first event of an event stream), and whether the answer then ended.
// An answer that goes on after its first message is closed unread.
func firstMessage(t *testing.T, resp *http.Response) (msg map[string]any, ended bool) {
	t.Helper()
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	var data string
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		for {
			line, err := br.ReadString('\n')
			if d, ok := strings.CutPrefix(line, "data: "); ok {
				data = d
				break
			}
			if err != nil {
				t.Fatalf("the event stream ended before its first message: %v", err)
			}
		}
	} else {
		b, err := io.ReadAll(br)
		if err != nil {
			t.Fatal(err)
		}
		data = string(b)
	}
	if err := json.Unmarshal([]byte(data), &msg); err != nil {
		t.Fatalf("the answer's first message %q: %v", data, err)
	}
	if msg["id"] == nil {
		// A notification first (the listen's acknowledgement): the answer goes
		// on; the request is held open.
		return msg, false
	}
	rest, err := io.ReadAll(br) // an answer held open blocks here: the first message said it is done
	if err != nil {
		t.Fatal(err)
	}
	return msg, strings.TrimSpace(string(rest)) == ""
}

// A rogue agent cannot hold streams open on the gateway beyond its bounds
// with subscriptions/listen. The Go SDK's server answers that method (of
// the 2026-07-28 revision of MCP) in any session, whatever revision the
// session speaks: it acknowledges, then holds the request open until the
// agent leaves, a goroutine and a connection each. The gateway counts a
// node's tools/call and tools/list and bounds its sessions, but a listen
// was neither: one session held as many as the rogue opened, with no
// request idle, past every connection limit. The gateway now answers only
// the methods it passes (tools, and the session's own: initialize, ping,
// logging) and refuses the rest, by name, before the SDK runs them; its
// tools' list changes still reach every session on its stream.
func TestARogueCannotHoldStreamsOpenWithSubscriptionsListen(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	s := openRaw(t, w.endpoint, w.grant.Token)
	for i := range 2 * mcpgate.DefaultMaxSessionsPerNode {
		req, err := http.NewRequest(http.MethodPost, w.endpoint, strings.NewReader(fmt.Sprintf(
			`{"jsonrpc":"2.0","id":%d,"method":"subscriptions/listen","params":{"notifications":{"toolsListChanged":true}}}`, 100+i)))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+w.grant.Token)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Session-Id", s.id)
		req.Header.Set("Mcp-Protocol-Version", rawVersion)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		msg, ended := firstMessage(t, resp)
		e, _ := msg["error"].(map[string]any)
		if e == nil || e["code"] != float64(mcpgate.CodeNotGated) || !strings.Contains(fmt.Sprint(e["message"]), "subscriptions/listen") || !ended {
			t.Fatalf("listen #%d: the gateway answered %v (the answer ended: %v); want it refused (%d, naming the method) and the answer ended", i+1, msg, ended, mcpgate.CodeNotGated)
		}
	}
	// The session still calls its tools.
	resp, body := s.post(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"still here"}}}`)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "still here") {
		t.Fatalf("a call after the listens: %s %.300s", resp.Status, body)
	}
}

// A rogue agent cannot have its listings and calls go uncounted by
// naming their method twice. Over HTTP the gateway counts a node's
// tools/call and tools/list until their answers are written, reading each
// POST's id and method first, and it took the first "method" of the body;
// the SDK's server takes the last. A body naming "ping" and then
// "tools/list" was a listing to the SDK and a ping to the count: a rogue
// at its maximum of calls in flight still had listings answered (and a
// call's answer, once the call had ended, held unread uncounted), as many
// as it sent. The gateway now reads a POST's request as the SDK does.
func TestARogueCannotHideItsCallsFromTheCountByNamingTheMethodTwice(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	gw, err := mcpgate.Open(context.Background(), mcpgate.OpenConfig{
		ControlPlane: w.srv.URL, Credential: w.srv.ToolServerToken(t, gateID), GateID: gateID, HTTP: w.srv.HTTP,
		Upstreams: []mcpgate.Upstream{{Name: "test", URL: w.upstream}}, MaxCallsPerNode: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Close)
	endpoint := serveGateway(t, gw)
	t.Cleanup(func() { w.events.Release("held") }) // before the gateway closes
	// The rogue's one call in flight: the node is at its maximum.
	done := startSlow(t, connectAgent(t, endpoint, w.grant.Token, nil), w.events.Started("held"), "held")

	s := openRaw(t, endpoint, w.grant.Token)
	for _, body := range []string{
		`{"jsonrpc":"2.0","method":"ping","id":5,"method":"tools/list"}`,
		`{"jsonrpc":"2.0","method":"ping","id":6,"method":"tools/call","params":{"name":"echo","arguments":{"text":"uncounted"}}}`,
	} {
		resp, answer := s.post(body)
		if resp.StatusCode != http.StatusOK || !strings.Contains(answer, fmt.Sprint(mcpgate.CodeTooManyCalls)) {
			t.Errorf("%s, with the node at its maximum of calls in flight: %s %.300s; want it refused (%d)", body, resp.Status, answer, mcpgate.CodeTooManyCalls)
		}
	}
	w.events.Release("held")
	if err := recv(t, done, "done"); err != nil {
		t.Fatal(err)
	}
	// Not at its maximum, the node lists and calls. The call counts until
	// the gateway has written its answer, and the agent may read the answer
	// first: until the gateway lets go of it, a listing is refused as
	// above, and nothing else is answered.
	listed := 0
	testserver.WaitFor(t, guardWait, "a listing once the call ended", func() bool {
		listed++
		resp, answer := s.post(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/list"}`, 100+listed))
		if resp.StatusCode == http.StatusOK && strings.Contains(answer, `"echo"`) {
			return true
		}
		if resp.StatusCode != http.StatusOK || !strings.Contains(answer, fmt.Sprint(mcpgate.CodeTooManyCalls)) {
			t.Fatalf("a listing after the call ended: %s %.300s", resp.Status, answer)
		}
		return false
	})
}

// An agent cannot speak for the gateway to an upstream through its call's
// _meta. The keys MCP reserves there (io.modelcontextprotocol/…) carry, on
// each request of the 2026-07-28 revision, the calling client's protocol
// version, name and capabilities, and the Go SDK's server reads them there
// before the session's: the gateway forwarded the agent's _meta and its
// client kept the keys it found, so an agent had the upstream see another
// client than the gateway (here, one claiming sampling and elicitation,
// which the gateway refuses). The gateway forwards the agent's own keys
// and drops those MCP reserves, which are the gateway's to set on its hop.
func TestAnAgentCannotSpeakForTheGatewayToAnUpstreamThroughMeta(t *testing.T) {
	w := newWorld(t, "mcp:seen/*")
	type seen struct {
		Client   string         `json:"client"`
		Sampling bool           `json:"sampling"`
		Meta     map[string]any `json:"meta"`
	}
	server := mcp.NewServer(&mcp.Implementation{Name: "seen", Version: "1"}, nil)
	mcp.AddTool(server, &mcp.Tool{Name: "whoami"}, func(_ context.Context, req *mcp.CallToolRequest, _ map[string]any) (*mcp.CallToolResult, seen, error) {
		s := seen{Meta: req.Params.GetMeta()}
		if c := req.ClientInfo(); c != nil {
			s.Client = c.Name
		}
		if c := req.ClientCapabilities(); c != nil {
			s.Sampling = c.Sampling != nil
		}
		return nil, s, nil
	})
	up := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil))
	t.Cleanup(up.Close)
	gw := w.open(t, mcpgate.Upstream{Name: "seen", URL: up.URL})
	cs := connectAgent(t, serveGateway(t, gw), w.grant.Token, nil)
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "whoami", Meta: mcp.Meta{
		"io.modelcontextprotocol/clientInfo":         map[string]any{"name": "not-the-gateway", "version": "1"},
		"io.modelcontextprotocol/clientCapabilities": map[string]any{"sampling": map[string]any{}, "elicitation": map[string]any{}},
		"example.com/trace":                          "the agent's own",
	}})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(res.StructuredContent)
	var got seen
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got.Client != "tether-mcp-gateway" || got.Sampling {
		t.Errorf("the upstream saw the client %q (sampling %v, meta %v); want the gateway, without sampling", got.Client, got.Sampling, got.Meta)
	}
	if got.Meta["example.com/trace"] != "the agent's own" {
		t.Errorf("the agent's own _meta key did not reach the upstream: %v", got.Meta)
	}
}
