package mcpgate_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
)

// A rogue that claimed its exit cannot have the MCP SDK answer it, unseen,
// from a gateway closing under its request. Since the thirty-fifth pass a
// request that reaches the gateway's MCP server once the gateway is closed
// is refused; but what the SDK's HTTP handler answers itself, before the
// gateway's server (a request of a session it does not know, a GET
// stream, a body it cannot read), was still answered then, its report not
// sent (the reports were over): a rogue that held its body back until the
// gateway was closing was answered by it, unseen. A request past the door
// is now refused (CodeUnavailable) before the SDK's handler too. (Fails if
// the rogue's request is answered by the SDK: its 404, "session not
// found".)
func TestRogue36ERequestTheSDKAnswersItselfPastTheDoorAsCloseBeginsIsNotServed(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	self, credential, token := rogueChild(t, w, time.Hour)
	gw := gatewayOnClock(t, w, clock.NewManual(w.clk.Now()), nil)
	endpoint := serveGateway(t, gw)
	claimAfterSessionEnd(t, w, self, credential)

	u, err := url.Parse(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// A session the SDK does not know: its handler answers it itself
	// (404), before the gateway's MCP server.
	body := `{"jsonrpc":"2.0","id":7,"method":"ping"}`
	head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMcp-Session-Id: rogue-picked-session\r\nMcp-Protocol-Version: 2025-06-18\r\nContent-Length: %d\r\n\r\n", u.Path, u.Host, token, len(body))
	half := len(body) / 2
	if _, err := io.WriteString(conn, head+body[:half]); err != nil {
		t.Fatal(err)
	}
	// Past the door: the gateway reads the rest of its body.
	testserver.WaitFor(t, guardWait, "the gateway to read the rogue's body", func() bool {
		return gw.BodyBytesHeldForTest(self) > 0
	})
	gw.Close()
	if _, err := io.WriteString(conn, body[half:]); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	answer, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(answer), fmt.Sprint(mcpgate.CodeUnavailable)) || !strings.Contains(string(answer), `"id":7`) {
		t.Fatalf("the rogue's request past the door of a closing gateway: %d %s, want it refused (503, %d, under its id), not answered by the SDK unreported", resp.StatusCode, answer, mcpgate.CodeUnavailable)
	}
}
