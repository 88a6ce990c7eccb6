package mcpgate_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/mcptest"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// A rogue agent cannot spend the gateway's request budget on the control
// plane, which every agent's calls through the gateway draw on: each
// tools/call the gateway forwards is a BeginCall on the gateway's own
// credential, so an agent firing calls without waiting (many pending
// requests on its sessions, or one JSON-RPC batch of them) spent it all,
// and every other agent's call through the gateway was then refused. A
// node keeps at most MaxCallsPerNode calls in flight through the gateway;
// the next is refused at the gateway (CodeTooManyCalls, saying why),
// reaching neither the control plane nor the upstream, and another node's
// call still goes through. (The control plane's clock is manual: its
// budgets do not refill during the test.)
func TestARogueFiringCallsCannotSpendTheGatewaysBudget(t *testing.T) {
	const budget, maxCalls, fired = 48, 8, 60
	clk := clock.NewManual(time.Now().UTC())
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) {
		cfg.RateLimit, cfg.RateBurst = 0.001, budget
	})
	admin := srv.AdminClients()
	ctx := context.Background()
	grantFor := func(name string) string {
		node, err := admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: name}))
		if err != nil {
			t.Fatal(err)
		}
		grant, err := admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{
			HolderNodeId: node.Msg.Node.NodeId, Scopes: []string{"mcp:test/*"}, Ttl: durationpb.New(time.Hour),
		}))
		if err != nil {
			t.Fatal(err)
		}
		return grant.Msg.Token
	}
	rogueToken, honestToken := grantFor("rogue"), grantFor("honest")

	events := &mcptest.Events{}
	up := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return mcptest.NewServer(events) }, nil))
	t.Cleanup(up.Close)
	gw, err := mcpgate.Open(ctx, mcpgate.OpenConfig{
		ControlPlane: srv.URL, Credential: srv.ToolServerToken(t, gateID), GateID: gateID, HTTP: srv.HTTP,
		Upstreams: []mcpgate.Upstream{{Name: "test", URL: up.URL}}, MaxCallsPerNode: maxCalls,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Close)
	gwHTTP := httptest.NewUnstartedServer(nil)
	gwHTTP.Config.Handler = gw.Handler(mcpgate.HTTPOptions{BaseURL: "http://" + gwHTTP.Listener.Addr().String()})
	gwHTTP.Start()
	t.Cleanup(gwHTTP.Close)
	endpoint := gwHTTP.URL + mcpgate.EndpointPath

	// The rogue fires its calls on one session without waiting for any.
	rogue := connectAgent(t, endpoint, rogueToken, nil)
	var mu sync.Mutex
	codes := map[int64]int{}
	var results []string
	var wg sync.WaitGroup
	for i := range fired {
		id := fmt.Sprintf("rogue-%d", i)
		t.Cleanup(func() { events.Release(id) }) // before the gateway closes, should the test fail
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := rogue.CallTool(ctx, &mcp.CallToolParams{Name: "slow", Arguments: map[string]any{"id": id}})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				codes[rpcCode(err)]++
				if rpcCode(err) != mcpgate.CodeTooManyCalls {
					t.Logf("rogue call %s: %v", id, err)
				}
				return
			}
			results = append(results, res.Content[0].(*mcp.TextContent).Text)
		}()
	}
	testserver.WaitFor(t, guardWait, "every rogue call to start upstream or be refused", func() bool {
		mu.Lock()
		defer mu.Unlock()
		refused := 0
		for _, n := range codes {
			refused += n
		}
		return refused+events.Calls("slow") == fired
	})
	mu.Lock()
	if got := codes[mcpgate.CodeTooManyCalls]; got != fired-maxCalls || events.Calls("slow") != maxCalls {
		t.Errorf("the rogue's %d calls: %d started upstream and refusals by code %v; want %d started and %d refused with %d",
			fired, events.Calls("slow"), codes, maxCalls, fired-maxCalls, mcpgate.CodeTooManyCalls)
	}
	mu.Unlock()

	// Another node's call through the gateway is still made.
	honest := connectAgent(t, endpoint, honestToken, nil)
	if got, err := callText(t, honest, "echo", map[string]any{"text": "still here"}); err != nil || got != "still here" {
		t.Fatalf("another node's call while the rogue fires calls: %q, %v", got, err)
	}

	// The rogue's calls in flight end with their answers, and its next
	// call is made once they have.
	for i := range fired {
		events.Release(fmt.Sprintf("rogue-%d", i))
	}
	waitAll(t, &wg, "the rogue's calls to end once released")
	if len(results) != maxCalls {
		t.Errorf("%d of the rogue's calls answered, want %d", len(results), maxCalls)
	}
	if got, err := callText(t, rogue, "echo", map[string]any{"text": "after"}); err != nil || got != "after" {
		t.Fatalf("the rogue's call once its calls ended: %q, %v", got, err)
	}
}

