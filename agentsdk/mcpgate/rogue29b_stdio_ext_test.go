package mcpgate_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The twenty-ninth rogue pass against the MCP gateway (helper B): an agent
// behind `tether mcp wrap` whose grant is revoked.

// stdioAgent is an agent's MCP client on gw's stdio (ServeStdio), its
// token in a file; served has ServeStdio's return.
type stdioAgent struct {
	cs     *mcp.ClientSession
	served chan error
	file   string
}

func serveStdioAgent(t *testing.T, gw *mcpgate.Gateway, token string) *stdioAgent {
	t.Helper()
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	toGateway, agentOut := io.Pipe()
	agentIn, fromGateway := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	a := &stdioAgent{served: make(chan error, 1), file: file}
	go func() { a.served <- gw.ServeStdio(ctx, &mcpgate.FileToken{Path: file}, toGateway, fromGateway) }()
	t.Cleanup(func() {
		cancel()
		agentOut.Close()
		agentIn.Close()
	})
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "stdio-rogue"}, nil).Connect(ctx, &mcp.IOTransport{Reader: agentIn, Writer: agentOut}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	a.cs = cs
	return a
}

// A revoked agent behind `tether mcp wrap` neither keeps its stdio session
// nor gets the result of its call in flight. The gateway ended the HTTP
// sessions of a revoked grant as the revocation arrived, their calls in
// flight answered CodeDenied, but a stdio session was never ended: the
// rogue kept it (pinging the gateway through it, a life the control plane
// never saw), and a call it had in flight at the revocation handed it the
// upstream's result when it came. The gateway now ends the stdio session
// as the revocation arrives: the call in flight is answered CodeDenied (it
// goes on at the upstream, recorded as it ends), the session closes and
// ServeStdio returns the revocation (`tether mcp wrap` exits). (Fails, by
// its guard, if the call in flight is not answered before the upstream's
// answer, or ServeStdio does not return.)
func TestRogue29BStdioSessionEndsOnRevocationWithItsCallInFlight(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	a := serveStdioAgent(t, w.gw, w.grant.Token)
	type answer struct {
		text string
		err  error
	}
	answers := make(chan answer, 1)
	go func() {
		text, err := callText(t, a.cs, "slow", map[string]any{"id": "r29b"})
		answers <- answer{text, err}
	}()
	recv(t, w.events.Started("r29b"), "the slow call to reach the upstream")
	defer w.events.Release("r29b")

	revokeAndWait(t, w)
	got := recv(t, answers, "the call in flight at the revocation to be answered")
	if rpcCode(got.err) != mcpgate.CodeDenied || !strings.Contains(got.err.Error(), "revoked") {
		t.Fatalf("the call in flight at the revocation: %q, %v; want it refused (%d, revoked) before the upstream answers", got.text, got.err, mcpgate.CodeDenied)
	}
	if err := recv(t, a.served, "ServeStdio to return: the revoked agent's stdio session ended"); !errors.Is(err, capability.ErrGrantRevoked) {
		t.Fatalf("ServeStdio returned %v; want the revocation", err)
	}
	if err := a.cs.Ping(context.Background(), nil); err == nil {
		t.Fatal("the revoked agent's ping on its ended stdio session was answered")
	}
}

// gatewayWithHeldScan is a gateway (its own manual clock) whose pass over
// its sessions for revoked grants waits for that clock, which the test
// never moves: a revocation of the test's is found by the agent's next
// request, not by the pass. Two bystanders' grants are revoked first, the
// first pass (at once) taken by one of them.
func gatewayWithHeldScan(t *testing.T, w *world) *mcpgate.Gateway {
	t.Helper()
	ctx := context.Background()
	gclk := clock.NewManual(time.Now().UTC())
	start := gclk.Now()
	gw, err := mcpgate.Open(ctx, mcpgate.OpenConfig{
		ControlPlane: w.srv.URL, Credential: w.srv.ToolServerToken(t, gateID), GateID: gateID, HTTP: w.srv.HTTP,
		Upstreams: []mcpgate.Upstream{{Name: "test", URL: w.upstream}}, Clock: gclk,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Close)
	for i := range 2 {
		by, err := w.admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "bystander"}))
		if err != nil {
			t.Fatal(err)
		}
		grant, err := w.admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{
			HolderNodeId: by.Msg.Node.NodeId, Scopes: []string{"mcp:test/*"}, Ttl: durationpb.New(time.Hour),
		}))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.admin.Capability.Revoke(ctx, connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_GrantId{GrantId: grant.Msg.Grant.GrantId}, Reason: "bystander"})); err != nil {
			t.Fatal(err)
		}
		testserver.WaitFor(t, guardWait, "the bystander's revocation to reach the gateway", func() bool {
			_, err := gw.Verifier().Verify(ctx, grant.Msg.Token)
			return errors.Is(err, capability.ErrGrantRevoked)
		})
		if i == 1 {
			testserver.WaitFor(t, guardWait, "the gateway's next pass to wait for its clock", func() bool {
				return gclk.Armed(start.Add(mcpgate.RevocationScanInterval))
			})
		}
	}
	return gw
}

