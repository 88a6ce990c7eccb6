package mcpgate_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
)

// jumpGuard bounds the waits below: a guard against a hang, not a timing.
const jumpGuard = 30 * time.Second

// waitArmed waits for armed (clock.Manual.JumpAsNextFuncArms).
func waitArmed(t *testing.T, armed <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-armed:
	case <-time.After(jumpGuard):
		t.Fatalf("the gateway never armed %s", what)
	}
}

// TestTrailingRefusalReportIsDueAtItsIntervalsEndWhenTheClockMovesAsItArms:
// the report of a node's refusals within an interval was armed for the
// time left until the interval's end as the gateway had read its clock,
// from what the clock read when it armed: a clock moved in between armed
// it late by the move, and the interval's end passed unreported. It is
// armed for the interval's end itself (clock.AfterFuncAt).
func TestTrailingRefusalReportIsDueAtItsIntervalsEndWhenTheClockMovesAsItArms(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	ctx := context.Background()
	counter := &beginCounter{next: w.srv.HTTP.Transport}
	if counter.next == nil {
		counter.next = http.DefaultTransport
	}
	hc := *w.srv.HTTP
	hc.Transport = counter
	t0 := time.Now().UTC()
	gclk := clock.NewManual(t0)
	gw, err := mcpgate.Open(ctx, mcpgate.OpenConfig{
		ControlPlane: w.srv.URL, Credential: w.srv.ToolServerToken(t, gateID), GateID: gateID, HTTP: &hc,
		Upstreams: []mcpgate.Upstream{{Name: "test", URL: w.upstream}}, Clock: gclk,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Close)
	// First, on a failure: what waits on the gateway's clock is released.
	t.Cleanup(func() { gclk.Advance(time.Hour) })
	endpoint := serveGateway(t, gw)
	revokeAndWaitOn(t, w, gw)
	refused := func(what string) {
		t.Helper()
		s := &rawSession{t: t, endpoint: endpoint, token: w.grant.Token}
		if resp, got := s.post(`{"jsonrpc":"2.0","id":9,"method":"ping"}`); resp.StatusCode != http.StatusForbidden || !strings.Contains(got, `"code":-32063`) {
			t.Fatalf("the revoked rogue's %s: %s %.300s; want refused (403, -32063)", what, resp.Status, got)
		}
	}
	refused("first request") // reported at t0, and answered once it landed
	if n := counter.begins.Load(); n != 1 {
		t.Fatalf("%d reports after the first refusal, want 1", n)
	}
	armed := gclk.JumpAsNextFuncArms(refusalJump)
	refused("request within the interval") // its report armed for t0 + the interval
	waitArmed(t, armed, "the trailing report")
	gclk.Set(t0.Add(mcpgate.RefusalReportInterval))
	testserver.WaitFor(t, jumpGuard, "the trailing report at the interval's end (armed late by the clock's move)", func() bool {
		return counter.begins.Load() >= 2
	})
}

// refusalJump is how far the clock moves as the trailing report is armed:
// less than the interval.
const refusalJump = mcpgate.RefusalReportInterval * 6 / 10

// TestSeenReportPastTheBurstIsDueWhenTheClockMovesAsItArms: the next seen
// report past a node's burst was armed for the time left until the bound
// allowed it as the gateway had read its clock, from what the clock read
// when it armed: a clock moved in between armed it late by the move, and
// the requests waiting for it waited on. It is armed for the moment the
// bound allows it (clock.AfterFuncAt).
func TestSeenReportPastTheBurstIsDueWhenTheClockMovesAsItArms(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	ctx := context.Background()
	t0 := time.Now().UTC()
	gclk := clock.NewManual(t0)
	gw, err := mcpgate.Open(ctx, mcpgate.OpenConfig{
		ControlPlane: w.srv.URL, Credential: w.srv.ToolServerToken(t, gateID), GateID: gateID, HTTP: w.srv.HTTP,
		Upstreams: []mcpgate.Upstream{{Name: "test", URL: w.upstream}}, Clock: gclk,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Close)
	a := serveStdioAgent(t, gw, w.grant.Token) // its opening is reported too
	// First, on a failure: the ping waiting on the gateway's clock is
	// released, so that the agent's and the gateway's ends do not wait.
	t.Cleanup(func() { gclk.Advance(time.Hour) })
	// The clock stays at t0: each ping needs its own report, and past the
	// burst the next may start once t0 + one interval.
	armed := gclk.JumpAsNextFuncArms(mcpgate.SeenReportInterval * 4 / 10)
	answered := make(chan error, 1)
	go func() {
		for {
			if err := a.cs.Ping(ctx, nil); err != nil {
				answered <- err
				return
			}
			select {
			case <-armed:
				answered <- nil
				return
			default:
			}
		}
	}()
	waitArmed(t, armed, "the report past the burst")
	gclk.Set(t0.Add(mcpgate.SeenReportInterval))
	select {
	case err := <-answered:
		if err != nil {
			t.Fatalf("a ping: %v", err)
		}
	case <-time.After(jumpGuard):
		t.Fatal("the ping past the burst was not served once the bound allowed its report (armed late by the clock's move)")
	}
}
