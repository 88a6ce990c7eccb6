//go:build unix

package mcpgate_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/mcptest"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// stallingAgent is a rogue agent's HTTP transport: its socket's receive
// buffer is small (the kernel does not grow it), and the answer to a POST
// whose body holds stall is never read — the rogue keeps the connection
// open and reads nothing more from it, until release.
type stallingAgent struct {
	stall string
	next  http.RoundTripper

	mu      sync.Mutex
	stalled []io.Closer
	stop    chan struct{}
}

func newStallingAgent(stall string) *stallingAgent {
	dialer := &net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4<<10)
		}); err != nil {
			return err
		}
		return serr
	}}
	return &stallingAgent{stall: stall, next: &http.Transport{DialContext: dialer.DialContext}, stop: make(chan struct{})}
}

func (s *stallingAgent) RoundTrip(r *http.Request) (*http.Response, error) {
	stall := false
	if r.Method == http.MethodPost && r.GetBody != nil {
		if b, err := r.GetBody(); err == nil {
			body, _ := io.ReadAll(b)
			stall = strings.Contains(string(body), s.stall)
		}
	}
	resp, err := s.next.RoundTrip(r)
	if err != nil || !stall {
		return resp, err
	}
	s.mu.Lock()
	s.stalled = append(s.stalled, resp.Body)
	s.mu.Unlock()
	resp.Body = stalledBody{stop: s.stop, body: resp.Body}
	return resp, nil
}

func (s *stallingAgent) release() {
	close(s.stop)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range s.stalled {
		_ = b.Close()
	}
}

// stalledBody reads nothing until the rogue is released.
type stalledBody struct {
	stop <-chan struct{}
	body io.Closer
}

func (b stalledBody) Read([]byte) (int, error) { <-b.stop; return 0, io.EOF }
func (b stalledBody) Close() error             { return b.body.Close() }

// A rogue agent cannot silence the progress of every agent's calls to an
// upstream by not reading its own. The gateway shares one connection per
// upstream, and relayed each progress notification from it to the agent
// whose call it belonged to as the SDK's client handed it over — one at a
// time, in order, waiting for each write to the agent: a rogue that asked
// for progress on a call that reports much of it (a long build, a crawl)
// and then stopped reading its answer blocked the relay at its own
// stream, and every notification of that upstream after it — another
// agent's progress, the upstream's word that its tools changed — queued
// behind it, in the gateway's memory, for as long as the rogue held its
// connection. (An agent whose client keeps its call alive on progress
// gave its call up.) Each call's progress is now relayed on its own: a
// stream that is not read holds up only its own call's progress, and the
// gateway keeps, for it, only the latest notification not yet written.
func TestARogueNotReadingItsProgressCannotSilenceOtherAgentsProgress(t *testing.T) {
	w := newWorld(t, "mcp:*")
	events := &mcptest.Events{}
	chattered := make(chan struct{})
	upstream := func(*http.Request) *mcp.Server {
		s := mcptest.NewServer(events)
		mcp.AddTool(s, &mcp.Tool{Name: "chatty", Description: "reports 16 MiB of progress, then answers"}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
			line := strings.Repeat("p", 64<<10)
			for i := range 256 {
				_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: req.Params.GetProgressToken(), Progress: float64(i + 1), Total: 256, Message: line})
			}
			close(chattered)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}}}, nil, nil
		})
		return s
	}
	up := httptest.NewServer(mcp.NewStreamableHTTPHandler(upstream, nil))
	t.Cleanup(up.Close)
	endpoint := serveGateway(t, w.open(t, mcpgate.Upstream{Name: "build", URL: up.URL}))

	heard := make(chan string, 16)
	honest := connectAgent(t, endpoint, otherAgent(t, w, "honest", "mcp:*"), &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			heard <- req.Params.Message
		},
	})
	stalling := newStallingAgent("chatty")
	rogueHTTP := &http.Client{Transport: mcptest.Bearer{Token: w.grant.Token, Next: stalling}}
	rogue, err := mcp.NewClient(&mcp.Implementation{Name: "rogue", Version: "1"}, nil).Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: rogueHTTP}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rogueCtx, rogueStop := context.WithCancel(context.Background())
	t.Cleanup(func() {
		rogueStop()
		stalling.release()
		_ = rogue.Close()
	})
	go func() {
		params := &mcp.CallToolParams{Name: "chatty", Arguments: map[string]any{}}
		params.SetProgressToken("rogue")
		_, _ = rogue.CallTool(rogueCtx, params)
	}()
	recv(t, chattered, "chattered") // the upstream has sent all of it to the gateway

	params := &mcp.CallToolParams{Name: "slow", Arguments: map[string]any{"id": "honest-1"}}
	params.SetProgressToken("honest")
	t.Cleanup(func() { events.Release("honest-1") })
	answer := make(chan error, 1)
	go func() {
		_, err := honest.CallTool(context.Background(), params)
		answer <- err
	}()
	recv(t, events.Started("honest-1"), "events.Started('honest-1')")
	select {
	case msg := <-heard:
		if msg != "started honest-1" {
			t.Errorf("the honest agent heard %q, want its own call's progress", msg)
		}
	case <-time.After(guardWait): // a guard against a hang, not a timing
		t.Fatal("the honest agent never heard its call's progress: the relay waits on the rogue's stream")
	}
	events.Release("honest-1")
	if err := recv(t, answer, "answer"); err != nil {
		t.Fatalf("the honest agent's call: %v", err)
	}
}