// A revoked agent's ping over stdio, before the gateway's pass has ended
// its session, is refused, reported to the control plane (the node seen
// after its session's end) and ends the session: the gateway answered the
// stdio session's own requests (ping, initialize, logging/setLevel)
// without a look at the token, and nothing told the control plane the
// node was still there. (Fails if the ping is answered, or not reported,
// or the session goes on.)
func TestRogue29BStdioPingOfARevokedAgentIsRefusedReportedAndEndsItsSession(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	gw := gatewayWithHeldScan(t, w)
	a := serveStdioAgent(t, gw, w.grant.Token)
	self := w.agent.Node.NodeId
	endSession(t, w, self)
	revokeAndWaitOn(t, w, gw)

	if err := a.cs.Ping(context.Background(), nil); rpcCode(err) != mcpgate.CodeDenied || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("the revoked agent's ping over stdio: %v; want it refused (%d, revoked)", err, mcpgate.CodeDenied)
	}
	if err := recv(t, a.served, "ServeStdio to return: the revoked agent's stdio session ended"); !errors.Is(err, capability.ErrGrantRevoked) {
		t.Fatalf("ServeStdio returned %v; want the revocation", err)
	}
	testserver.WaitFor(t, guardWait, "the control plane to see the rogue at work after its session's end", func() bool {
		n := nodeOf(t, w, self)
		return n.LastSeenAt != nil && n.LastSeenAt.AsTime().After(n.SessionClosedAt.AsTime())
	})
}

// endSession opens node's session at the control plane and ends it, the
// clock moved past both.
func endSession(t *testing.T, w *world, node string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream := w.srv.Clients(w.agent.Credential).Agent.Session(ctx)
	if err := stream.Send(&tetherv1.SessionRequest{Kind: &tetherv1.SessionRequest_Hello{Hello: &tetherv1.SessionHello{NodeId: node}}}); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	if resp, err := stream.Receive(); err != nil || resp.GetOpened() == nil {
		t.Fatalf("the agent's session: %v %v", resp, err)
	}
	w.clk.Advance(time.Minute)
	_ = stream.CloseRequest()
	cancel()
	_ = stream.CloseResponse()
	testserver.WaitFor(t, guardWait, "the control plane to see the session end", func() bool {
		return nodeOf(t, w, node).SessionClosedAt != nil
	})
	w.clk.Advance(time.Minute)
}

// revokeAndWaitOn is revokeAndWait for gw.
func revokeAndWaitOn(t *testing.T, w *world, gw *mcpgate.Gateway) {
	t.Helper()
	if _, err := w.admin.Capability.Revoke(context.Background(), connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_GrantId{GrantId: w.grant.Grant.GrantId}, Reason: "rogue"})); err != nil {
		t.Fatal(err)
	}
	testserver.WaitFor(t, guardWait, "the revocation to reach the gateway", func() bool {
		_, err := gw.Verifier().Verify(context.Background(), w.grant.Token)
		return errors.Is(err, capability.ErrGrantRevoked)
	})
}