// A rogue agent cannot send a JSON-RPC batch through the gateway. A batch
// is one POST of as many requests as fit in the body (4 MiB), each run at
// once, and all their answers held in the gateway's memory until the last
// is ready: a batch of tools/list multiplied the body by the size of the
// tool list, one of tools/call fired calls by the thousand. MCP since
// 2025-06-18 has no batches and no MCP SDK's client sends them, but the
// gateway still took them from a client that negotiated 2025-03-26. A
// batch is refused (400, a JSON-RPC error saying to send one request per
// POST) before any of it runs; the session goes on serving single
// requests.
func TestARogueCannotSendAJSONRPCBatchThroughTheGateway(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	const version = "2025-03-26"
	var session string
	post := func(body string) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, w.endpoint, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+w.grant.Token)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if session != "" {
			req.Header.Set("Mcp-Session-Id", session)
			req.Header.Set("Mcp-Protocol-Version", version)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp, string(b)
	}
	resp, body := post(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"` + version + `","capabilities":{},"clientInfo":{"name":"rogue","version":"1"}}}`)
	session = resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != http.StatusOK || session == "" || !strings.Contains(body, version) {
		t.Fatalf("initialize at %s: %s, session %q: %s", version, resp.Status, session, body)
	}
	if resp, body := post(`{"jsonrpc":"2.0","method":"notifications/initialized"}`); resp.StatusCode/100 != 2 {
		t.Fatalf("initialized: %s: %s", resp.Status, body)
	}

	var batch []string
	for i := range 50 {
		batch = append(batch, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`, 10+i))
	}
	for _, b := range []string{"[" + strings.Join(batch, ",") + "]", " \r\n\t[" + batch[0] + "]"} {
		resp, body := post(b)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "batches are refused") {
			t.Errorf("a batch of %d bytes: %s: %.300s; want 400 refusing the batch", len(b), resp.Status, body)
		}
	}
	if n := w.events.Calls("echo"); n != 0 {
		t.Errorf("the upstream ran %d calls of the refused batches", n)
	}
	if resp, body := post(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"one"}}}`); resp.StatusCode != http.StatusOK || !strings.Contains(body, `"one"`) {
		t.Fatalf("a single call on the same session: %s: %s", resp.Status, body)
	}
}

// A hostile upstream cannot exhaust the gateway by telling it, over and
// over, that its tools changed. The gateway relisted the upstream's tools
// once per notifications/tools/list_changed, each in a goroutine of its
// own waiting for the answer, so an upstream sending them by the hundred
// and never answering tools/list held as many goroutines, requests and
// connections in the gateway, for ever. A gateway has at most one relisting
// of an upstream in flight, and one more after it when told again
// meanwhile.
func TestAHostileUpstreamCannotPileUpRelistings(t *testing.T) {
	w := newWorld(t, "mcp:*")
	const told = 100
	var mu sync.Mutex
	lists, pending, maxPending := 0, 0, 0
	release := make(chan struct{})
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
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
			mu.Lock()
			lists++
			first := lists == 1
			pending++
			maxPending = max(maxPending, pending)
			mu.Unlock()
			defer func() { mu.Lock(); pending--; mu.Unlock() }()
			if !first {
				select { // the hostile upstream never answers, until the test ends
				case <-release:
				case <-r.Context().Done():
					return
				}
			}
			event(wr, answer(`{"tools":[{"name":"trigger","inputSchema":{"type":"object"}}]}`))
		case "tools/call":
			for range told {
				event(wr, `{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}`)
			}
			event(wr, answer(`{"content":[{"type":"text","text":"told"}]}`))
		default:
			event(wr, `{"jsonrpc":"2.0","id":`+string(req.ID)+`,"error":{"code":-32601,"message":"no"}}`)
		}
	}))
	t.Cleanup(hostile.Close)
	gw := w.open(t, mcpgate.Upstream{Name: "hostile", URL: hostile.URL})
	gwHTTP := httptest.NewUnstartedServer(nil)
	gwHTTP.Config.Handler = gw.Handler(mcpgate.HTTPOptions{BaseURL: "http://" + gwHTTP.Listener.Addr().String()})
	gwHTTP.Start()
	t.Cleanup(gwHTTP.Close)
	cs := connectAgent(t, gwHTTP.URL+mcpgate.EndpointPath, w.grant.Token, nil)
	if _, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "trigger", Arguments: map[string]any{}}); err != nil {
		t.Fatal(err)
	}
	testserver.WaitFor(t, guardWait, "the gateway to relist the hostile upstream's tools", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return pending >= 1
	})
	// The agent's own requests still go through meanwhile.
	if _, err := cs.ListTools(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	close(release)
	testserver.WaitFor(t, guardWait, "the relistings to end", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return pending == 0
	})
	mu.Lock()
	defer mu.Unlock()
	if maxPending > 1 {
		t.Errorf("told %d times that its tools changed, the gateway listed them %d times, %d at once; want at most one listing in flight", told, lists, maxPending)
	}
}
