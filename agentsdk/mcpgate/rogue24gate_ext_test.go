package mcpgate_test

// The twenty-fourth rogue pass against the gateway: a rogue agent's
// progress token, echoed by the gateway with every notification of its
// call's progress.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/controlplane/testserver"
)

// chattyNotes is how many progress notifications the chatty tool sends.
const chattyNotes = 64

// chattyUpstream is an honest upstream whose tool reports its progress
// as its work goes on (a download reporting each chunk): each
// notification after the last has been read by the caller (next), so
// that none is lost to the relay keeping only the latest. It counts its
// calls.
func chattyUpstream(t *testing.T, calls *atomic.Int32, next <-chan struct{}) string {
	t.Helper()
	s := mcp.NewServer(&mcp.Implementation{Name: "chatty", Version: "1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "fetch", Description: "reports its progress chunk by chunk"}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		calls.Add(1)
		if pt := req.Params.GetProgressToken(); pt != nil {
			for i := range chattyNotes {
				_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: pt, Progress: float64(i + 1), Total: chattyNotes, Message: "chunk"})
				select {
				case <-next:
				case <-ctx.Done():
					return nil, nil, ctx.Err()
				}
			}
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "fetched"}}}, nil, nil
	})
	up := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
	t.Cleanup(up.Close)
	return up.URL
}

// chattyCall is what came back for one call of fetch: the bytes of the
// answer's stream, the progress notifications in it, and the answer.
type chattyCall struct {
	bytes, notes int
	tokens       []string // the progress tokens of the notifications, as sent
	answer       string   // the JSON-RPC answer's data line
}

