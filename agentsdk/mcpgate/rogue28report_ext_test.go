package mcpgate_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
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

// The twenty-eighth rogue pass against the MCP gateway: what the control
// plane learns of the requests the gateway refuses at its door.

// A rogue that reaches its tools only through the gateway cannot claim its
// exit and go on calling them. Any request of a node's credential after
// its session's end is the control plane seeing it alive after that end (a
// call refused with the grant its stop revoked included), so that its
// bare claim of exit is not confirmed on the strength of the end. But the
// gateway refuses a revoked (or terminated) node's requests at its door,
// offline, from its verifier's tombstones, without asking the control
// plane: the rogue child ended its session, and under its parent's stop
// sent tool calls through the gateway (before its claim of exit, or after
// it), each refused, none seen by the control plane, and the record read
// its exit CONFIRMED by the control plane — the record the rogue's own evidence.
// The gateway now reports a refused node's request to the control plane
// (a BeginCall with the refused token, which the control plane refuses
// and notes), at most once per node per mcpgate.RefusalReportInterval,
// without holding the refusal up: the claim reads unaccounted (the calls
// after the claim contradict it). (Fails, by
// its guard, if the control plane does not see the node after its
// session's end, and on the record.)
func TestRogue28ARefusedAtTheGatewaysDoorAfterItsSessionsEndIsLifeAfterIt(t *testing.T) {
	for _, tc := range []struct {
		name       string
		claimFirst bool   // it claims its exit before its calls
		reason     string // the record's reason its claim is unaccounted
	}{
		{"calls, then its claim", false, "after its session ended"},
		{"its claim, then calls", true, "contradicts the confirmation"},
	} {
		t.Run(tc.name, func(t *testing.T) { rogueRefusedAfterItsEnd(t, tc.claimFirst, tc.reason) })
	}
}

func rogueRefusedAfterItsEnd(t *testing.T, claimFirst bool, reason string) {
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
	rogue := w.srv.Clients(child.Msg.Credential)
	// The rogue's MCP session opens no GET stream: the gateway ends the
	// session as the revocation arrives, and the SDK's client would take
	// the stream's refused reopening as its connection's end, leaving it no
	// calls to send.
	client := mcp.NewClient(&mcp.Implementation{Name: "rogue", Version: "1"}, nil)
	hc := &http.Client{Transport: bearer{token: func() string { return grant.Msg.Token }, next: http.DefaultTransport}}
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: w.endpoint, HTTPClient: hc, DisableStandaloneSSE: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	if _, err := callText(t, cs, "echo", map[string]any{"text": "before"}); err != nil {
		t.Fatalf("a call before the end: %v", err)
	}

	// The rogue's session opens and ends.
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

	// Its parent's stop revokes its grant; the gateway hears of it.
	resp, err := w.admin.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: w.agent.Node.NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT, Reason: "test",
		DrainWindow: durationpb.New(0), CancelAckTimeout: durationpb.New(time.Minute), ConfirmTimeout: durationpb.New(time.Minute),
	}))
	if err != nil {
		t.Fatal(err)
	}
	term := resp.Msg.Termination
	waitState(t, w, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	testserver.WaitFor(t, guardWait, "the revocation to reach the gateway", func() bool {
		_, err := w.gw.Verifier().Verify(ctx, grant.Msg.Token)
		return errors.Is(err, capability.ErrGrantRevoked)
	})

	// It goes on calling its tools through the gateway, and claims its exit.
	claim := func() {
		t.Helper()
		if _, err := rogue.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: self, Reason: "done"})); err != nil {
			t.Fatal(err)
		}
	}
	if claimFirst {
		claim()
	}
	for i := range 5 {
		if _, err := callText(t, cs, "echo", map[string]any{"text": "after"}); rpcCode(err) != mcpgate.CodeDenied || !strings.Contains(err.Error(), "revoked") {
			t.Fatalf("the rogue's call #%d after its stop: %v; want it refused (%d, revoked)", i+1, err, mcpgate.CodeDenied)
		}
	}
	testserver.WaitFor(t, guardWait, "the control plane to see the rogue at work after its session's end", func() bool {
		n := nodeOf(t, w, self)
		return n.LastSeenAt != nil && n.LastSeenAt.AsTime().After(n.SessionClosedAt.AsTime())
	})
	if !claimFirst {
		claim()
	}

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
	if rn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED || rn.ClaimedBy == "" || !strings.Contains(rn.UnaccountedReason, reason) {
		t.Fatalf("record: %s confirmed by %q (claimed by %q, reason %q), want unaccounted (%s): the rogue's token was at work at the gateway after its session ended",
			rn.Outcome, rn.ConfirmedBy, rn.ClaimedBy, rn.UnaccountedReason, reason)
	}
}

