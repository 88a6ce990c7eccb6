package mcpgate_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The thirty-fourth rogue pass against the MCP gateway (helper C).

// A rogue that claimed its exit cannot have its request go unseen because
// the gateway shut down while the request's report was owed. A report
// that did not land (the control plane out of reach for a moment, the
// rogue's lineage's budget spent) is owed and sent again after
// SeenReportRetry, the wait doubling to SeenReportRetryMax while it fails;
// a gateway shut down (restarted, drained) within that wait only logged
// the debt, though the control plane was back: the record read the
// rogue's exit confirmed. Close now sends each report owed (or due) once
// more before it returns. (Fails if, once Close has returned, the control
// plane has not noted the rogue at work after its claim.)
func TestRogue34COwedReportIsSentOnceMoreAsTheGatewayShutsDown(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	self, credential, token := rogueChild(t, w, time.Hour)
	gw, _, lost := gatewayLosingBegins(t, w)
	endpoint := serveGateway(t, gw)
	claimAfterSessionEnd(t, w, self, credential)

	// The rogue's ping after its claim, its report lost (and owed).
	lost.down.Store(true)
	if got := pingStatus(t, endpoint, token); got == http.StatusServiceUnavailable {
		t.Fatalf("the rogue's ping: %d, refused", got)
	}
	// The control plane back; the retry not yet due on the gateway's
	// clock, which stands: the gateway shuts down meanwhile.
	lost.down.Store(false)
	if got := nodeOf(t, w, self).Contradictions; len(got) > 0 {
		t.Fatalf("the rogue's lost report noted already: %v", got)
	}
	gw.Close()
	if got := nodeOf(t, w, self).Contradictions; len(got) == 0 {
		t.Fatal("the gateway shut down with the rogue's report after its claim owed, the control plane reachable, and never sent it: the record reads its exit confirmed")
	}
}

// A rogue whose grant was revoked cannot have its refusals after its claim
// go unreported by knocking within its refusal report's interval as the
// gateway shuts down. A node's refusals within RefusalReportInterval of
// its last report make one report at the interval's end; a gateway shut
// down before that end stopped the report and dropped it: the rogue,
// refused once before its claim (reported then) and again after it, read
// exited confirmed. Such a report is now owed as the node seen at Close,
// and sent once more before Close returns. (Fails if, once Close has
// returned, the control plane has not noted the rogue at work after its
// claim.)
func TestRogue34CRefusalWithinItsIntervalIsReportedAsTheGatewayShutsDown(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	self, credential, token := rogueChild(t, w, time.Hour)
	gclk := clock.NewManual(w.clk.Now())
	gw := gatewayOnClock(t, w, gclk, nil)
	endpoint := serveGateway(t, gw)

	revokeAtGateway(t, w, gw, token)
	// Refused before its claim: reported (at work before its claim, no
	// contradiction).
	if got := pingStatus(t, endpoint, token); got != http.StatusForbidden {
		t.Fatalf("the revoked rogue's ping: %d; want 403", got)
	}
	claimAfterSessionEnd(t, w, self, credential)
	if got := nodeOf(t, w, self).Contradictions; len(got) > 0 {
		t.Fatalf("a contradiction before the rogue's request after its claim: %v", got)
	}
	// Refused after its claim, within its report's interval on the
	// gateway's clock (which stands): its report waits for the interval's
	// end, and the gateway shuts down first.
	if got := pingStatus(t, endpoint, token); got != http.StatusForbidden {
		t.Fatalf("the revoked rogue's ping after its claim: %d; want 403", got)
	}
	gw.Close()
	if got := nodeOf(t, w, self).Contradictions; len(got) == 0 {
		t.Fatal("the gateway shut down with the rogue's refusal after its claim waiting for its interval's end, and never reported it: the record reads its exit confirmed")
	}
}

