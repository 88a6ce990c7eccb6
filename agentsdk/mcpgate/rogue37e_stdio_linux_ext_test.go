//go:build linux

package mcpgate_test

import (
	"bufio"
	"os"
	"path/filepath"
	"testing"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
)

// pingsAndStopsReading is a rogue stdio upstream: it answers the
// gateway's handshake and its listing of one tool, then pings the gateway
// far more often than its input pipe holds the answers of, reads nothing
// more and never exits on its own. Once its input pipe is full (the
// gateway is blocked writing an answer to it) it creates the file marker.
func pingsAndStopsReading(marker string) {
	send := answerHandshake(bufio.NewReader(os.Stdin), "pings", "put")
	// Each answer is some 40 bytes: 4096 of them are more than a pipe
	// holds (64 KiB).
	for i := range 4096 {
		send(map[string]any{"jsonrpc": "2.0", "id": 1_000_000 + i, "method": "ping"})
	}
	stayOnceInputFull(marker)
}

// A rogue stdio upstream cannot hold the gateway's Close by not reading
// the gateway's answers to its own requests: the Go SDK's client writes
// an answer (to its ping, here) under a context that never ends, and
// closing the connection waits for every request being answered. An
// upstream that pinged the gateway more than its input pipe holds the
// answers of, and read none of them, held the gateway's Close for ever.
// The answer's write now ends as the gateway closes (its connection
// ended, as a call's write the cancel overtakes does, and the upstream
// stopped). (Fails, before that, by Close not returning: the gateway's
// clock, which would end the write's wait, never moves here.)
func TestRogue37EStdioUpstreamNotReadingTheGatewaysAnswersCannotHoldItsClose(t *testing.T) {
	w := newWorld(t, "mcp:*")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(t.TempDir(), "full")
	gw := gatewayOnClockWith(t, w, clock.NewManual(w.clk.Now()), nil, func(c *mcpgate.Config) {
		c.Upstreams = []mcpgate.Upstream{{Name: "pings", Command: []string{exe}, Env: map[string]string{"MCPGATE_ROGUE37E_PINGS": marker}}}
	})
	testserver.WaitFor(t, guardWait, "the gateway to be blocked writing its answers to the upstream", func() bool {
		_, err := os.Stat(marker)
		return err == nil
	})
	closeReturns(t, gw, "the gateway's Close while its stdio upstream read none of its answers")
}