// callChatty calls fetch on the rogue's session with progressToken (raw
// JSON) and reads its answer's stream as it comes, letting the tool go
// on (next) after each notification read.
func callChatty(t *testing.T, s *rawSession, id int, progressToken string, next chan<- struct{}) chattyCall {
	t.Helper()
	body := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"fetch","arguments":{},"_meta":{"progressToken":%s}}}`, id, progressToken)
	req, err := http.NewRequest(http.MethodPost, s.endpoint, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+s.token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", s.id)
	req.Header.Set("Mcp-Protocol-Version", rawVersion)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got chattyCall
	lines := bufio.NewReader(resp.Body)
	for {
		line, err := lines.ReadString('\n')
		got.bytes += len(line)
		data, isData := strings.CutPrefix(strings.TrimSpace(line), "data: ")
		if !isData && strings.HasPrefix(line, "{") { // a JSON answer, not a stream
			data, isData = strings.TrimSpace(line), true
		}
		if isData {
			var msg struct {
				Method string `json:"method"`
				Params struct {
					ProgressToken json.RawMessage `json:"progressToken"`
				} `json:"params"`
			}
			if json.Unmarshal([]byte(data), &msg) == nil && msg.Method == "notifications/progress" {
				got.notes++
				got.tokens = append(got.tokens, string(msg.Params.ProgressToken))
				select {
				case next <- struct{}{}:
				case <-time.After(guardWait): // a guard against a hang, not a timing
					t.Fatalf("the chatty tool did not take its next chunk within %s", guardWait)
				}
				continue
			}
			got.answer = data
		}
		if err != nil {
			return got
		}
	}
}

// A rogue agent cannot have the gateway write its progress token back to
// it with every notification of its call's progress. The gateway keeps
// the agent's token and restores it in each notification it relays (MCP
// asks for the request's own token); a token was taken as the agent sent
// it, of any JSON type and up to the request's 4 MiB: a call with a token
// of 256 KiB to a tool that reports its progress 64 times had the gateway
// encode and write 16 MiB for it — the gateway's CPU and bandwidth, which
// every agent's calls share, spent at the rogue's word, 64 times what it
// sent, for each of its calls in flight. MCP's progress token is a string
// or an integer: the gateway now refuses a call whose token is neither, or
// a string longer than MaxProgressTokenBytes (invalid params), before the
// ledger and the upstream; an honest agent's token passes as before.
func TestARogueCannotHaveTheGatewayEchoAHugeProgressToken(t *testing.T) {
	w := newWorld(t, "mcp:*")
	var calls atomic.Int32
	next := make(chan struct{})
	endpoint := serveGateway(t, w.open(t, mcpgate.Upstream{Name: "chatty", URL: chattyUpstream(t, &calls, next)}))
	rogue := openRaw(t, endpoint, w.grant.Token)

	huge := `"` + strings.Repeat("p", 256<<10) + `"`
	// (An integer beyond 2^53 came back changed: 10^18 - 1 as 10^18.)
	for i, token := range []string{huge, `{"pad":` + huge + `}`, `[` + huge + `]`, `true`, `1.5`, strings.Repeat("9", 18)} {
		got := callChatty(t, rogue, 10+i, token, next)
		if got.notes > 0 || !strings.Contains(got.answer, fmt.Sprintf(`"code":%d`, jsonrpc.CodeInvalidParams)) || !strings.Contains(got.answer, "progress token") {
			t.Errorf("a call whose progress token is %.12s… (%d bytes): %d bytes back, %d progress notifications, answer %.200s; want refused as invalid params naming the progress token",
				token, len(token), got.bytes, got.notes, got.answer)
		}
	}
	if n := calls.Load(); n != 0 {
		t.Errorf("the upstream was called %d times for calls whose progress token the gateway refuses", n)
	}

	// An honest agent's tokens, a string and an integer, pass, and each
	// comes back with every notification of its call's progress.
	for i, token := range []string{`"job-7f3a"`, `42`, `9007199254740991`, `"` + strings.Repeat("t", mcpgate.MaxProgressTokenBytes) + `"`} {
		got := callChatty(t, rogue, 20+i, token, next)
		if !strings.Contains(got.answer, "fetched") || got.notes != chattyNotes || got.tokens[0] != token || got.tokens[chattyNotes-1] != token {
			t.Errorf("a call with the progress token %.20s: %d notifications (tokens %.60v), answer %.200s; want its answer, and its %d notifications under its own token",
				token, got.notes, got.tokens, got.answer, chattyNotes)
		}
	}
	if n := calls.Load(); n != 4 {
		t.Errorf("the upstream was called %d times, want 4 (the honest tokens' calls)", n)
	}
}

// A rogue agent cannot hold as many of the gateway's connections as it
// opens. HTTPServer closes an idle keep-alive connection after
// IdleTimeout (2 min), so a rogue that sent a ping on each of its
// connections now and then held every one of them open for ever: 12 of
// 12 held here, and as many as it could open in production, taking the
// gateway's file handles, which it needs to accept the other agents and to
// reach the control plane where it reports how their calls ended. A node
// now holds at most MaxConnsPerNode: its request on one more is refused
// (429, CodeTooManyConnections) and that connection closed, before the
// request is read; another node's connections are its own, and one the
// rogue closes makes room for another.
func TestARogueCannotHoldAsManyConnectionsAsItOpens(t *testing.T) {
	const max, opened = 4, 12
	w := newWorld(t, "mcp:test/*")
	rogueToken := otherAgent(t, w, "rogue", "mcp:test/*")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + ln.Addr().String()
	srv := w.gw.HTTPServer(mcpgate.HTTPOptions{BaseURL: base, MaxConnsPerNode: max})
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	type conn struct {
		c net.Conn
		r *bufio.Reader
	}
	dial := func() conn {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return conn{c, bufio.NewReader(c)}
	}
	// ping sends a ping on c (keep-alive) and returns the answer's status
	// and body, or "closed" when the gateway closed the connection.
	ping := func(c conn, token string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, base+mcpgate.EndpointPath, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		_ = c.c.SetDeadline(time.Now().Add(guardWait)) // a guard against a hang, not a timing
		if err := req.Write(c.c); err != nil {
			return 0, "closed"
		}
		resp, err := http.ReadResponse(c.r, req)
		if err != nil {
			return 0, "closed"
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	closedByGateway := func(c conn) bool {
		_ = c.c.SetReadDeadline(time.Now().Add(guardWait))
		_, err := c.r.ReadByte()
		return err != nil
	}

	var held []conn
	refused := 0
	for i := range opened {
		c := dial()
		status, body := ping(c, rogueToken)
		switch {
		case status == http.StatusOK:
			held = append(held, c)
		case status == http.StatusTooManyRequests && strings.Contains(body, fmt.Sprint(mcpgate.CodeTooManyConnections)):
			refused++
			if !closedByGateway(c) {
				t.Errorf("connection %d: refused, but left open", i)
			}
		default:
			t.Fatalf("connection %d: %d %.300s", i, status, body)
		}
	}
	if len(held) != max || refused != opened-max {
		t.Fatalf("the rogue holds %d of the %d connections it opened (%d refused); want %d held", len(held), opened, refused, max)
	}
	// Those it holds are its own to use.
	for i, c := range held {
		if status, body := ping(c, rogueToken); status != http.StatusOK {
			t.Errorf("the rogue's connection %d, again: %d %.300s", i, status, body)
		}
	}
	// Another node's connections are its own.
	cs := connectAgent(t, base+mcpgate.EndpointPath, w.grant.Token, nil)
	if got, err := callText(t, cs, "echo", map[string]any{"text": "still here"}); err != nil || got != "still here" {
		t.Fatalf("another node's call while the rogue holds its maximum: %q, %v", got, err)
	}
	// One the rogue closes makes room for another.
	_ = held[0].c.Close()
	testserver.WaitFor(t, guardWait, "a new connection of the rogue's to be admitted once it closed one", func() bool {
		status, _ := ping(dial(), rogueToken)
		return status == http.StatusOK
	})
}

// A client without a token cannot hold the gateway's connections either,
// and a rogue agent cannot hold them past its bound by leaving its token
// out. A request the gateway does not admit — one without a bearer, or
// with one that does not verify (401), or for the protected-resource
// metadata, which needs none — was answered on a keep-alive connection
// the client could use again: one such request a minute kept each of as
// many connections as it opened, counted against no node. The gateway now
// closes the connection after answering a request it did not admit; an
// admitted request's connection stays open for the next.
func TestAClientWithoutATokenCannotHoldTheGatewaysConnections(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + ln.Addr().String()
	srv := w.gw.HTTPServer(mcpgate.HTTPOptions{BaseURL: base})
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	request := func(method, path, token, body string) *http.Request {
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
		}
		return req
	}
	ping := `{"jsonrpc":"2.0","id":1,"method":"ping"}`
	for _, p := range []struct {
		name   string
		req    func() *http.Request
		status int
		open   bool
	}{
		{"a call without a bearer", func() *http.Request { return request(http.MethodPost, mcpgate.EndpointPath, "", ping) }, http.StatusUnauthorized, false},
		{"a call with a bearer that does not verify", func() *http.Request { return request(http.MethodPost, mcpgate.EndpointPath, "not-a-token", ping) }, http.StatusUnauthorized, false},
		{"the protected-resource metadata", func() *http.Request { return request(http.MethodGet, mcpgate.MetadataPath, "", "") }, http.StatusOK, false},
		{"an admitted call", func() *http.Request { return request(http.MethodPost, mcpgate.EndpointPath, w.grant.Token, ping) }, http.StatusOK, true},
	} {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		_ = c.SetDeadline(time.Now().Add(guardWait)) // a guard against a hang, not a timing
		r := bufio.NewReader(c)
		// The same request twice on the connection: the second is answered
		// only if the gateway kept the connection open after the first.
		var statuses []int
		for range 2 {
			req := p.req()
			if req.Write(c) != nil {
				break
			}
			resp, err := http.ReadResponse(r, req)
			if err != nil {
				break
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			statuses = append(statuses, resp.StatusCode)
		}
		if len(statuses) == 0 || statuses[0] != p.status {
			t.Errorf("%s: answered %v, want %d first", p.name, statuses, p.status)
			continue
		}
		if kept := len(statuses) == 2; kept != p.open {
			t.Errorf("%s: the connection was kept open after the answer: %v (answers %v); want %v", p.name, kept, statuses, p.open)
		}
	}
}