// A rogue that claimed its exit cannot have its tool call answered unseen
// because the call's begin did not reach the control plane. The gateway
// marks a tools/call told as it sends its BeginCall: a begin that did not
// land (the control plane out of reach, its answer past the gate's
// timeout) was answered -32066 and reported nowhere, though the gateway
// had served the rogue's token after its claim, as it serves a ping, whose
// report is owed until it lands. The call's node is now owed as seen, and
// reported once the control plane is back. (Fails if no report is owed as
// the call is answered, or if the control plane never notes the rogue at
// work after its claim.)
func TestRogue34CCallWhoseBeginDidNotLandIsOwedAsTheNodeSeen(t *testing.T) {
	for _, stdio := range []bool{false, true} {
		name := "HTTP"
		if stdio {
			name = "stdio"
		}
		t.Run(name, func(t *testing.T) {
			w := newWorld(t, "mcp:test/*")
			self, credential, token := rogueChild(t, w, time.Hour)
			gw, gclk, lost := gatewayLosingBegins(t, w)
			var cs *mcp.ClientSession
			if stdio {
				cs = serveStdioAgent(t, gw, token).cs
			} else {
				cs = connectAgent(t, serveGateway(t, gw), token, nil)
			}
			claimAfterSessionEnd(t, w, self, credential)

			lost.down.Store(true)
			_, err := callText(t, cs, "echo", map[string]any{"text": "after my claim"})
			if rpcCode(err) != mcpgate.CodeUnavailable {
				t.Fatalf("the rogue's call with its begin lost: %v; want %d", err, mcpgate.CodeUnavailable)
			}
			retry := gclk.Now().Add(mcpgate.SeenReportRetry)
			if !gclk.Armed(retry) {
				t.Fatal("the rogue's call was answered with its begin lost, and no report of the node is owed")
			}
			lost.down.Store(false)
			gclk.Set(retry)
			testserver.WaitFor(t, guardWait, "the owed report to land: the rogue at work after its claim", func() bool {
				return len(nodeOf(t, w, self).Contradictions) > 0
			})
		})
	}
}

// openStream opens s's GET stream and returns once its headers came (the
// gateway serving it), the stream held open until the test ends.
func openStream(t *testing.T, s *rawSession) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, s.endpoint, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+s.token)
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", s.id)
	req.Header.Set("Mcp-Protocol-Version", rawVersion)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET stream: %s", resp.Status)
	}
}

// A lineage's GET streams do not hold its places in the gateway's seen
// reports, and a rogue cannot have its lineage's other nodes refused with
// its children's streams. The gateway keeps the report state of at most
// a quarter of maxSeenNodes (1024) nodes of one lineage, each held while
// an HTTP request of its is in the gateway, and refuses (503) a node it
// has no room for. A GET stream, which every MCP client opens for its
// session's life, held its node's place for as long: a lineage of more
// than 1024 connected agents had its next node refused every request,
// and a rogue whose children each held a stream had its ancestors' and
// siblings' new nodes refused. A GET stream is reported at its opening
// only, and now lets go of its node's state once that report is done.
// (Fails if the lineage's third node is refused while its first two, with
// the bound at 8 and the lineage's share at 2, hold a stream each.)
func TestRogue34CLineagesStreamsDoNotHoldItsPlaces(t *testing.T) {
	defer mcpgate.SetMaxSeenNodesForTest(8)()
	w := newWorld(t, "mcp:test/*")
	gclk := clock.NewManual(w.clk.Now())
	gw := gatewayOnClock(t, w, gclk, nil)
	endpoint := serveGateway(t, gw)
	ctx := context.Background()
	parent := w.srv.Clients(w.agent.Credential)
	for i := range 2 {
		child, err := parent.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: w.agent.Node.NodeId, Name: fmt.Sprintf("worker-%d", i)}))
		if err != nil {
			t.Fatal(err)
		}
		grant, err := parent.Capability.Delegate(ctx, connect.NewRequest(&tetherv1.DelegateRequest{
			ParentGrantId: w.grant.Grant.GrantId, HolderNodeId: child.Msg.Node.NodeId, Scopes: []string{"mcp:test/*"}, Ttl: durationpb.New(30 * time.Minute),
		}))
		if err != nil {
			t.Fatal(err)
		}
		openStream(t, openRaw(t, endpoint, grant.Msg.Token))
	}
	// Their reports' bound over, on the gateway's clock: only their
	// streams could hold their places.
	gclk.Advance(time.Minute)
	if got := pingStatus(t, endpoint, w.grant.Token); got == http.StatusServiceUnavailable {
		t.Fatalf("the lineage's third node, its first two holding a GET stream each: %d, refused", got)
	}
}

