package controlplane_test

import (
	"bufio"
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

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The connection limits are real network timeouts of the server, so these
// tests configure them tiny and wait for their effect — the server closing
// the connection, seen as EOF by a blocked read — never for a duration.
// closeWait only bounds how long a broken server may keep the test waiting.
const closeWait = 20 * time.Second

// tinyLimits: every timeout a few tens of milliseconds, except writing:
// a request cut by its read deadline, or a health check, is still
// answered, and a loaded machine (the race detector, load 20) can take
// more than 200 ms to get the answer written (seen: the probes below read
// nothing before the close).
func tinyLimits(cfg *controlplane.Config) {
	cfg.Conn = controlplane.ConnLimits{
		ReadHeaderTimeout: 40 * time.Millisecond,
		ReadTimeout:       40 * time.Millisecond,
		WriteTimeout:      closeWait / 4,
		IdleTimeout:       40 * time.Millisecond,
		PingInterval:      40 * time.Millisecond,
		PingTimeout:       40 * time.Millisecond,
	}
}

func hostOf(t *testing.T, url string) string {
	t.Helper()
	return strings.TrimPrefix(url, "http://")
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// waitClosed reads (and discards) until the server closes the connection,
// returning what it read.
func waitClosed(t *testing.T, what string, c net.Conn) string {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(closeWait))
	var got strings.Builder
	_, err := io.Copy(&got, c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("%s: the server kept the connection open for %s", what, closeWait)
	}
	return got.String()
}

func TestIdleAndSlowConnectionsAreClosed(t *testing.T) {
	srv := testserver.Start(t, tinyLimits)
	// The probes whose answer is awaited (want) write their request's
	// headers at once, but a loaded machine does not always get to that
	// write within 40 ms of the server accepting the connection, and the
	// header timeout then closed it with nothing written (seen: slow body,
	// authenticated, wrote "" once in 60 runs at -cpu=1, two at once). They
	// go to a server whose header timeout is a second, the one timeout
	// they are not about; the slow headers keep the tiny one.
	patient := testserver.Start(t, tinyLimits, func(cfg *controlplane.Config) { cfg.Conn.ReadHeaderTimeout = time.Second })
	const n = 5
	type probe struct {
		name  string
		start func(c net.Conn)
		// want is in what the server wrote before closing ("" = anything).
		want string
	}
	rpcHead := func(token string, length int) string {
		h := "POST /tether.v1.AuthService/WhoAmI HTTP/1.1\r\nHost: tether\r\nContent-Type: application/json\r\n" +
			fmt.Sprintf("Content-Length: %d\r\n", length)
		if token != "" {
			h += "Authorization: Bearer " + token + "\r\n"
		}
		return h + "\r\n"
	}
	probes := []probe{
		{name: "slow headers", start: func(c net.Conn) {
			_, _ = io.WriteString(c, "POST /tether.v1.AuthService/WhoAmI HTTP/1.1\r\nHost: tether\r\n")
		}},
		{name: "slow body, authenticated", want: "HTTP/1.1 ", start: func(c net.Conn) {
			_, _ = io.WriteString(c, rpcHead(patient.Admin, 100)+"{")
		}},
		{name: "slow body, no credential", want: "401 Unauthorized", start: func(c net.Conn) {
			_, _ = io.WriteString(c, rpcHead("", 1<<20)+"{")
		}},
		{name: "idle HTTP/1.1 keep-alive", want: "200 OK", start: func(c net.Conn) {
			_, _ = io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: tether\r\n\r\n")
		}},
		{name: "idle HTTP/2", start: func(c net.Conn) {
			// The client preface and an empty SETTINGS frame, then nothing:
			// no stream, no answer to the server's SETTINGS or pings.
			_, _ = io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
		}},
	}
	for _, p := range probes {
		t.Run(p.name, func(t *testing.T) {
			addr := hostOf(t, srv.URL)
			if p.want != "" {
				addr = hostOf(t, patient.URL)
			}
			conns := make([]net.Conn, n)
			for i := range conns {
				conns[i] = dial(t, addr)
				p.start(conns[i])
			}
			for i, c := range conns {
				got := waitClosed(t, fmt.Sprintf("%s #%d", p.name, i), c)
				if p.want != "" && !strings.Contains(got, p.want) {
					t.Fatalf("%s: the server wrote %q before closing, want %q in it", p.name, got, p.want)
				}
			}
		})
	}
	// Every connection is gone from the server's count.
	testserver.WaitFor(t, closeWait, "the servers to forget the closed connections", func() bool {
		return srv.OpenConnections() == 0 && patient.OpenConnections() == 0
	})
}

// TestSlowHTTP2BodyIsCut: over HTTP/2 the read deadline is the stream's.
// An authenticated unary call whose body never ends is answered with an
// error once the read timeout passes, instead of holding its stream (and
// the handler's goroutine) for as long as the client likes.
func TestSlowHTTP2BodyIsCut(t *testing.T) {
	// The client waits for its answer and acknowledges the server's pings;
	// on a loaded machine not always within 40 ms, and the lost connection
	// then failed the call (cannot rewind body): the ping timeout here is
	// only a dead peer's bound. Nor does a loaded machine always open the
	// client's HTTP/2 connection (its preface, its settings) and send the
	// call's headers within 40 ms (seen: "http2: client conn could not be
	// established", once in 120 runs four at once): the header and idle
	// timeouts are a second, as streamLimits', and only the read timeout,
	// the one this test is about, stays tiny.
	srv := testserver.Start(t, tinyLimits, func(cfg *controlplane.Config) {
		cfg.Conn.PingTimeout = closeWait
		cfg.Conn.ReadHeaderTimeout = time.Second
		cfg.Conn.IdleTimeout = time.Second
	})
	body, feed := io.Pipe()
	defer feed.Close()
	go func() { _, _ = io.WriteString(feed, "{") }() // and never the rest
	ctx, cancel := context.WithTimeout(context.Background(), closeWait)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/tether.v1.AuthService/WhoAmI", body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+srv.Admin)
	resp, err := testserver.H2CClient().Do(req)
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the server waited %s for the rest of the body", closeWait)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, _ := io.ReadAll(resp.Body)
	if resp.ProtoMajor != 2 {
		t.Fatalf("answered over HTTP/%d, want HTTP/2", resp.ProtoMajor)
	}
	if resp.StatusCode == http.StatusOK {
		t.Fatalf("a call whose body never ended was answered 200: %s", got)
	}
}

// streamLimits: the timeouts TestActiveStreamsOutliveTheTimeouts holds
// its streams through. Not tinyLimits: those tens of milliseconds are
// shorter than what a loaded machine (the race detector, load 20) takes to
// schedule a goroutine, and the test then failed on the timeouts doing
// their job before the stream was there: the idle timeout closing the
// connection a register had just left as the session opened on it
// (GOAWAY), the header timeout cutting a connection's preface, a stream's
// read and write deadlines (which run from its opening until
// streamsUnbounded lifts them after authentication) firing first, a ping
// answered late. A second is orders of magnitude above that latency; the
// pings still come every 40 ms of silence, and a live client answers
// them, so their timeout is only a dead peer's bound.
func streamLimits(cfg *controlplane.Config) {
	cfg.Conn = controlplane.ConnLimits{
		ReadHeaderTimeout: time.Second,
		ReadTimeout:       time.Second,
		WriteTimeout:      time.Second,
		IdleTimeout:       time.Second,
		PingInterval:      40 * time.Millisecond,
		PingTimeout:       closeWait,
	}
}

// TestActiveStreamsOutliveTheTimeouts: the timeouts are per request and per
// idle connection, not per stream: an authenticated watch keeps receiving
// long after them, and a session whose client was quiet meanwhile still
// answers.
func TestActiveStreamsOutliveTheTimeouts(t *testing.T) {
	const heartbeat = 10 * time.Millisecond
	var limits controlplane.Config
	streamLimits(&limits)
	longest := max(limits.Conn.ReadHeaderTimeout, limits.Conn.ReadTimeout, limits.Conn.WriteTimeout, limits.Conn.IdleTimeout)
	srv := testserver.Start(t, streamLimits, func(cfg *controlplane.Config) { cfg.RevocationHeartbeat = heartbeat })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	admin := srv.AdminClients()
	root := register(t, admin, "long-lived")
	agent := srv.Clients(root.Credential)

	session := agent.Agent.Session(ctx)
	defer func() { _ = session.CloseRequest(); _ = session.CloseResponse() }()
	if err := session.Send(&tetherv1.SessionRequest{Kind: &tetherv1.SessionRequest_Hello{Hello: &tetherv1.SessionHello{NodeId: root.Node.NodeId}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := session.Receive(); err != nil {
		t.Fatalf("session opened: %v", err)
	}

	// The feed's heartbeats come from a ticker: the n-th comes at least
	// (n-1) heartbeats after the watch opened, so these span twice every
	// timeout (whatever the load: a slow machine only stretches them).
	n := int(2*longest/heartbeat) + 1
	watch, err := agent.Capability.WatchRevocations(ctx, connect.NewRequest(&tetherv1.WatchRevocationsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if !watch.Receive() {
			t.Fatalf("the watch ended after %d messages: %v", i, watch.Err())
		}
	}
	// The session's client sent nothing all that time; it is still served.
	if err := session.Send(&tetherv1.SessionRequest{Kind: &tetherv1.SessionRequest_Heartbeat{Heartbeat: &tetherv1.SessionHeartbeat{}}}); err != nil {
		t.Fatal(err)
	}
	for {
		m, err := session.Receive()
		if err != nil {
			t.Fatalf("the quiet session was cut: %v", err)
		}
		if m.GetHeartbeatAck() != nil {
			break
		}
	}
}

// rawRequest sends one HTTP/1.1 request on a new connection and returns
// the status line and body of the answer.
func rawRequest(t *testing.T, addr, request string) (status, body string) {
	t.Helper()
	c := dial(t, addr)
	defer c.Close()
	if _, err := io.WriteString(c, request); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(closeWait))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to %q: %v", strings.SplitN(request, "\r\n", 2)[0], err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.Status, string(b)
}

// TestConnectionCapKeepsHealthAnswering: with every place held by an
// authenticated connection (unauthenticated ones give way at the cap:
// conn_rogue_ext_test.go), /healthz still answers on the health reserve,
// an RPC there is refused clearly, and past the reserve its oldest
// connection gives way to the new one.
func TestConnectionCapKeepsHealthAnswering(t *testing.T) {
	const max, reserve = 8, 2
	srv := testserver.Start(t, func(cfg *controlplane.Config) {
		cfg.Conn = controlplane.ConnLimits{MaxConnections: max, HealthReserve: reserve, MaxConnectionsPerLineage: max, PreAuthTimeout: time.Hour}
	})
	addr := hostOf(t, srv.URL)
	whoAmIRequest := "POST /tether.v1.AuthService/WhoAmI HTTP/1.1\r\nHost: tether\r\n" +
		"Content-Type: application/json\r\nAuthorization: Bearer " + srv.Admin + "\r\nContent-Length: 2\r\n\r\n{}"
	hoard := make([]net.Conn, max)
	for i := range hoard {
		// An admitted call binds each connection to the operator; the
		// connection stays open (keep-alive).
		hoard[i] = dial(t, addr)
		if _, err := io.WriteString(hoard[i], whoAmIRequest); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(hoard[i]), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("hoarded connection #%d: %s", i, resp.Status)
		}
	}
	testserver.WaitFor(t, closeWait, "the server to hold the hoarded connections", func() bool { return srv.OpenConnections() == max })

	// At the cap, /healthz still answers (on a reserved connection)...
	status, body := rawRequest(t, addr, "GET /healthz HTTP/1.1\r\nHost: tether\r\nConnection: close\r\n\r\n")
	if status != "200 OK" || body != "ok\n" {
		t.Fatalf("/healthz at the cap: %s %q", status, body)
	}
	// ...and an RPC is refused clearly, without reaching the service.
	status, body = rawRequest(t, addr, strings.Replace(whoAmIRequest, "Host: tether\r\n", "Host: tether\r\nConnection: close\r\n", 1))
	if !strings.HasPrefix(status, "503") || !strings.Contains(body, "too many open connections") || !strings.Contains(body, "unavailable") {
		t.Fatalf("an RPC at the cap: %s %q, want 503 unavailable naming the limit", status, body)
	}
	// A Connect client sees unavailable with the message.
	_, err := srv.Clients(srv.Admin).Auth.WhoAmI(context.Background(), connect.NewRequest(&tetherv1.WhoAmIRequest{}))
	wantLimit(t, "a Connect call at the cap", err, connect.CodeUnavailable, "too many open connections")

	// Past the reserve, its oldest connection gives way to the new one,
	// which /healthz answers.
	testserver.WaitFor(t, closeWait, "the refused connections to be closed", func() bool { return srv.OpenConnections() == max })
	reserved := []net.Conn{dial(t, addr), dial(t, addr)}
	testserver.WaitFor(t, closeWait, "the reserve to fill", func() bool { return srv.OpenConnections() == max+reserve })
	status, body = rawRequest(t, addr, "GET /healthz HTTP/1.1\r\nHost: tether\r\nConnection: close\r\n\r\n")
	if status != "200 OK" || body != "ok\n" {
		t.Fatalf("/healthz past the reserve: %s %q", status, body)
	}
	waitClosed(t, "the oldest reserved connection", reserved[0])

	// Freed places are reused.
	for _, c := range append(hoard, reserved...) {
		c.Close()
	}
	testserver.WaitFor(t, closeWait, "the hoarded connections to be released", func() bool { return srv.OpenConnections() < max })
	if _, err := testserver.NewClients(testserver.H2CClient(), srv.URL, srv.Admin).Auth.WhoAmI(context.Background(), connect.NewRequest(&tetherv1.WhoAmIRequest{})); err != nil {
		t.Fatalf("after the hoard left: %v", err)
	}
}
