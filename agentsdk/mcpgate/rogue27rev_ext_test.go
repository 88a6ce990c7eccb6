package mcpgate_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The twenty-seventh rogue pass against the MCP gateway: the agent whose
// grant was revoked (or whose node was terminated, which revokes its
// grants), holding sessions it opened before.

// rawStream sends a request on s (a GET stream, or a POST whose answer is
// an event stream) and hands over its whole answer once the gateway ends
// it.
func rawStream(t *testing.T, s *rawSession, method, body string) <-chan string {
	t.Helper()
	out, _ := rawStreamOpened(t, s, method, body)
	return out
}

// rawStreamOpened is rawStream, and a channel closed once the answer's
// headers have arrived (a GET stream open at the SDK, its session's).
func rawStreamOpened(t *testing.T, s *rawSession, method, body string) (<-chan string, <-chan struct{}) {
	t.Helper()
	req, err := http.NewRequest(method, s.endpoint, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+s.token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", s.id)
	req.Header.Set("Mcp-Protocol-Version", rawVersion)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	out := make(chan string, 1)
	opened := make(chan struct{})
	go func() {
		// Its headers may come with its first event (a call's answer).
		resp, err := http.DefaultClient.Do(req.WithContext(ctx))
		close(opened)
		if err != nil {
			out <- "request failed: " + err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		out <- resp.Status + "\n" + string(b)
	}()
	return out, opened
}

// A revoked agent's sessions end with its grant, and their streams with
// them. The gateway's door refused every request of a revoked token, but
// the sessions it had opened stayed until they idled out (30 minutes by
// default): the session's GET stream and a long call's answer stream
// stayed open, and the sessions counted against the node, so that its
// other grant could open none. The gateway now follows its verifier's
// revocations and ends every session whose grant died: the GET stream
// ends, the call in flight is answered CodeDenied (the session ended),
// and its node's count of sessions goes down. The call itself goes on at
// the upstream, still open in the ledger — the rogue's revocation does
// not end it there — until the upstream answers. (Fails, by its guards, if
// a stream stays open, the node's other grant is refused a session, or the
// call is cancelled or ended in the ledger before the upstream answered.)
func TestRogue27ARevokedAgentsSessionsEndWithTheirStreams(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	other, err := w.admin.Capability.IssueRoot(context.Background(), connect.NewRequest(&tetherv1.IssueRootRequest{
		HolderNodeId: w.agent.Node.NodeId, Scopes: []string{"mcp:test/*"}, Ttl: durationpb.New(time.Hour),
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.events.Release("r") }) // a failed test's upstream call ends too
	rogue := openRaw(t, w.endpoint, w.grant.Token)
	listening := rawStream(t, rogue, http.MethodGet, "")
	calling := rawStream(t, rogue, http.MethodPost, `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"slow","arguments":{"id":"r"}}}`)
	recv(t, w.events.Started("r"), "the rogue's slow call to start upstream")
	for range mcpgate.DefaultMaxSessionsPerNode - 1 {
		openRaw(t, w.endpoint, w.grant.Token)
	}
	if resp, body := (&rawSession{t: t, endpoint: w.endpoint, token: other.Msg.Token}).post(initialize); !strings.Contains(body, `"code":-32067`) {
		t.Fatalf("a session of the node's other grant with the node at its maximum: %s %.300s; want refused (-32067)", resp.Status, body)
	}

	if _, err := w.admin.Capability.Revoke(context.Background(), connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_GrantId{GrantId: w.grant.Grant.GrantId}, Reason: "rogue"})); err != nil {
		t.Fatal(err)
	}

	if got := recv(t, listening, "the revoked session's GET stream to end"); !strings.HasPrefix(got, "200 OK\n") {
		t.Errorf("the revoked session's GET stream: %.300s; want a stream (200) that ended", got)
	}
	if got := recv(t, calling, "the revoked session's call to be answered"); !strings.Contains(got, `"code":-32063`) || !strings.Contains(got, "ended this session") || !strings.Contains(got, "revoked") {
		t.Errorf("the answer to the call in flight on the revoked session: %.500s; want -32063 saying the session ended, its grant revoked", got)
	}
	testserver.WaitFor(t, guardWait, "the node's other grant to open a session", func() bool {
		resp, body := (&rawSession{t: t, endpoint: w.endpoint, token: other.Msg.Token}).post(initialize)
		if resp.StatusCode == http.StatusOK && resp.Header.Get("Mcp-Session-Id") != "" {
			return true
		}
		if !strings.Contains(body, `"code":-32067`) {
			t.Fatalf("a session of the node's other grant: %s %.300s", resp.Status, body)
		}
		return false
	})

	// The call was not cancelled, nor ended in the ledger, by the
	// session's end: it is the upstream's to answer.
	select {
	case <-w.events.Cancelled("r"):
		t.Fatal("the upstream saw the call cancelled when its session ended")
	default:
	}
	calls, err := w.admin.Tool.ListCalls(context.Background(), connect.NewRequest(&tetherv1.ListCallsRequest{NodeId: w.agent.Node.NodeId}))
	if err != nil {
		t.Fatal(err)
	}
	if len(calls.Msg.Calls) != 1 || calls.Msg.Calls[0].Tool != "test/slow" {
		t.Fatalf("the ledger's open calls of the node after its session ended: %v; want the slow call, still open", calls.Msg.Calls)
	}
	w.events.Release("r")
	testserver.WaitFor(t, guardWait, "the call to end in the ledger once the upstream answered", func() bool {
		calls, err := w.admin.Tool.ListCalls(context.Background(), connect.NewRequest(&tetherv1.ListCallsRequest{NodeId: w.agent.Node.NodeId}))
		if err != nil {
			t.Fatal(err)
		}
		return len(calls.Msg.Calls) == 0
	})
}

// initialize is an MCP initialize request's body.
const initialize = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"` + rawVersion + `","capabilities":{},"clientInfo":{"name":"rogue","version":"1"}}}`

// A terminated agent's session ends with its node: the termination
// revokes the node's grants, and the gateway ends the sessions they
// opened, the session's GET stream with them. It stayed open (every
// request on the session refused) until the session idled out. (Fails,
// by its guard, if the stream stays open.)
func TestRogue27ATerminatedAgentsSessionEndsWithItsNode(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	rogue := openRaw(t, w.endpoint, w.grant.Token)
	listening := rawStream(t, rogue, http.MethodGet, "")
	// Abort with nothing in flight: the subtree's grants are revoked once
	// no acknowledgement is pending.
	term := terminate(t, w, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Hour)
	waitState(t, w, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	if got := recv(t, listening, "the terminated agent's GET stream to end"); !strings.HasPrefix(got, "200 OK\n") {
		t.Errorf("the terminated agent's GET stream: %.300s; want a stream (200) that ended", got)
	}
	if resp, body := rogue.post(`{"jsonrpc":"2.0","id":9,"method":"ping"}`); resp.StatusCode != http.StatusForbidden && resp.StatusCode != http.StatusNotFound {
		t.Errorf("a ping on the terminated agent's session: %s %.300s; want it refused", resp.Status, body)
	}
}

// A rogue revoking grants in a loop cannot have the gateway read all its
// sessions without pause. Each revocation the gateway's verifier applies
// asks for a pass over every session the gateway holds (to end those of
// the revoked grant), and a rogue can revoke the grants it delegates as
// fast as its budget allows, two requests each: passes now start
// RevocationScanInterval apart at the least, on the gateway's clock, the
// revocations within it making one pass at its end. (Fails, by its guard,
// if the gateway does not wait for the interval before its next pass.)
func TestRogue27RevocationsInALoopCannotHaveTheGatewayReadItsSessionsWithoutPause(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	second, err := w.admin.Capability.IssueRoot(context.Background(), connect.NewRequest(&tetherv1.IssueRootRequest{
		HolderNodeId: w.agent.Node.NodeId, Scopes: []string{"mcp:test/*"}, Ttl: durationpb.New(time.Hour),
	}))
	if err != nil {
		t.Fatal(err)
	}
	gclk := clock.NewManual(time.Now().UTC())
	start := gclk.Now()
	gw, err := mcpgate.Open(context.Background(), mcpgate.OpenConfig{
		ControlPlane: w.srv.URL, Credential: w.srv.ToolServerToken(t, gateID), GateID: gateID, HTTP: w.srv.HTTP,
		Upstreams: []mcpgate.Upstream{{Name: "test", URL: w.upstream}}, Clock: gclk,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Close)
	endpoint := serveGateway(t, gw)
	first, firstOpen := rawStreamOpened(t, openRaw(t, endpoint, w.grant.Token), http.MethodGet, "")
	next, nextOpen := rawStreamOpened(t, openRaw(t, endpoint, second.Msg.Token), http.MethodGet, "")
	// Both streams open before the revocations: one still on its way
	// (its report awaited) when its session ended was answered 404.
	recv(t, firstOpen, "the first session's GET stream to open")
	recv(t, nextOpen, "the second session's GET stream to open")
	revoke := func(grant string) {
		t.Helper()
		if _, err := w.admin.Capability.Revoke(context.Background(), connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_GrantId{GrantId: grant}, Reason: "rogue"})); err != nil {
			t.Fatal(err)
		}
	}

	// The first revocation: a pass at once.
	revoke(w.grant.Grant.GrantId)
	recv(t, first, "the first revoked session's GET stream to end")
	// The next, within the interval: its pass waits for the interval's end.
	revoke(second.Msg.Grant.GrantId)
	testserver.WaitFor(t, guardWait, "the gateway to wait for the interval before its next pass", func() bool {
		return gclk.Armed(start.Add(mcpgate.RevocationScanInterval))
	})
	select {
	case got := <-next:
		t.Fatalf("the second revoked session ended within the interval of the first pass: %.300s", got)
	default:
	}
	gclk.Advance(mcpgate.RevocationScanInterval)
	if got := recv(t, next, "the second revoked session's GET stream to end"); !strings.HasPrefix(got, "200 OK\n") {
		t.Errorf("the second revoked session's GET stream: %.300s; want a stream (200) that ended", got)
	}
}
