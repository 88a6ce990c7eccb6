package mcpgate_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// reportHold holds the gateway's BeginCall requests to the control plane
// until release is closed.
type reportHold struct {
	next    http.RoundTripper
	held    atomic.Int64
	release chan struct{}
	once    sync.Once
}

func (h *reportHold) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.HasSuffix(r.URL.Path, "/BeginCall") {
		h.held.Add(1)
		select {
		case <-h.release:
		case <-r.Context().Done():
			return nil, r.Context().Err()
		}
	}
	return h.next.RoundTrip(r)
}

func (h *reportHold) let() { h.once.Do(func() { close(h.release) }) }

// A rogue cannot have its exit claim outrun the report of its refused
// request. The gateway reported a refusal in the background and answered
// at once, so a rogue that ended its session, made one request after its
// revocation and claimed its exit as soon as the refusal came back had its
// claim reach the control plane before the report, and, its record written
// in between, read confirmed. The refusal that starts a node's report now
// waits for it (mcpgate.RefusalReportWait at the most, on the gateway's
// clock; one report per node per interval, at most 32 in flight, so a
// flood stalls no more than that): when the agent reads its refusal, the
// control plane has seen it. (Fails if the refusal is answered while its
// report is held, or if the node is not seen after its session's end by
// the time the refusal is answered.)
func TestRogue29BRefusalIsAnsweredOnlyOnceItsReportHasLanded(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	ctx := context.Background()
	self := w.agent.Node.NodeId
	hold := &reportHold{next: w.srv.HTTP.Transport, release: make(chan struct{})}
	if hold.next == nil {
		hold.next = http.DefaultTransport
	}
	hc := *w.srv.HTTP
	hc.Transport = hold
	gclk := clock.NewManual(time.Now().UTC())
	start := gclk.Now()
	gw, err := mcpgate.Open(ctx, mcpgate.OpenConfig{
		ControlPlane: w.srv.URL, Credential: w.srv.ToolServerToken(t, gateID), GateID: gateID, HTTP: &hc,
		Upstreams: []mcpgate.Upstream{{Name: "test", URL: w.upstream}}, Clock: gclk,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Close)
	t.Cleanup(hold.let) // (runs first)
	endpoint := serveGateway(t, gw)
	endSession(t, w, self)
	revokeAndWaitOn(t, w, gw)

	type answer struct {
		status int
		body   string
		err    error
	}
	answers := make(chan answer, 1)
	var answered atomic.Bool
	go func() {
		req, _ := http.NewRequest(http.MethodPost, endpoint, strings.NewReader(`{"jsonrpc":"2.0","id":9,"method":"ping"}`))
		req.Header.Set("Authorization", "Bearer "+w.grant.Token)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err := http.DefaultClient.Do(req)
		var a answer
		if err == nil {
			b, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			a = answer{status: resp.StatusCode, body: string(b), err: rerr}
		} else {
			a.err = err
		}
		answered.Store(true)
		answers <- a
	}()
	testserver.WaitFor(t, guardWait, "the refusal to be answered, or to wait for its report", func() bool {
		return answered.Load() || gclk.Armed(start.Add(mcpgate.RefusalReportWait))
	})
	seen := func() bool {
		n := nodeOf(t, w, self)
		return n.LastSeenAt != nil && n.LastSeenAt.AsTime().After(n.SessionClosedAt.AsTime())
	}
	if answered.Load() {
		a := <-answers
		t.Fatalf("the rogue's refusal was answered (%d %.200s, %v) with its report to the control plane still held (%d held; node seen after its session's end: %v): a claim sent now reaches the control plane first",
			a.status, a.body, a.err, hold.held.Load(), seen())
	}
	hold.let()
	a := recv(t, answers, "the refusal")
	if a.err != nil || a.status != http.StatusForbidden || !strings.Contains(a.body, `"code":-32063`) {
		t.Fatalf("the rogue's ping after its revocation: %d %.300s %v; want it refused (403, -32063)", a.status, a.body, a.err)
	}
	if !seen() {
		t.Fatal("the rogue read its refusal before the control plane saw it after its session's end")
	}
}

// A rogue cannot hide its refused requests after its session's end in the
// interval of a report made before that end. One report per node per
// mcpgate.RefusalReportInterval, the refusals within it unreported: a
// rogue whose grant was revoked while its session was open made one
// request (reported, while the session was open: nothing to note), ended
// its session, and went on within the interval, none of it reported, so
// that a claim of exit would read corroborated by the end. The refusals
// within the interval are now reported by one report at its end. (Fails,
// by its guard, if the control plane does not see the node after its
// session's end once the interval is over.)
func TestRogue29BRefusalsWithinTheIntervalAreReportedAtItsEnd(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	ctx := context.Background()
	self := w.agent.Node.NodeId
	gclk := clock.NewManual(time.Now().UTC())
	gw, err := mcpgate.Open(ctx, mcpgate.OpenConfig{
		ControlPlane: w.srv.URL, Credential: w.srv.ToolServerToken(t, gateID), GateID: gateID, HTTP: w.srv.HTTP,
		Upstreams: []mcpgate.Upstream{{Name: "test", URL: w.upstream}}, Clock: gclk,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Close)
	endpoint := serveGateway(t, gw)
	refused := func(what string) {
		t.Helper()
		s := &rawSession{t: t, endpoint: endpoint, token: w.grant.Token}
		if resp, got := s.post(`{"jsonrpc":"2.0","id":9,"method":"ping"}`); resp.StatusCode != http.StatusForbidden || !strings.Contains(got, `"code":-32063`) {
			t.Fatalf("the revoked rogue's %s: %s %.300s; want refused (403, -32063)", what, resp.Status, got)
		}
	}

	// Its session opens; its grant is revoked; one refused request.
	sctx, cancel := context.WithCancel(ctx)
	stream := w.srv.Clients(w.agent.Credential).Agent.Session(sctx)
	if err := stream.Send(&tetherv1.SessionRequest{Kind: &tetherv1.SessionRequest_Hello{Hello: &tetherv1.SessionHello{NodeId: self}}}); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	if resp, err := stream.Receive(); err != nil || resp.GetOpened() == nil {
		t.Fatalf("the rogue's session: %v %v", resp, err)
	}
	revokeAndWaitOn(t, w, gw)
	refused("request with its session open")

	// Its session ends; another refused request, within the interval.
	w.clk.Advance(time.Minute)
	_ = stream.CloseRequest()
	cancel()
	_ = stream.CloseResponse()
	testserver.WaitFor(t, guardWait, "the control plane to see the session end", func() bool {
		return nodeOf(t, w, self).SessionClosedAt != nil
	})
	w.clk.Advance(time.Minute)
	refused("request after its session's end")

	gclk.Advance(mcpgate.RefusalReportInterval)
	testserver.WaitFor(t, guardWait, "the control plane to see the rogue at work after its session's end", func() bool {
		n := nodeOf(t, w, self)
		return n.LastSeenAt != nil && n.LastSeenAt.AsTime().After(n.SessionClosedAt.AsTime())
	})
}
