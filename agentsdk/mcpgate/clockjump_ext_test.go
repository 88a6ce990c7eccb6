package mcpgate_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
)

// armJump is a gateway's manual clock that, once set, moves forward by
// step as the gateway arms its next timed function (AfterFunc or
// AfterFuncAt), once: a test's Advance landing between the gateway's
// reading of the clock and its arming. armed is closed once it has.
type armJump struct {
	*clock.Manual
	mu    sync.Mutex
	step  time.Duration
	armed chan struct{}
}

func newArmJump(start time.Time) *armJump {
	return &armJump{Manual: clock.NewManual(start), armed: make(chan struct{})}
}

func (j *armJump) jumpNext(step time.Duration) {
	j.mu.Lock()
	j.step = step
	j.mu.Unlock()
}

// arm jumps (the first time after jumpNext), then arms.
func (j *armJump) arm(do func() clock.Timer) clock.Timer {
	j.mu.Lock()
	step := j.step
	j.step = 0
	j.mu.Unlock()
	if step == 0 {
		return do()
	}
	j.Manual.Advance(step)
	t := do()
	close(j.armed)
	return t
}

func (j *armJump) AfterFunc(d time.Duration, f func()) clock.Timer {
	return j.arm(func() clock.Timer { return j.Manual.AfterFunc(d, f) })
}

func (j *armJump) AfterFuncAt(at time.Time, f func()) clock.Timer {
	return j.arm(func() clock.Timer { return j.Manual.AfterFuncAt(at, f) })
}

// jumpGuard bounds the waits below: a guard against a hang, not a timing.
const jumpGuard = 30 * time.Second

func (j *armJump) waitArmed(t *testing.T, what string) {
	t.Helper()
	select {
	case <-j.armed:
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
	gclk := newArmJump(t0)
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
	gclk.jumpNext(refusalJump)
	refused("request within the interval") // its report armed for t0 + the interval
	gclk.waitArmed(t, "the trailing report")
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
	gclk := newArmJump(t0)
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
	gclk.jumpNext(mcpgate.SeenReportInterval * 4 / 10)
	answered := make(chan error, 1)
	go func() {
		for {
			if err := a.cs.Ping(ctx, nil); err != nil {
				answered <- err
				return
			}
			select {
			case <-gclk.armed:
				answered <- nil
				return
			default:
			}
		}
	}()
	gclk.waitArmed(t, "the report past the burst")
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