// A rogue agent cannot make the gateway hold answers without bound by not
// reading them. A node's calls were counted (MaxCallsPerNode) until the
// upstream answered, not until the answer was written to the agent: a
// rogue that asked for large answers and read none had each held in the
// gateway's memory, its connection open, while its count went back down —
// as many as it opened connections for. A node's call now counts until
// its answer is written, or its connection ends.
func TestARogueNotReadingItsAnswersIsHeldToItsCallsInFlight(t *testing.T) {
	w := newWorld(t, "mcp:*")
	asked, gw := twoBigCallsGateway(t, w)
	// (Held for the whole test: the gateway gives up on writing to an
	// agent that reads nothing only after its write-stall timeout.)
	endpoint := serveGatewayWith(t, gw, mcpgate.HTTPOptions{WriteStallTimeout: time.Hour})
	honest := connectAgent(t, endpoint, otherAgent(t, w, "honest", "mcp:*"), nil)

	stalling := newStallingAgent(`"name":"big"`)
	rogueHTTP := &http.Client{Transport: mcptest.Bearer{Token: w.grant.Token, Next: stalling}}
	rogue, err := mcp.NewClient(&mcp.Implementation{Name: "rogue", Version: "1"}, nil).Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: rogueHTTP}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rogueCtx, rogueStop := context.WithCancel(context.Background())
	released := false
	t.Cleanup(func() {
		rogueStop()
		if !released {
			stalling.release()
		}
		_ = rogue.Close()
	})
	for range 2 {
		go func() {
			_, _ = rogue.CallTool(rogueCtx, &mcp.CallToolParams{Name: "big", Arguments: map[string]any{"bytes": 8 << 20}})
		}()
	}
	// Both answered by the upstream and ended in the ledger: the gateway
	// holds the two answers, writing them to a rogue that reads neither.
	waitAll(t, asked, "the upstream to be asked for the rogue's two answers")
	testserver.WaitFor(t, guardWait, "the rogue's two calls to end in the ledger", func() bool {
		calls, err := w.admin.Tool.ListCalls(context.Background(), connect.NewRequest(&tetherv1.ListCallsRequest{NodeId: w.agent.Node.NodeId}))
		if err != nil {
			t.Fatal(err)
		}
		return len(calls.Msg.Calls) == 0
	})
	if got, err := callText(t, rogue, "echo", map[string]any{"text": "third"}); rpcCode(err) != mcpgate.CodeTooManyCalls {
		t.Fatalf("the rogue's third call with two answers unread: %q, %v; want refused (%d)", got, err, mcpgate.CodeTooManyCalls)
	}
	if got, err := callText(t, honest, "echo", map[string]any{"text": "honest"}); err != nil || got != "honest" {
		t.Errorf("another agent's call: %q, %v", got, err)
	}
	// The rogue lets go of its answers: its calls are its own again.
	released = true
	stalling.release()
	testserver.WaitFor(t, guardWait, "the rogue's next call to be admitted", func() bool {
		got, err := callText(t, rogue, "echo", map[string]any{"text": "next"})
		if err != nil && rpcCode(err) != mcpgate.CodeTooManyCalls {
			t.Fatalf("the rogue's call after it let go: %v", err)
		}
		return err == nil && got == "next"
	})
}

