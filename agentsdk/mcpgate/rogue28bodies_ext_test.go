package mcpgate_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/controlplane/testserver"
)

// A rogue cannot have the gateway hold as many request bodies as it opens
// connections. The gateway reads a request it admits whole (up to the
// SDK's 4 MiB) to count a tools/call against the node's calls in flight,
// and the SDK reads it again: a node sending 4 MiB bodies with their last
// byte held back, over as many connections as it may hold (288 by
// default), had the gateway hold some 2.3 GB, and a swarm of such nodes
// as many times that. A node's bodies now count against
// HTTPOptions.MaxBodyBytesPerNode (mcpgate.DefaultMaxBodyBytesPerNode) from
// the first byte read until their request ends; a request that would take
// the node past it is refused at once, 429 and -32069, and its connection
// closed, while another node's requests are served, and the node's own
// once its held requests end.
// (Fails, by its guard, if no request past the bound is refused before its
// body ends.)
func TestRogue28ANodesBodiesInFlightAreBounded(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	other := openRaw(t, w.endpoint, w.grant.Token) // a session of the node, opened before
	u, err := url.Parse(w.endpoint)
	if err != nil {
		t.Fatal(err)
	}
	const length = 3 << 20
	held := int(mcpgate.DefaultMaxBodyBytesPerNode / length) // the bodies the bound holds whole
	sent := held + 3
	head := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"text":"`
	// Each body but for its end: the rest never comes.
	part := head + strings.Repeat("x", length-len(head)-1)
	answers := make(chan string, sent)
	var conns []net.Conn
	for range sent {
		c, err := net.Dial("tcp", u.Host)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		t.Cleanup(func() { _ = c.Close() })
		_ = c.SetDeadline(time.Now().Add(guardWait)) // a guard against a hang, not a timing
		go func() {
			if _, err := fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: %d\r\n\r\n%s",
				u.Path, u.Host, w.grant.Token, length, part); err != nil {
				// Refused before it was all written: the answer tells.
				_ = err
			}
		}()
		go func() {
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				answers <- "no answer: " + err.Error()
				return
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			answers <- fmt.Sprintf("%d close=%t %s", resp.StatusCode, resp.Close, body)
		}()
	}
	// At most held of them fit the bound whole: the others are refused
	// before their end (which of them, and whether more, depends on how
	// their reads interleave), and none is answered otherwise.
	refused := func(i int, got string) {
		t.Helper()
		if !strings.HasPrefix(got, "429 close=true ") || !strings.Contains(got, `"code":-32069`) || !strings.Contains(got, "bytes") {
			t.Fatalf("answer #%d to the rogue's %d held bodies of %d bytes: %.400s; want 429, -32069, the connection closed", i+1, sent, length, got)
		}
	}
	for i := range sent - held {
		refused(i, recv(t, answers, "a request past the node's bound on its bodies to be refused"))
	}
	for i := sent - held; ; i++ {
		select {
		case got := <-answers:
			refused(i, got)
			continue
		default:
		}
		break
	}
	// Another node's calls go through meanwhile.
	x := otherAgent(t, w, "other", "mcp:test/*")
	if _, err := callText(t, connectAgent(t, w.endpoint, x, nil), "echo", map[string]any{"text": "other"}); err != nil {
		t.Fatalf("another node's call while the rogue holds its bound: %v", err)
	}
	// Once its requests end, the node's budget is its own again.
	for _, c := range conns {
		_ = c.Close()
	}
	testserver.WaitFor(t, guardWait, "the node's call to go through once its held requests ended", func() bool {
		resp, body := other.post(`{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"echo","arguments":{"text":"again"}}}`)
		if resp.StatusCode == http.StatusOK && strings.Contains(body, "again") {
			return true
		}
		if !strings.Contains(body, `"code":-32069`) {
			t.Fatalf("the node's call after its held requests ended: %s %.300s", resp.Status, body)
		}
		return false
	})
}

// A bound on a node's bodies below the gateway's read size still admits
// the bodies that fit it: each read takes from the node's budget what is
// left of it, up to the read's size, and only a body that goes on past it
// is refused (one that fills it exactly fits). (Fails if a body within the
// bound is refused, or one past it admitted.)
func TestRogue28ASmallBoundOnBodiesAdmitsTheBodiesThatFit(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	endpoint := serveGatewayWith(t, w.gw, mcpgate.HTTPOptions{MaxBodyBytesPerNode: 1024})
	s := openRaw(t, endpoint, w.grant.Token) // an initialize of some 150 bytes, admitted
	if resp, body := s.post(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"fits"}}}`); resp.StatusCode != http.StatusOK || !strings.Contains(body, "fits") {
		t.Fatalf("a call of some 100 bytes within a bound of 1024: %s %.300s; want it served", resp.Status, body)
	}
	// A body exactly the bound's size fits it.
	exact := `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"echo","arguments":{"text":"`
	exact += strings.Repeat("y", 1024-len(exact)-len(`"}}}`)) + `"}}}`
	if resp, body := s.post(exact); resp.StatusCode != http.StatusOK || !strings.Contains(body, "yyyy") {
		t.Fatalf("a call of exactly the bound's 1024 bytes: %s %.300s; want it served", resp.Status, body)
	}
	big := `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":{"text":"` + strings.Repeat("x", 2048) + `"}}}`
	if resp, body := s.post(big); resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(body, `"code":-32069`) {
		t.Fatalf("a call of 2 KiB past a bound of 1024: %s %.300s; want it refused (429, -32069)", resp.Status, body)
	}
}