func nodeOf(t *testing.T, w *world, id string) *tetherv1.Node {
	t.Helper()
	resp, err := w.admin.Agent.GetNode(context.Background(), connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: id}))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg.Node
}

// beginCounter counts the BeginCall requests a gateway sends the control
// plane.
type beginCounter struct {
	next   http.RoundTripper
	begins atomic.Int64
}

func (c *beginCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.HasSuffix(r.URL.Path, "/BeginCall") {
		c.begins.Add(1)
	}
	return c.next.RoundTrip(r)
}

// A revoked rogue flooding the gateway's door cannot have it flood the
// control plane with its reports: each node's refused requests are
// reported at most once per mcpgate.RefusalReportInterval, on the
// gateway's clock, whatever their number and kind (those after the
// interval's report by one report at its end), and another node's have
// their own. (Fails if a refused request is not reported, or if more
// than one report is sent per node within the interval.)
func TestRogue28ARefusedFloodCostsTheControlPlaneOneReportPerNodePerInterval(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	ctx := context.Background()
	other, err := w.admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "other"}))
	if err != nil {
		t.Fatal(err)
	}
	otherGrant, err := w.admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{
		HolderNodeId: other.Msg.Node.NodeId, Scopes: []string{"mcp:test/*"}, Ttl: durationpb.New(time.Hour),
	}))
	if err != nil {
		t.Fatal(err)
	}
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
	closed := false
	t.Cleanup(func() {
		if !closed {
			gw.Close()
		}
	})
	endpoint := serveGateway(t, gw)
	for _, grant := range []string{w.grant.Grant.GrantId, otherGrant.Msg.Grant.GrantId} {
		if _, err := w.admin.Capability.Revoke(ctx, connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_GrantId{GrantId: grant}, Reason: "rogue"})); err != nil {
			t.Fatal(err)
		}
	}
	testserver.WaitFor(t, guardWait, "the revocations to reach the gateway", func() bool {
		_, a := gw.Verifier().Verify(ctx, w.grant.Token)
		_, b := gw.Verifier().Verify(ctx, otherGrant.Msg.Token)
		return errors.Is(a, capability.ErrGrantRevoked) && errors.Is(b, capability.ErrGrantRevoked)
	})
	flood := func(token string) {
		t.Helper()
		s := &rawSession{t: t, endpoint: endpoint, token: token}
		for i := range 20 {
			body := []string{
				`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`,
				`{"jsonrpc":"2.0","id":8,"method":"tools/list"}`,
				`{"jsonrpc":"2.0","id":9,"method":"ping"}`,
				initialize,
			}[i%4]
			if resp, got := s.post(body); resp.StatusCode != http.StatusForbidden || !strings.Contains(got, `"code":-32063`) {
				t.Fatalf("the revoked rogue's request #%d: %s %.300s; want refused (403, -32063)", i+1, resp.Status, got)
			}
		}
	}
	waitBegins := func(n int64, what string) {
		t.Helper()
		testserver.WaitFor(t, guardWait, what, func() bool { return counter.begins.Load() >= n })
	}

	flood(w.grant.Token)
	waitBegins(1, "the first refused request to be reported")
	flood(w.grant.Token)
	flood(otherGrant.Msg.Token)
	waitBegins(2, "the other node's first refused request to be reported")
	// Since the twenty-ninth pass the refusals within an interval are
	// reported by one report at its end (rogue29b test).
	gclk.Advance(mcpgate.RefusalReportInterval)
	waitBegins(4, "each node's refusals within the interval to be reported at its end")
	flood(w.grant.Token)
	gclk.Advance(mcpgate.RefusalReportInterval)
	waitBegins(5, "the refusals within the next interval to be reported at its end")
	gw.Close() // waits for the reports it started
	closed = true
	if got := counter.begins.Load(); got != 5 {
		t.Fatalf("the gateway sent %d reports (BeginCall) for 80 refused requests of two nodes, 60 of one, over two intervals; want 5: one per node per interval, and one at the end of each interval with refusals after its report", got)
	}
}

