//go:build linux

package mcpgate_test

import (
	"bufio"
	"context"
	"os"
	"testing"
	"time"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
)

// exitsOnceListed is a rogue stdio upstream: it leaves a file in dir,
// answers the gateway's handshake and its listing of one tool, then
// exits.
func exitsOnceListed(dir string) {
	f, err := os.CreateTemp(dir, "run")
	if err != nil {
		os.Exit(2)
	}
	_ = f.Close()
	answerHandshake(bufio.NewReader(os.Stdin), "exits", "tool")
	os.Exit(0)
}

// A rogue stdio upstream cannot have the gateway start it again and again
// without pause. The gateway reconnected an upstream whose connection
// ended at once, and backed off only after attempts that failed: an
// upstream that exits as soon as it has answered the gateway's listing
// (or an HTTP one that ends its connection then) was started, and its
// tools listed, as fast as it could start. A connection that ends soon
// after it was made (within MaxReconnectBackoff, on the gateway's clock)
// is now made again only after the backoff, doubling each time.
func TestARogueUpstreamExitingOnceListedIsNotRestartedWithoutPause(t *testing.T) {
	w := newWorld(t, "mcp:exits/*")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	runs := t.TempDir()
	started := func() int {
		es, _ := os.ReadDir(runs)
		return len(es)
	}
	gclk := clock.NewManual(time.Now().UTC())
	start := gclk.Now()
	gw, err := mcpgate.Open(context.Background(), mcpgate.OpenConfig{
		ControlPlane: w.srv.URL, Credential: w.srv.ToolServerToken(t, gateID), GateID: gateID, HTTP: w.srv.HTTP,
		Upstreams: []mcpgate.Upstream{{Name: "exits", Command: []string{exe}, Env: map[string]string{"MCPGATE_ROGUE21_EXITS": runs}}}, Clock: gclk,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Close)
	// Once at Open, once again at once (its first connection's end), then
	// after 50 ms, 100 ms more, 200 ms more.
	next, backoff := start, mcpgate.MinReconnectBackoff
	for runs := 2; runs <= 4; runs++ {
		next = next.Add(backoff)
		testserver.WaitFor(t, guardWait, "the gateway to wait before starting the upstream again", func() bool { return gclk.Armed(next) || started() > 10 })
		if n := started(); n != runs {
			t.Fatalf("an upstream exiting once listed was started %d times; want %d before the clock passes %s", n, runs, next.Sub(start))
		}
		gclk.Set(next)
		backoff *= 2
	}
}