// leavingAgent is a rogue agent's HTTP transport that sends each POST
// whose body holds leave on a connection of its own, handed to the test
// (which closes it, the rogue leaving its call without a word).
type leavingAgent struct {
	leave  string
	dialed chan net.Conn
}

func (l *leavingAgent) RoundTrip(r *http.Request) (*http.Response, error) {
	leave := false
	if r.Method == http.MethodPost && r.GetBody != nil {
		if b, err := r.GetBody(); err == nil {
			body, _ := io.ReadAll(b)
			leave = strings.Contains(string(body), l.leave)
		}
	}
	if !leave {
		return http.DefaultTransport.RoundTrip(r)
	}
	var d net.Dialer
	tr := &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err == nil {
			l.dialed <- c
		}
		return c, err
	}}
	return tr.RoundTrip(r)
}

// A rogue agent cannot escape its bound on calls in flight by leaving
// them. Over HTTP a call counts until its answer is written
// (TestARogueNotReadingItsAnswersIsHeldToItsCallsInFlight), but an agent
// that closes its connection does not cancel its call (MCP's
// cancellation is a notification it did not send): the call goes on at
// the upstream, and counts until it ends there too.
func TestARogueLeavingItsCallsIsStillHeldToItsCallsInFlight(t *testing.T) {
	w := newWorld(t, "mcp:*")
	gw, err := mcpgate.Open(context.Background(), mcpgate.OpenConfig{
		ControlPlane: w.srv.URL, Credential: w.srv.ToolServerToken(t, gateID), GateID: gateID, HTTP: w.srv.HTTP,
		Upstreams: []mcpgate.Upstream{{Name: "test", URL: w.upstream}}, MaxCallsPerNode: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Close)
	closed := make(chan string, 64)
	gwHTTP := httptest.NewUnstartedServer(nil)
	gwHTTP.Config.Handler = gw.Handler(mcpgate.HTTPOptions{BaseURL: "http://" + gwHTTP.Listener.Addr().String()})
	gwHTTP.Config.ConnState = func(c net.Conn, s http.ConnState) {
		if s == http.StateClosed {
			closed <- c.RemoteAddr().String()
		}
	}
	gwHTTP.Start()
	t.Cleanup(gwHTTP.Close)
	endpoint := gwHTTP.URL + mcpgate.EndpointPath

	leaving := &leavingAgent{leave: "leave-", dialed: make(chan net.Conn, 4)}
	rogueHTTP := &http.Client{Transport: mcptest.Bearer{Token: w.grant.Token, Next: leaving}}
	rogue, err := mcp.NewClient(&mcp.Implementation{Name: "rogue", Version: "1"}, nil).Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: rogueHTTP}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rogue.Close() })
	for _, id := range []string{"leave-1", "leave-2"} {
		t.Cleanup(func() { w.events.Release(id) })
		go func() {
			_, _ = rogue.CallTool(context.Background(), &mcp.CallToolParams{Name: "slow", Arguments: map[string]any{"id": id}})
		}()
		conn := recv(t, leaving.dialed, "leaving.dialed")
		recv(t, w.events.Started(id), "w.events.Started(id)")
		_ = conn.Close()
		// The gateway's side of the connection closes once the request
		// carrying the call has ended there.
		for addr := range closed {
			if addr == conn.LocalAddr().String() {
				break
			}
		}
	}
	if got, err := callText(t, rogue, "echo", map[string]any{"text": "third"}); rpcCode(err) != mcpgate.CodeTooManyCalls {
		t.Fatalf("the rogue's third call with two left running at the upstream: %q, %v; want refused (%d)", got, err, mcpgate.CodeTooManyCalls)
	}
}

