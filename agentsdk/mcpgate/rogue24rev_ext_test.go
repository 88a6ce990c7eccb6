package mcpgate_test

// A review of the twenty-fourth pass: the requests the gateway admits for
// no node must not keep their connections open, whatever their path.

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
)

// TestAClientWithoutATokenCannotHoldConnectionsOnAnotherPath: the
// gateway closes a connection after a request no bearer admits (no
// token, a bad one, the metadata), so that a client without a token
// cannot keep its connections open with one such request a minute,
// counted against no node. A path the gateway does not serve (a 404 from
// its mux, where an OAuth client probes for the authorization server's
// metadata) and the server-wide "OPTIONS *" (answered by net/http before
// any handler) kept theirs open all the same: a rogue sending either
// once a minute held as many connections as it opened. (Fails if any
// such request is answered twice on one connection.)
func TestAClientWithoutATokenCannotHoldConnectionsOnAnotherPath(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := w.gw.HTTPServer(mcpgate.HTTPOptions{BaseURL: "http://" + ln.Addr().String()})
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	for _, p := range []struct{ name, request string }{
		{"a path the gateway does not serve", "GET /nope HTTP/1.1\r\nHost: gw\r\n\r\n"},
		{"the authorization server's metadata, asked of the gateway", "GET /.well-known/oauth-authorization-server HTTP/1.1\r\nHost: gw\r\n\r\n"},
		{"the endpoint with a trailing slash", "POST " + mcpgate.EndpointPath + "/ HTTP/1.1\r\nHost: gw\r\nContent-Length: 0\r\n\r\n"},
		{"OPTIONS *", "OPTIONS * HTTP/1.1\r\nHost: gw\r\n\r\n"},
	} {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		_ = c.SetDeadline(time.Now().Add(guardWait)) // a guard against a hang, not a timing
		r := bufio.NewReader(c)
		var statuses []int
		for range 2 {
			if _, err := io.WriteString(c, p.request); err != nil {
				break
			}
			resp, err := http.ReadResponse(r, nil)
			if err != nil {
				break
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			statuses = append(statuses, resp.StatusCode)
		}
		if len(statuses) == 0 {
			t.Errorf("%s: no answer", p.name)
			continue
		}
		if len(statuses) == 2 {
			t.Errorf("%s: the connection was kept open after the answer (answers %v); want it closed", p.name, statuses)
		}
	}
}

// TestANegativeConnectionBoundRefusesNoNode: MaxConnsPerNode (and
// `tether mcp serve --max-conns-per-node`) below zero means no bound, as
// MaxSessionsPerNode's and the lease bounds' do; it refused every
// admitted request of every node with 429 (the bound was -1). (Fails if
// an honest node's ping is refused.)
func TestANegativeConnectionBoundRefusesNoNode(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + ln.Addr().String()
	srv := w.gw.HTTPServer(mcpgate.HTTPOptions{BaseURL: base, MaxConnsPerNode: -1})
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	cs := connectAgent(t, base+mcpgate.EndpointPath, w.grant.Token, nil)
	if got, err := callText(t, cs, "echo", map[string]any{"text": "unbounded"}); err != nil || got != "unbounded" {
		t.Fatalf("an honest node's call with no bound on connections: %q, %v", got, err)
	}
}
