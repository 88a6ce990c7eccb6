package mcpgate_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The thirty-second rogue pass against the MCP gateway (helper D): the
// agent being stopped, behind `tether mcp wrap` or the HTTP endpoint.

// rogueChild is a child of w's agent with a grant of ttl for mcp:test/*:
// the rogue, so that its parent's stop writes its record.
func rogueChild(t *testing.T, w *world, ttl time.Duration) (self string, credential, token string) {
	t.Helper()
	ctx := context.Background()
	child, err := w.srv.Clients(w.agent.Credential).Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: w.agent.Node.NodeId, Name: "rogue"}))
	if err != nil {
		t.Fatal(err)
	}
	grant, err := w.admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{
		HolderNodeId: child.Msg.Node.NodeId, Scopes: []string{"mcp:test/*"}, Ttl: durationpb.New(ttl),
	}))
	if err != nil {
		t.Fatal(err)
	}
	return child.Msg.Node.NodeId, child.Msg.Credential, grant.Msg.Token
}

// revokeAtGateway revokes the grant of token (the rogue's) and waits
// until gw's verifier refuses it as revoked.
func revokeAtGateway(t *testing.T, w *world, gw *mcpgate.Gateway, token string) {
	t.Helper()
	ctx := context.Background()
	claims, err := gw.Verifier().Identify(ctx, token)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.admin.Capability.Revoke(ctx, connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_GrantId{GrantId: claims.GrantID}, Reason: "rogue"})); err != nil {
		t.Fatal(err)
	}
	testserver.WaitFor(t, guardWait, "the revocation to reach the gateway", func() bool {
		_, err := gw.Verifier().Verify(ctx, token)
		return errors.Is(err, capability.ErrGrantRevoked)
	})
}

// claimAfterSessionEnd opens and ends the rogue's session, then has it
// claim its exit, the control plane's clock moved between each.
func claimAfterSessionEnd(t *testing.T, w *world, self, credential string) {
	t.Helper()
	ctx := context.Background()
	rogue := w.srv.Clients(credential)
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
}

// gatewayOnClock is a gateway in front of w's upstream whose verifier, as
// its own waits, runs on clk (Open's verifier reads the wall clock), its
// feed's staleness budget a day: clk may move hours.
// Its requests to the control plane go through hc (nil: the test
// server's client).
func gatewayOnClock(t *testing.T, w *world, clk *clock.Manual, hc *http.Client) *mcpgate.Gateway {
	t.Helper()
	return gatewayOnClockWith(t, w, clk, hc, nil)
}

// gatewayOnClockWith is gatewayOnClock with its Config changed by set
// (nil: none).
func gatewayOnClockWith(t *testing.T, w *world, clk *clock.Manual, hc *http.Client, set func(*mcpgate.Config)) *mcpgate.Gateway {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	if hc == nil {
		hc = w.srv.HTTP
	}
	conn := agentsdk.Dial(w.srv.URL, w.srv.ToolServerToken(t, gateID), agentsdk.WithHTTPClient(hc))
	verifier, err := agentsdk.NewVerifier(agentsdk.VerifierConfig{Conn: conn, Clock: clk, StalenessBudget: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan struct{})
	go func() { defer close(ran); _ = verifier.Run(ctx) }()
	gate := agentsdk.NewToolGate(conn, gateID)
	recv(t, verifier.Ready(), "the gateway's verifier to hear the revocation feed")
	recv(t, gate.Ready(), "the gateway's gate to follow its cancel orders")
	cfg := mcpgate.Config{Upstreams: []mcpgate.Upstream{{Name: "test", URL: w.upstream}}, Gate: gate, Verifier: verifier, Clock: clk}
	if set != nil {
		set(&cfg)
	}
	gw, err := mcpgate.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		gw.Close()
		gate.Close()
		cancel()
		<-ran
	})
	return gw
}

