package mcpgate_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// A rogue agent opens MCP sessions on the gateway in a loop and never
// closes them: each is held in the gateway's memory, and the gateway is
// the one every other agent's tool calls go through. Its sessions beyond
// the per-node maximum are refused at initialize (CodeTooManySessions,
// saying what to do), closing one makes room for one more, and another
// node still connects and calls while the rogue sits at its maximum.
func TestARogueThatOpensSessionsInALoopIsHeldToItsShare(t *testing.T) {
	w := newWorld(t, "mcp:test/echo")
	var open []*mcp.ClientSession
	for range mcpgate.DefaultMaxSessionsPerNode {
		open = append(open, connectAgent(t, w.endpoint, w.grant.Token, nil))
	}
	refused := func(what string) {
		t.Helper()
		client := mcp.NewClient(&mcp.Implementation{Name: "rogue", Version: "1"}, nil)
		hc := &http.Client{Transport: bearer{token: func() string { return w.grant.Token }, next: http.DefaultTransport}}
		cs, err := client.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: w.endpoint, HTTPClient: hc}, nil)
		if err == nil {
			_ = cs.Close()
			t.Fatalf("%s: the gateway opened a session beyond the maximum of %d per node", what, mcpgate.DefaultMaxSessionsPerNode)
		}
		if !strings.Contains(err.Error(), "MCP sessions open on this gateway, the maximum") {
			t.Fatalf("%s: %v, want a refusal saying the node is at its maximum of sessions", what, err)
		}
	}
	refused("session 17")
	refused("session 17 again")

	// Another node is not held back by the rogue's sessions.
	ctx := context.Background()
	other, err := w.admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "other"}))
	if err != nil {
		t.Fatal(err)
	}
	grant, err := w.admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{
		HolderNodeId: other.Msg.Node.NodeId, Scopes: []string{"mcp:test/echo"}, Ttl: durationpb.New(time.Hour),
	}))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := callText(t, connectAgent(t, w.endpoint, grant.Msg.Token, nil), "echo", map[string]any{"text": "hi"}); err != nil || got != "hi" {
		t.Fatalf("another node's call while the rogue is at its maximum: %q, %v", got, err)
	}

	// Closing a session (DELETE) makes room for one more, and no more.
	if err := open[0].Close(); err != nil {
		t.Fatal(err)
	}
	var again *mcp.ClientSession
	testserver.WaitFor(t, guardWait, "the gateway to count the closed session out", func() bool {
		client := mcp.NewClient(&mcp.Implementation{Name: "rogue", Version: "1"}, nil)
		hc := &http.Client{Transport: bearer{token: func() string { return w.grant.Token }, next: http.DefaultTransport}}
		cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: w.endpoint, HTTPClient: hc}, nil)
		if err != nil {
			return false
		}
		again = cs
		t.Cleanup(func() { _ = cs.Close() })
		return true
	})
	if got, err := callText(t, again, "echo", map[string]any{"text": "again"}); err != nil || got != "again" {
		t.Fatalf("echo on the new session: %q, %v", got, err)
	}
	refused("session 17 after the swap")
}

// A hostile client cannot hoard the gateway's connections. `tether mcp
// serve` bounded only the time to send headers: a keep-alive connection
// with no request in flight, and a body trickled a byte at a time (with
// or without a bearer), stayed open for ever, and enough of them took the
// gateway's file handles, which it needs to accept the other agents and
// to reach the control plane where it reports how their calls ended. Its
// server (HTTPServer) now closes idle and slow connections as the control
// plane's does; a call whose answer takes longer than every timeout still
// gets it (the body's deadline is lifted once the body is read).
func TestAHostileClientCannotHoardTheGatewaysConnections(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + ln.Addr().String()
	// Timeouts of a second, which the hostile connections below wait out.
	// They were 50 and 100 ms: the honest session's client, descheduled on
	// a loaded machine for longer than the idle timeout between two of its
	// requests, sent its call on a keep-alive connection the gateway was
	// closing at that moment (seen: "rejected by transport: Post ...: EOF",
	// once in 75 runs three at once at -cpu=1).
	srv := w.gw.HTTPServer(mcpgate.HTTPOptions{BaseURL: base, ReadHeaderTimeout: time.Second, ReadTimeout: time.Second, IdleTimeout: time.Second})
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	const closeWait = 10 * time.Second
	waitClosed := func(what string, c net.Conn) string {
		t.Helper()
		_ = c.SetReadDeadline(time.Now().Add(closeWait))
		var got strings.Builder
		_, err := io.Copy(&got, c)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("%s: the gateway kept the connection open for %s", what, closeWait)
		}
		return got.String()
	}
	dial := func() net.Conn {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	post := func(token string, length int) string {
		h := "POST " + mcpgate.EndpointPath + " HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n" +
			fmt.Sprintf("Content-Length: %d\r\n", length)
		if token != "" {
			h += "Authorization: Bearer " + token + "\r\n"
		}
		return h + "\r\n{"
	}

	// A slow call is in flight through an honest session meanwhile.
	cs := connectAgent(t, base+mcpgate.EndpointPath, w.grant.Token, nil)
	done := startSlow(t, cs, w.events.Started("long"), "long")
	t.Cleanup(func() { w.events.Release("long") }) // before the gateway closes, should the test fail

	for _, p := range []struct{ name, send, want string }{
		{"slow headers", "POST " + mcpgate.EndpointPath + " HTTP/1.1\r\nHost: gw\r\n", ""},
		{"slow body, with the agent's bearer", post(w.grant.Token, 1<<10), ""},
		{"slow body, no bearer", post("", 1<<20), "401 Unauthorized"},
		{"idle keep-alive", "GET " + mcpgate.MetadataPath + " HTTP/1.1\r\nHost: gw\r\n\r\n", "200 OK"},
	} {
		conns := make([]net.Conn, 3)
		for i := range conns {
			conns[i] = dial()
			if _, err := io.WriteString(conns[i], p.send); err != nil {
				t.Fatal(err)
			}
		}
		for i, c := range conns {
			if got := waitClosed(fmt.Sprintf("%s #%d", p.name, i), c); !strings.Contains(got, p.want) {
				t.Fatalf("%s: the gateway wrote %q before closing, want %q in it", p.name, got, p.want)
			}
		}
	}
	// Every timeout has passed, several times over: the slow call still ends
	// with its answer.
	w.events.Release("long")
	if err := recv(t, done, "done"); err != nil {
		t.Fatalf("the slow call, answered after the timeouts: %v", err)
	}
}