// A revoked agent behind `tether mcp wrap` cannot keep its stdio session
// by breaking its token file. The gateway judged the session by the token
// source's current token: a rogue that wrote garbage over its token file
// (its calls then refused as unauthenticated, its pings answered) had
// nothing judged revoked, and its session stayed. The session is now
// judged by the last token that verified. (Fails, by its guard, if the
// session does not end.)
func TestRogue29BStdioAgentCannotKeepItsSessionByBreakingItsTokenFile(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	a := serveStdioAgent(t, w.gw, w.grant.Token)
	if got, err := callText(t, a.cs, "echo", map[string]any{"text": "before"}); err != nil || got != "before" {
		t.Fatalf("a call before the stop: %q, %v", got, err)
	}
	if err := os.WriteFile(a.file, []byte("not a token"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := a.cs.Ping(context.Background(), nil); err != nil {
		t.Fatalf("a ping with the broken token file, before the revocation: %v", err)
	}
	revokeAndWait(t, w)
	if err := recv(t, a.served, "ServeStdio to return: the revoked agent's stdio session ended"); !errors.Is(err, capability.ErrGrantRevoked) {
		t.Fatalf("ServeStdio returned %v; want the revocation", err)
	}
}

// heldWriter passes writes on until hold is set, then blocks each one
// (signalling blocked) until the test ends: an agent that stopped reading
// its stdout.
type heldWriter struct {
	w       io.WriteCloser
	hold    atomic.Bool
	blocked chan struct{}
	once    sync.Once
	release chan struct{}
}

func (h *heldWriter) Write(p []byte) (int, error) {
	if h.hold.Load() {
		h.once.Do(func() { close(h.blocked) })
		<-h.release
		return 0, io.ErrClosedPipe
	}
	return h.w.Write(p)
}

func (h *heldWriter) Close() error { return h.w.Close() }

// A revoked agent behind `tether mcp wrap` cannot keep its wrapper running
// by not reading its stdout. The gateway ends its stdio session once the
// answers in flight are written, or after a while without; but the SDK
// closes a session only once its requests in flight have returned, and a
// request whose answer the agent does not take never returns: ServeStdio
// never returned, and `tether mcp wrap` (and its upstreams) stayed. It
// now gives up on the close after as long again and returns the
// revocation. (Fails, by its guard, if ServeStdio does not return.)
func TestRogue29BStdioAgentNotReadingItsAnswersCannotKeepItsWrapperRunning(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	ctx := context.Background()
	gclk := clock.NewManual(time.Now().UTC())
	gw, err := mcpgate.Open(ctx, mcpgate.OpenConfig{
		ControlPlane: w.srv.URL, Credential: w.srv.ToolServerToken(t, gateID), GateID: gateID, HTTP: w.srv.HTTP,
		Upstreams: []mcpgate.Upstream{{Name: "test", URL: w.upstream}}, Clock: gclk,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Close)
	toGateway, agentOut := io.Pipe()
	agentIn, fromGateway := io.Pipe()
	out := &heldWriter{w: fromGateway, blocked: make(chan struct{}), release: make(chan struct{})}
	sctx, cancel := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- gw.ServeStdio(sctx, mcpgate.StaticToken(w.grant.Token), toGateway, out) }()
	t.Cleanup(func() {
		close(out.release)
		cancel()
		agentOut.Close()
		agentIn.Close()
	})
	lines := bufio.NewReader(agentIn)
	send := func(msg string) {
		t.Helper()
		if _, err := io.WriteString(agentOut, msg+"\n"); err != nil {
			t.Fatal(err)
		}
	}
	send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"rogue","version":"1"}}}`)
	if line, err := lines.ReadString('\n'); err != nil || !strings.Contains(line, `"id":1`) {
		t.Fatalf("initialize: %q %v", line, err)
	}
	send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	// The agent stops reading; its ping's answer is held.
	out.hold.Store(true)
	send(`{"jsonrpc":"2.0","id":2,"method":"ping"}`)
	recv(t, out.blocked, "the gateway to write an answer the agent does not read")

	t0 := gclk.Now()
	revokeAndWaitOn(t, w, gw)
	// The gateway's pass ends the session (at once, or after the interval
	// it may be waiting for) and waits for the answers in flight.
	wait := mcpgate.DefaultWriteStallTimeout
	var endAt time.Time
	testserver.WaitFor(t, guardWait, "the gateway to wait for the answers in flight of the session it ends", func() bool {
		for _, at := range []time.Time{t0, t0.Add(mcpgate.RevocationScanInterval)} {
			if gclk.Armed(at.Add(wait)) {
				endAt = at.Add(wait)
				return true
			}
		}
		if gclk.Now().Equal(t0) && gclk.Armed(t0.Add(mcpgate.RevocationScanInterval)) {
			gclk.Advance(mcpgate.RevocationScanInterval)
		}
		return false
	})
	gclk.Set(endAt)
	testserver.WaitFor(t, guardWait, "the gateway to wait for the session to close", func() bool {
		return gclk.Armed(endAt.Add(wait))
	})
	gclk.Set(endAt.Add(wait))
	if err := recv(t, served, "ServeStdio to return"); !errors.Is(err, capability.ErrGrantRevoked) {
		t.Fatalf("ServeStdio returned %v; want the revocation", err)
	}
}