// recordOfRogue stops w's agent (the rogue's parent) and returns the
// rogue's node in the record.
func recordOfRogue(t *testing.T, w *world, self string) *tetherv1.RecordNode {
	t.Helper()
	resp, err := w.admin.Supervisor.Terminate(context.Background(), connect.NewRequest(&tetherv1.TerminateRequest{
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
	for _, n := range recordOf(t, w, term.TerminationId).Nodes {
		if n.NodeId == self {
			return n
		}
	}
	t.Fatalf("node %s is not in the record", self)
	return nil
}

// A rogue that claimed its exit and outlived its token (no one renews a
// claimed node's) cannot go on being answered by the gateway unseen. Over
// stdio a token that no longer identified its holder (expired, no earlier
// one verifying) had ping, initialize and notifications served, and over
// HTTP the bearer's 401: neither reported, and the record read the rogue's
// exit confirmed. The gateway now reports such a request, with the
// expired token, as the node seen (a token that verifies but for its
// expiry names its holder: agentsdk.Verifier.Holder), and the control
// plane keeps it as the dead credential at work. (Fails if the record
// reads the rogue's exit confirmed.)
func TestRogue32DAnsweredAfterItsTokenExpiredIsLifeAfterItsClaim(t *testing.T) {
	for _, tc := range []struct {
		name string
		act  func(t *testing.T, w *world, gw *mcpgate.Gateway, live, token string)
	}{
		{"ping over stdio", nil},
		{"initialize over stdio", func(t *testing.T, _ *world, gw *mcpgate.Gateway, _, token string) {
			a := serveRawStdio(t, gw, mcpgate.StaticToken(token))
			a.send(t, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"rogue","version":"1"}}}`)
			if line := a.read(t); !strings.Contains(line, `"id":1`) {
				t.Fatalf("initialize with an expired token: %s", line)
			}
		}},
		{"401 over HTTP", func(t *testing.T, _ *world, gw *mcpgate.Gateway, _, token string) {
			endpoint := serveGateway(t, gw)
			var code int
			testserver.WaitFor(t, guardWait, "the gateway to hear the revocation feed on its clock moved", func() bool {
				code = pingStatus(t, endpoint, token)
				return code != http.StatusServiceUnavailable
			})
			if code != http.StatusUnauthorized {
				t.Fatalf("an expired bearer: %d; want 401", code)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, "mcp:test/*")
			self, credential, token := rogueChild(t, w, 10*time.Minute)
			gclk := clock.NewManual(w.clk.Now())
			gw := gatewayOnClock(t, w, gclk, nil)
			var a *stdioAgent
			if tc.act == nil {
				a = serveStdioAgent(t, gw, token) // its session opened while the token lives
			}
			claimAfterSessionEnd(t, w, self, credential)
			// The token expires; no one renews a claimed node's.
			w.clk.Advance(time.Hour)
			gclk.Advance(time.Hour)

			if tc.act == nil {
				if err := a.cs.Ping(context.Background(), nil); err != nil {
					t.Fatalf("the rogue's ping with an expired token: %v", err)
				}
			} else {
				tc.act(t, w, gw, "", token)
			}

			rn := recordOfRogue(t, w, self)
			if rn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED || !strings.Contains(rn.UnaccountedReason, "contradicts the confirmation") {
				t.Fatalf("record: %s confirmed by %q (claimed by %q, reason %q), want unaccounted (contradicts the confirmation): the gateway answered the rogue after its claim, its token expired",
					rn.Outcome, rn.ConfirmedBy, rn.ClaimedBy, rn.UnaccountedReason)
			}
		})
	}
}

// A revoked agent behind `tether mcp wrap` cannot keep its stdio session
// by outliving its token. The session was judged by the last token that
// identified its holder, and an expired one identified no one: once the
// token expired (no one renewing it), the grant's revocation was never
// found, the session stayed and the agent's pings were answered. An
// expired token still names its holder, whose grant is judged: the
// session ends as the revocation arrives (or the agent's next request is
// refused as revoked). (Fails if the ping is answered, or, by its guard,
// if ServeStdio does not return.)
func TestRogue32DStdioSessionOutlivingItsTokenEndsOnItsRevocation(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	gclk := clock.NewManual(w.clk.Now())
	gw := gatewayOnClock(t, w, gclk, nil)
	a := serveStdioAgent(t, gw, w.grant.Token)
	ctx := context.Background()
	if err := a.cs.Ping(ctx, nil); err != nil {
		t.Fatal(err)
	}
	gclk.Advance(2 * time.Hour) // the token (an hour's) expired to the gateway
	if _, err := w.admin.Capability.Revoke(ctx, connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_GrantId{GrantId: w.grant.Grant.GrantId}, Reason: "rogue"})); err != nil {
		t.Fatal(err)
	}
	testserver.WaitFor(t, guardWait, "the revocation to reach the gateway", func() bool {
		claims, _ := gw.Verifier().Holder(ctx, w.grant.Token)
		return claims.HolderNodeID != "" && gw.Verifier().Revoked(claims) != nil
	})
	// Refused, or its session already ended as the revocation arrived.
	if err := a.cs.Ping(ctx, nil); err == nil {
		t.Fatal("the revoked agent's ping, its token expired, was answered")
	}
	if err := recv(t, a.served, "ServeStdio to return: the revoked agent's stdio session ended"); !errors.Is(err, capability.ErrGrantRevoked) {
		t.Fatalf("ServeStdio returned %v; want the revocation", err)
	}
}

// gatewayLosingBegins is a gateway on a manual clock of its own whose
// requests to the control plane pass lost (lost.down drops them).
func gatewayLosingBegins(t *testing.T, w *world) (*mcpgate.Gateway, *clock.Manual, *lostBegins) {
	t.Helper()
	lost := &lostBegins{next: w.srv.HTTP.Transport}
	if lost.next == nil {
		lost.next = http.DefaultTransport
	}
	hc := *w.srv.HTTP
	hc.Transport = lost
	gclk := clock.NewManual(w.clk.Now())
	return gatewayOnClock(t, w, gclk, &hc), gclk, lost
}

// lostBegins fails the gateway's BeginCall requests to the control plane
// while down is set (the control plane unreachable to them, as a spent
// budget or an outage would have them refused), passing the rest.
type lostBegins struct {
	down atomic.Bool
	next http.RoundTripper
}

func (l *lostBegins) RoundTrip(r *http.Request) (*http.Response, error) {
	if l.down.Load() && strings.HasSuffix(r.URL.Path, "/BeginCall") {
		return nil, errors.New("lostBegins: the control plane is unreachable")
	}
	return l.next.RoundTrip(r)
}

// A rogue cannot have its requests after its claim of exit go unseen by
// having the gateway's reports of them fail. A report that did not land
// (the control plane unreachable, a budget spent, its answer late, or not
// sent past the reports in flight) was logged at debug and forgotten: the
// request was served, and nothing ever told the control plane. Now the
// node's report is owed, and sent again (mcpgate.SeenReportRetry after, on
// the gateway's clock, doubling while it fails) until it lands, which the
// control plane keeps as the node at work after its claim, a
// contradiction. The same for a refused request's report (its grant
// revoked), owed as the node seen. (Fails, by its guard, if no retry is
// armed, or if the contradiction is never noted.)
func TestRogue32DReportThatDidNotLandIsOwedUntilItDoes(t *testing.T) {
	for _, tc := range []struct {
		name string
		act  func(t *testing.T, w *world, gw *mcpgate.Gateway, a *stdioAgent, token string)
	}{
		{"ping over stdio", func(t *testing.T, _ *world, _ *mcpgate.Gateway, a *stdioAgent, _ string) {
			if err := a.cs.Ping(context.Background(), nil); err != nil {
				t.Fatalf("the rogue's ping after its claim: %v", err)
			}
		}},
		{"refused over HTTP, revoked", func(t *testing.T, w *world, gw *mcpgate.Gateway, _ *stdioAgent, token string) {
			claims, err := gw.Verifier().Identify(context.Background(), token)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := w.admin.Capability.Revoke(context.Background(), connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_GrantId{GrantId: claims.GrantID}, Reason: "rogue"})); err != nil {
				t.Fatal(err)
			}
			testserver.WaitFor(t, guardWait, "the revocation to reach the gateway", func() bool {
				_, err := gw.Verifier().Verify(context.Background(), token)
				return errors.Is(err, capability.ErrGrantRevoked)
			})
			endpoint := serveGateway(t, gw)
			req, err := http.NewRequest(http.MethodPost, endpoint, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer "+token)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusForbidden {
				t.Fatalf("the revoked rogue's ping: %d; want 403", resp.StatusCode)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, "mcp:test/*")
			self, credential, token := rogueChild(t, w, time.Hour)
			gw, gclk, lost := gatewayLosingBegins(t, w)
			var a *stdioAgent
			if strings.Contains(tc.name, "stdio") {
				a = serveStdioAgent(t, gw, token)
			}
			claimAfterSessionEnd(t, w, self, credential)

			lost.down.Store(true)
			tc.act(t, w, gw, a, token)
			retry := gclk.Now().Add(mcpgate.SeenReportRetry)
			testserver.WaitFor(t, guardWait, "the gateway to arm the owed report's retry", func() bool {
				return gclk.Armed(retry)
			})
			if n := nodeOf(t, w, self); len(n.Contradictions) != 0 {
				t.Fatalf("contradictions with the report lost: %v", n.Contradictions)
			}
			lost.down.Store(false)
			gclk.Set(retry)
			testserver.WaitFor(t, guardWait, "the owed report to land: the rogue at work after its claim", func() bool {
				return len(nodeOf(t, w, self).Contradictions) > 0
			})
		})
	}
}

// A rogue that claimed its exit cannot be answered unseen by going past
// its connections. A request on one connection more than the node may
// hold was refused (429, CodeTooManyConnections) before any report: the
// gateway knew the node (the bearer had named it) but told the control
// plane nothing, so a rogue holding its connections from before its claim
// was answered, on each new one, unseen. The refusal is now reported as
// the node seen before it is answered. (Fails, by its guard, if the
// control plane never notes the rogue at work after its claim.)
func TestRogue32DRefusedPastItsConnectionsAfterItsClaimIsLifeAfterIt(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	self, credential, token := rogueChild(t, w, time.Hour)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + ln.Addr().String()
	srv := w.gw.HTTPServer(mcpgate.HTTPOptions{BaseURL: base, MaxConnsPerNode: 1})
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	ping := func(c net.Conn) int {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, base+mcpgate.EndpointPath, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		_ = c.SetDeadline(time.Now().Add(guardWait)) // a guard against a hang, not a timing
		if err := req.Write(c); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	dial := func() net.Conn {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	held := dial()
	if code := ping(held); code != http.StatusOK {
		t.Fatalf("the rogue's ping before its claim: %d", code)
	}
	claimAfterSessionEnd(t, w, self, credential)
	if n := nodeOf(t, w, self); len(n.Contradictions) != 0 {
		t.Fatalf("contradictions before the rogue's request after its claim: %v", n.Contradictions)
	}
	if code := ping(dial()); code != http.StatusTooManyRequests {
		t.Fatalf("the rogue's ping on a connection past its maximum: %d; want 429", code)
	}
	testserver.WaitFor(t, guardWait, "the control plane to note the rogue at work after its claim", func() bool {
		return len(nodeOf(t, w, self).Contradictions) > 0
	})
}

// Likewise a request refused for the node's body bytes (429,
// CodeTooManyBodyBytes): the bearer had named the node, and the refusal
// told the control plane nothing. It is now reported as the node seen
// before it is answered. (Fails, by its guard, if the control plane never
// notes the rogue at work after its claim.)
func TestRogue32DRefusedPastItsBodyBytesAfterItsClaimIsLifeAfterIt(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	self, credential, token := rogueChild(t, w, time.Hour)
	endpoint := serveGatewayWith(t, w.gw, mcpgate.HTTPOptions{MaxBodyBytesPerNode: 1024})
	claimAfterSessionEnd(t, w, self, credential)
	body := `{"jsonrpc":"2.0","id":1,"method":"ping","params":{"_meta":{"pad":"` + strings.Repeat("x", 4096) + `"}}}`
	req, err := http.NewRequest(http.MethodPost, endpoint, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("the rogue's ping past its body bytes: %d; want 429", resp.StatusCode)
	}
	testserver.WaitFor(t, guardWait, "the control plane to note the rogue at work after its claim", func() bool {
		return len(nodeOf(t, w, self).Contradictions) > 0
	})
}
