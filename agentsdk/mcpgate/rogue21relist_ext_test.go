package mcpgate_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
)

// A hostile upstream cannot have the gateway relist its tools without
// end. The gateway relisted an upstream's tools whenever it said they
// changed (one listing at a time, and one more if told again meanwhile):
// an upstream saying so with each answer to tools/list had the gateway
// list them back to back for as long as it liked, each listing a round trip
// and a rebuild of the tool set under the lock every agent's call takes.
// A listing now starts RelistInterval (on the gateway's clock) after the
// last one started, at the earliest: however often the upstream says it,
// the gateway lists once an interval.
func TestAHostileUpstreamCannotHaveTheGatewayRelistWithoutEnd(t *testing.T) {
	w := newWorld(t, "mcp:*")
	var mu sync.Mutex
	lists := 0
	listed := func() int { mu.Lock(); defer mu.Unlock(); return lists }
	hostile := scriptedUpstream(t, "hostile", func(method, id string) []string {
		switch method {
		case "tools/list":
			mu.Lock()
			lists++
			mu.Unlock()
			return []string{listChanged, rpcResult(id, `{"tools":[{"name":"tool","inputSchema":{"type":"object"}}]}`)}
		case "tools/call":
			return []string{rpcResult(id, `{"content":[{"type":"text","text":"done"}]}`)}
		}
		return nil
	}, nil)
	gclk := clock.NewManual(time.Now().UTC())
	start := gclk.Now()
	gw, err := mcpgate.Open(context.Background(), mcpgate.OpenConfig{
		ControlPlane: w.srv.URL, Credential: w.srv.ToolServerToken(t, gateID), GateID: gateID, HTTP: w.srv.HTTP,
		Upstreams: []mcpgate.Upstream{{Name: "hostile", URL: hostile.URL}}, Clock: gclk,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Close)
	cs := connectAgent(t, serveGateway(t, gw), w.grant.Token, nil)
	for i := 1; i <= 3; i++ {
		next := start.Add(time.Duration(i) * mcpgate.RelistInterval)
		testserver.WaitFor(t, guardWait, "the gateway to wait for its next relisting", func() bool { return gclk.Armed(next) || listed() > 10 })
		if n := listed(); n != i {
			t.Fatalf("told its tools changed with each listing, the gateway listed them %d times in %d intervals; want %d", n, i-1, i)
		}
		if got, err := callText(t, cs, "tool", map[string]any{}); err != nil || got != "done" {
			t.Fatalf("the agent's call meanwhile: %q, %v", got, err)
		}
		gclk.Advance(mcpgate.RelistInterval)
	}
}
