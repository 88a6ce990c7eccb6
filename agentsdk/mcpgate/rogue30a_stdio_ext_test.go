package mcpgate_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
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
	"github.com/tetherhq/tether/supervisor/ledger"
)

// The thirtieth rogue pass against the MCP gateway (helper A): the agent
// being stopped, behind `tether mcp wrap` or the HTTP endpoint.

// rawStdio is an agent writing raw lines to gw's stdio (ServeStdio with
// tokens), its answers read line by line.
type rawStdio struct {
	out    io.WriteCloser
	lines  *bufio.Reader
	served chan error
}

func serveRawStdio(t *testing.T, gw *mcpgate.Gateway, tokens mcpgate.TokenSource) *rawStdio {
	t.Helper()
	toGateway, agentOut := io.Pipe()
	agentIn, fromGateway := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	a := &rawStdio{out: agentOut, lines: bufio.NewReader(agentIn), served: make(chan error, 1)}
	go func() { a.served <- gw.ServeStdio(ctx, tokens, toGateway, fromGateway) }()
	t.Cleanup(func() {
		cancel()
		agentOut.Close()
		agentIn.Close()
	})
	return a
}

func (a *rawStdio) send(t *testing.T, msg string) {
	t.Helper()
	if _, err := io.WriteString(a.out, msg+"\n"); err != nil {
		t.Fatal(err)
	}
}

func (a *rawStdio) read(t *testing.T) string {
	t.Helper()
	got := make(chan string, 1)
	go func() {
		line, err := a.lines.ReadString('\n')
		if err != nil {
			line = "the gateway's output ended: " + err.Error()
		}
		got <- line
	}()
	return within(t, got, "the gateway's answer")
}

// A revoked agent's JSON-RPC batch over stdio is its token at work as any
// request is: refused as revoked, reported to the control plane (the node
// seen after its session's end) and its session ended. The batch was
// answered -32600 before any look at the token, and nothing told the
// control plane: a revoked rogue kept its stdio session, and showed no
// life, by sending only batches. (Fails if the batch is answered anything
// but the revocation, or goes unreported, or the session goes on.)
func TestRogue30AStdioBatchOfARevokedAgentIsRefusedReportedAndEndsItsSession(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	gw := gatewayWithHeldScan(t, w)
	a := serveRawStdio(t, gw, mcpgate.StaticToken(w.grant.Token))
	a.send(t, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"rogue","version":"1"}}}`)
	if line := a.read(t); !strings.Contains(line, `"id":1`) || strings.Contains(line, "error") {
		t.Fatalf("initialize: %s", line)
	}
	a.send(t, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	self := w.agent.Node.NodeId
	endSession(t, w, self)
	revokeAndWaitOn(t, w, gw)

	a.send(t, `[{"jsonrpc":"2.0","id":2,"method":"ping"}]`)
	var refusal struct {
		Error struct {
			Code    int64  `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	line := a.read(t)
	if err := json.Unmarshal([]byte(line), &refusal); err != nil || refusal.Error.Code != mcpgate.CodeDenied || !strings.Contains(refusal.Error.Message, "revoked") {
		t.Fatalf("the revoked agent's batch over stdio: %.400s; want it refused (%d, revoked)", line, mcpgate.CodeDenied)
	}
	if err := recv(t, a.served, "ServeStdio to return: the revoked agent's stdio session ended"); !errors.Is(err, capability.ErrGrantRevoked) {
		t.Fatalf("ServeStdio returned %v; want the revocation", err)
	}
	testserver.WaitFor(t, guardWait, "the control plane to see the rogue at work after its session's end", func() bool {
		n := nodeOf(t, w, self)
		return n.LastSeenAt != nil && n.LastSeenAt.AsTime().After(n.SessionClosedAt.AsTime())
	})
}