// A lineage's tool calls in flight do not hold its places in the
// gateway's seen reports once begun (the ledger sees them; nothing of
// them is reported as the node seen): held for the call's life, a
// lineage's long calls took its places as its streams did, and a rogue's
// children each holding a slow call had the lineage's other nodes refused
// 503. (Fails if the lineage's third node is refused while its first two,
// with the bound at 8 and the lineage's share at 2, have a call in flight
// each.)
func TestRogue34CLineagesCallsInFlightDoNotHoldItsPlaces(t *testing.T) {
	defer mcpgate.SetMaxSeenNodesForTest(8)()
	w := newWorld(t, "mcp:test/*")
	gclk := clock.NewManual(w.clk.Now())
	gw := gatewayOnClock(t, w, gclk, nil)
	endpoint := serveGateway(t, gw)
	ctx := context.Background()
	parent := w.srv.Clients(w.agent.Credential)
	var calls []<-chan string
	for i := range 2 {
		child, err := parent.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: w.agent.Node.NodeId, Name: fmt.Sprintf("worker-%d", i)}))
		if err != nil {
			t.Fatal(err)
		}
		grant, err := parent.Capability.Delegate(ctx, connect.NewRequest(&tetherv1.DelegateRequest{
			ParentGrantId: w.grant.Grant.GrantId, HolderNodeId: child.Msg.Node.NodeId, Scopes: []string{"mcp:test/*"}, Ttl: durationpb.New(30 * time.Minute),
		}))
		if err != nil {
			t.Fatal(err)
		}
		cs := connectAgent(t, endpoint, grant.Msg.Token, &mcp.ClientOptions{})
		calls = append(calls, slowCall(t, cs, w.events, "slow", fmt.Sprintf("slow-%d", i)))
	}
	gclk.Advance(time.Minute)
	if got := pingStatus(t, endpoint, w.grant.Token); got == http.StatusServiceUnavailable {
		t.Fatalf("the lineage's third node, its first two with a call in flight each: %d, refused", got)
	}
	for i, c := range calls {
		w.events.Release(fmt.Sprintf("slow-%d", i))
		if got := recv(t, c, "the slow call's answer"); strings.HasPrefix(got, "error") {
			t.Errorf("slow call %d: %s", i, got)
		}
	}
}

// A rogue that claimed its exit cannot be served unseen by a gateway that
// was closed while its handler is still served (an embedder closing the
// gateway before its HTTP server, or serving the handler on). Close ended
// the gateway's reports to the control plane, yet the agents' sessions it
// had opened answered ping and tools/list on, unreported. A closed
// gateway now refuses every request, 503 and CodeUnavailable. (Fails if
// the rogue's ping on its session after Close is answered.)
func TestRogue34CClosedGatewayServesNothing(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	self, credential, token := rogueChild(t, w, time.Hour)
	gclk := clock.NewManual(w.clk.Now())
	gw := gatewayOnClock(t, w, gclk, nil)
	s := openRaw(t, serveGateway(t, gw), token)
	claimAfterSessionEnd(t, w, self, credential)
	gw.Close()
	for _, req := range []string{`{"jsonrpc":"2.0","id":7,"method":"ping"}`, `{"jsonrpc":"2.0","id":8,"method":"tools/list"}`} {
		if resp, body := s.post(req); resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, fmt.Sprint(mcpgate.CodeUnavailable)) {
			t.Errorf("the rogue's %s after the gateway closed: %s %.200s; want 503 and %d", req, resp.Status, body, mcpgate.CodeUnavailable)
		}
	}
}

// The same over stdio: a gateway closed while ServeStdio runs (an
// embedder's Close before the context ends) kept serving the agent's
// session, its pings answered, unreported. ServeStdio now ends the
// session as the gateway closes, and returns. (Fails, by its guard, if
// ServeStdio does not return, or if the rogue's ping after Close is
// answered.)
func TestRogue34CClosedGatewayEndsItsStdioSession(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	self, credential, token := rogueChild(t, w, time.Hour)
	gclk := clock.NewManual(w.clk.Now())
	gw := gatewayOnClock(t, w, gclk, nil)
	a := serveStdioAgent(t, gw, token)
	claimAfterSessionEnd(t, w, self, credential)
	gw.Close()
	recv(t, a.served, "ServeStdio to return: the gateway closed")
	if err := a.cs.Ping(context.Background(), nil); err == nil {
		t.Fatal("the rogue's ping on its stdio session after the gateway closed was answered")
	}
}