// The same rogue behind `tether mcp wrap` (the gateway on its stdio): its
// tool calls and listings refused after its grant's revocation are
// reported to the control plane as the door's refusals are, each kind on
// its own, and the control plane sees the node at work after its
// session's end. (Fails, by its guard, if a refused call or listing over
// stdio is not reported.)
func TestRogue28AStdioRefusalsAreReportedToo(t *testing.T) {
	for _, kind := range []string{"call", "listing"} {
		t.Run(kind, func(t *testing.T) {
			w := newWorld(t, "mcp:test/*")
			ctx := context.Background()
			self := w.agent.Node.NodeId
			// The gateway's pass over its sessions is held, so that the
			// rogue's request finds the revocation (the pass would end its
			// stdio session first, and nothing of the rogue reach the
			// gateway).
			gw := gatewayWithHeldScan(t, w)
			cs := serveStdioAgent(t, gw, w.grant.Token).cs
			// The client's notification that it is initialized is the
			// node seen, reported as it is read; a ping, answered once a
			// report begun after it arrived has landed, settles that
			// report before the session: landing after the session's end
			// it was the node seen then, and the rogue's refusal, later,
			// not the first sign of life after the end to be noted (under
			// load, 1 run in about 10 timed out so).
			if err := cs.Ping(ctx, nil); err != nil {
				t.Fatal(err)
			}
			var err error

			// Its session at the control plane opens and ends.
			rogue := w.srv.Clients(w.agent.Credential)
			stctx, stcancel := context.WithCancel(ctx)
			stream := rogue.Agent.Session(stctx)
			if err := stream.Send(&tetherv1.SessionRequest{Kind: &tetherv1.SessionRequest_Hello{Hello: &tetherv1.SessionHello{NodeId: self}}}); err != nil && !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			if resp, err := stream.Receive(); err != nil || resp.GetOpened() == nil {
				t.Fatalf("the rogue's session: %v %v", resp, err)
			}
			w.clk.Advance(time.Minute)
			_ = stream.CloseRequest()
			stcancel()
			_ = stream.CloseResponse()
			testserver.WaitFor(t, guardWait, "the control plane to see the session end", func() bool {
				return nodeOf(t, w, self).SessionClosedAt != nil
			})
			w.clk.Advance(time.Minute)
			revokeAndWaitOn(t, w, gw)

			switch kind {
			case "call":
				_, err = callText(t, cs, "echo", map[string]any{"text": "after"})
			case "listing":
				_, err = cs.ListTools(ctx, nil)
			}
			if rpcCode(err) != mcpgate.CodeDenied || !strings.Contains(err.Error(), "revoked") {
				t.Fatalf("the rogue's %s after its revocation: %v; want it refused (%d, revoked)", kind, err, mcpgate.CodeDenied)
			}
			testserver.WaitFor(t, guardWait, "the control plane to see the rogue at work after its session's end", func() bool {
				n := nodeOf(t, w, self)
				return n.LastSeenAt != nil && n.LastSeenAt.AsTime().After(n.SessionClosedAt.AsTime())
			})
		})
	}
}