// A rogue that claimed its exit cannot go on being served by the gateway
// unseen while its grant is live. The gateway learns revocations, not
// claims: its own answers to the node's token (ping, tools/list, a new
// session's initialize and GET stream), over HTTP or stdio, were served
// offline, and a rogue that ended its session, claimed its exit and went
// on pinging its gateway until its stop revoked its grant had the record
// read its exit confirmed by the control plane. Each such request is now
// reported (a BeginCall of mcpgate.SeenReportTool, which the control plane
// begins nothing for and keeps as the node's credential at work) before it
// is served: the record reads the claim contradicted. (Fails if the record
// reads the rogue's exit confirmed.)
func TestRogue30AServedAfterItsClaimIsLifeAfterIt(t *testing.T) {
	for _, tc := range []struct {
		name  string
		stdio bool
		act   func(t *testing.T, w *world, cs *mcp.ClientSession, token string) error
	}{
		{"ping over HTTP", false, func(t *testing.T, _ *world, cs *mcp.ClientSession, _ string) error {
			return cs.Ping(context.Background(), nil)
		}},
		{"tools/list over HTTP", false, func(t *testing.T, _ *world, cs *mcp.ClientSession, _ string) error {
			_, err := cs.ListTools(context.Background(), nil)
			return err
		}},
		{"a new session over HTTP", false, func(t *testing.T, w *world, _ *mcp.ClientSession, token string) error {
			cs := connectAgent(t, w.endpoint, token, nil)
			return cs.Close()
		}},
		{"ping over stdio", true, func(t *testing.T, _ *world, cs *mcp.ClientSession, _ string) error {
			return cs.Ping(context.Background(), nil)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, "mcp:test/*")
			ctx := context.Background()
			child, err := w.srv.Clients(w.agent.Credential).Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: w.agent.Node.NodeId, Name: "rogue"}))
			if err != nil {
				t.Fatal(err)
			}
			self := child.Msg.Node.NodeId
			grant, err := w.admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{
				HolderNodeId: self, Scopes: []string{"mcp:test/*"}, Ttl: durationpb.New(time.Hour),
			}))
			if err != nil {
				t.Fatal(err)
			}
			var cs *mcp.ClientSession
			if tc.stdio {
				cs = serveStdioAgent(t, w.gw, grant.Msg.Token).cs
			} else {
				client := mcp.NewClient(&mcp.Implementation{Name: "rogue", Version: "1"}, nil)
				hc := &http.Client{Transport: bearer{token: func() string { return grant.Msg.Token }, next: http.DefaultTransport}}
				cs, err = client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: w.endpoint, HTTPClient: hc, DisableStandaloneSSE: true}, nil)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = cs.Close() })
			}

			// The rogue's session opens and ends; it claims its exit.
			rogue := w.srv.Clients(child.Msg.Credential)
			sctx, cancel := context.WithCancel(ctx)
			stream := rogue.Agent.Session(sctx)
			if err := stream.Send(&tetherv1.SessionRequest{Kind: &tetherv1.SessionRequest_Hello{Hello: &tetherv1.SessionHello{NodeId: self}}}); err != nil && !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			if resp, err := stream.Receive(); err != nil || resp.GetOpened() == nil {
				t.Fatalf("the rogue's session: %v %v", resp, err)
			}
			w.clk.Advance(time.Minute)
			_ = stream.CloseRequest()
			cancel()
			_ = stream.CloseResponse()
			testserver.WaitFor(t, guardWait, "the control plane to see the session end", func() bool {
				return nodeOf(t, w, self).SessionClosedAt != nil
			})
			w.clk.Advance(time.Minute)
			if _, err := rogue.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: self, Reason: "done"})); err != nil {
				t.Fatal(err)
			}
			w.clk.Advance(time.Minute)

			// Its grant still live, the gateway serves it.
			if err := tc.act(t, w, cs, grant.Msg.Token); err != nil {
				t.Fatalf("the rogue's request after its claim, its grant live: %v", err)
			}

			// Its parent's stop revokes its grant and writes the record.
			resp, err := w.admin.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
				NodeId: w.agent.Node.NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT, Reason: "test",
				DrainWindow: durationpb.New(0), CancelAckTimeout: durationpb.New(time.Minute), ConfirmTimeout: durationpb.New(time.Minute),
			}))
			if err != nil {
				t.Fatal(err)
			}
			term := resp.Msg.Termination
			waitState(t, w, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
			w.clk.Advance(2 * time.Minute)
			waitState(t, w, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
			var rn *tetherv1.RecordNode
			for _, n := range recordOf(t, w, term.TerminationId).Nodes {
				if n.NodeId == self {
					rn = n
				}
			}
			if rn == nil {
				t.Fatalf("node %s is not in the record", self)
			}
			if rn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED || !strings.Contains(rn.UnaccountedReason, "contradicts the confirmation") {
				t.Fatalf("record: %s confirmed by %q (claimed by %q, reason %q), want unaccounted (contradicts the confirmation): the gateway served the rogue after its claim",
					rn.Outcome, rn.ConfirmedBy, rn.ClaimedBy, rn.UnaccountedReason)
			}
		})
	}
}