// A rogue agent that reads none of its answers does not hold them in the
// gateway for as long as it keeps its connections. The gateway counted
// each against the node's calls in flight until written
// (TestARogueNotReadingItsAnswersIsHeldToItsCallsInFlight), but kept them
// — 8 MiB each here, up to 16 MiB — in its memory for ever, as many per
// agent as its calls in flight and a swarm's agents each as many. A write
// the agent does not take within the write-stall timeout now ends its
// connection and drops the answer: without the rogue reading or letting
// go, its calls are its own again. (The deadline is a socket's, on the
// real clock; the test waits for its effect, not for a time.)
func TestARogueNotReadingItsAnswersDoesNotHoldThemInTheGateway(t *testing.T) {
	w := newWorld(t, "mcp:*")
	asked, gw := twoBigCallsGateway(t, w)
	endpoint := serveGatewayWith(t, gw, mcpgate.HTTPOptions{WriteStallTimeout: 200 * time.Millisecond})

	stalling := newStallingAgent(`"name":"big"`)
	t.Cleanup(stalling.release)
	rogueHTTP := &http.Client{Transport: mcptest.Bearer{Token: w.grant.Token, Next: stalling}}
	rogue, err := mcp.NewClient(&mcp.Implementation{Name: "rogue", Version: "1"}, nil).Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: rogueHTTP}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rogueCtx, rogueStop := context.WithCancel(context.Background())
	t.Cleanup(func() { rogueStop(); _ = rogue.Close() })
	for range 2 {
		go func() {
			_, _ = rogue.CallTool(rogueCtx, &mcp.CallToolParams{Name: "big", Arguments: map[string]any{"bytes": 8 << 20}})
		}()
	}
	waitAll(t, asked, "the upstream to be asked for the rogue's two answers")
	// The rogue never reads nor lets go; the gateway gives up writing to
	// it, and its next call is admitted. A call sent on a connection the
	// gateway is ending for its stalled write fails in the rogue's own
	// transport (EOF), no answer of the gateway's, as WriteStallTimeout
	// says (seen on a loaded machine, where the end and the call cross:
	// twice in about 20 runs three at once at -cpu=1); the rogue calls
	// again, on a connection of its own.
	testserver.WaitFor(t, guardWait, "the rogue's next call to be admitted while it still reads nothing", func() bool {
		got, err := callText(t, rogue, "echo", map[string]any{"text": "next"})
		var je *jsonrpc.Error
		if err != nil && errors.As(err, &je) && je.Code != mcpgate.CodeTooManyCalls {
			t.Fatalf("the rogue's call: %v", err)
		}
		return err == nil && got == "next"
	})
}

// twoBigCallsGateway is a gateway to an honest upstream that allows a
// node 2 calls in flight, and asked, which is done once the upstream has
// been asked for the tool "big" twice.
func twoBigCallsGateway(t *testing.T, w *world) (*sync.WaitGroup, *mcpgate.Gateway) {
	t.Helper()
	events := &mcptest.Events{}
	asked := &sync.WaitGroup{}
	asked.Add(2)
	sdk := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return honestUpstream(events) }, nil)
	up := frontedUpstream(t, sdk, func(_ http.ResponseWriter, _ *http.Request, body []byte) bool {
		if strings.Contains(string(body), `"name":"big"`) {
			asked.Done()
		}
		return false
	})
	gw, err := mcpgate.Open(context.Background(), mcpgate.OpenConfig{
		ControlPlane: w.srv.URL, Credential: w.srv.ToolServerToken(t, gateID), GateID: gateID, HTTP: w.srv.HTTP,
		Upstreams: []mcpgate.Upstream{{Name: "files", URL: up.URL}}, MaxCallsPerNode: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Close)
	return asked, gw
}
