package mcpgate_test

import (
	"context"
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