// A rogue flooding the gateway with requests it serves cannot have it
// flood the control plane with its reports of them: a node's requests are
// reported at most mcpgate.SeenReportBurst at once and one per
// mcpgate.SeenReportInterval after that, on the gateway's clock, the
// requests past the bound waiting for one report together. (Fails if
// more reports are sent than the bound allows for the time the gateway's
// clock moved.)
func TestRogue30AServedFloodCostsTheControlPlaneOneReportPerNodePerInterval(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	ctx := context.Background()
	counter := &beginCounter{next: w.srv.HTTP.Transport}
	if counter.next == nil {
		counter.next = http.DefaultTransport
	}
	hc := *w.srv.HTTP
	hc.Transport = counter
	gclk := clock.NewManual(time.Now().UTC())
	gw, err := mcpgate.Open(ctx, mcpgate.OpenConfig{
		ControlPlane: w.srv.URL, Credential: w.srv.ToolServerToken(t, gateID), GateID: gateID, HTTP: &hc,
		Upstreams: []mcpgate.Upstream{{Name: "test", URL: w.upstream}}, Clock: gclk,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Close)
	a := serveStdioAgent(t, gw, w.grant.Token) // its opening is reported too
	// Concurrent pings share reports; one after another, each needs its own.
	const flood = 4 * mcpgate.SeenReportBurst
	answered := make(chan error, flood)
	for range mcpgate.SeenReportBurst {
		go func() { answered <- a.cs.Ping(ctx, nil) }()
	}
	go func() {
		for range flood - mcpgate.SeenReportBurst {
			err := a.cs.Ping(ctx, nil)
			answered <- err
			if err != nil {
				return
			}
		}
	}()
	got, advances := 0, 0
	for got < flood {
		testserver.WaitFor(t, guardWait, "a ping answered, or the next report armed on the gateway's clock", func() bool {
			return len(answered) > 0 || gclk.Armed(gclk.Now().Add(mcpgate.SeenReportInterval))
		})
		if len(answered) > 0 {
			if err := <-answered; err != nil {
				t.Fatalf("a ping: %v", err)
			}
			got++
			continue
		}
		gclk.Advance(mcpgate.SeenReportInterval)
		advances++
	}
	if n := counter.begins.Load(); n > int64(mcpgate.SeenReportBurst+advances) {
		t.Fatalf("%d reports for the session's opening and a flood of %d pings over %d intervals; want at most %d", n, flood, advances, mcpgate.SeenReportBurst+advances)
	}
}

// The gateway's report is the control plane's ledger.SeenTool: another
// name would be a tool call the control plane refuses for its scope,
// noting nothing.
func TestRogue30ASeenReportToolIsTheLedgers(t *testing.T) {
	if mcpgate.SeenReportTool != ledger.SeenTool {
		t.Fatalf("mcpgate.SeenReportTool is %q; the ledger's SeenTool is %q", mcpgate.SeenReportTool, ledger.SeenTool)
	}
}

// stalledOut is an agent's stdout it does not read: a write blocks until
// the gateway closes it (as a pipe's does), which is then reported on
// released.
type stalledOut struct {
	blocked  chan struct{}
	once     sync.Once
	closed   chan struct{}
	close1   sync.Once
	released chan struct{}
	hold     atomic.Bool
	w        io.WriteCloser
}

func newStalledOut(w io.WriteCloser) *stalledOut {
	return &stalledOut{blocked: make(chan struct{}), closed: make(chan struct{}), released: make(chan struct{}, 16), w: w}
}

func (s *stalledOut) Write(p []byte) (int, error) {
	if !s.hold.Load() {
		return s.w.Write(p)
	}
	s.once.Do(func() { close(s.blocked) })
	<-s.closed
	s.released <- struct{}{}
	return 0, io.ErrClosedPipe
}

func (s *stalledOut) Close() error {
	s.close1.Do(func() { close(s.closed) })
	return s.w.Close()
}

// An agent that stops reading its stdout cannot keep `tether mcp wrap`
// from shutting down, nor keep the gateway's goroutines blocked writing
// to it. At the end of ServeStdio's context (SIGTERM to the wrapper) the
// gateway closed the session, and the SDK's close waits for the requests
// in flight, one of which was writing an answer the agent did not take:
// ServeStdio never returned, and the wrapper and its upstream stayed; and
// where ServeStdio gave up on the close (a revoked agent's session), the
// write stayed blocked for as long as the process lived. ServeStdio now
// gives up on the close after stdioEndWait (the write-stall timeout, on
// the gateway's clock) and closes the agent's stdout, which ends the
// blocked write. (Fails, by its guard, if ServeStdio does not return or
// the write is not released.)
func TestRogue30AStdioAgentNotReadingCannotHoldTheWrappersShutdown(t *testing.T) {
	t.Run("SIGTERM", func(t *testing.T) { stdioNotReading(t, false) })
	t.Run("revoked", func(t *testing.T) { stdioNotReading(t, true) })
}

func stdioNotReading(t *testing.T, revoke bool) {
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
	out := newStalledOut(fromGateway)
	sctx, cancel := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- gw.ServeStdio(sctx, mcpgate.StaticToken(w.grant.Token), toGateway, out) }()
	t.Cleanup(func() {
		cancel()
		out.Close()
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
	out.hold.Store(true)
	send(`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
	recv(t, out.blocked, "the gateway to write an answer the agent does not read")

	t0 := gclk.Now()
	wait := mcpgate.DefaultWriteStallTimeout
	if !revoke {
		cancel() // the wrapper's SIGTERM
		testserver.WaitFor(t, guardWait, "the gateway to wait for the session's close", func() bool {
			return gclk.Armed(t0.Add(wait))
		})
		gclk.Advance(wait)
		recv(t, served, "ServeStdio to return at the end of its context")
		recv(t, out.released, "the write the agent did not take to end")
		return
	}
	// Revoked: the gateway waits for the answers in flight, then for the
	// close, each stdioEndWait, and gives up (as in rogue29b).
	revokeAndWaitOn(t, w, gw)
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
	recv(t, out.released, "the write the agent did not take to end")
}
