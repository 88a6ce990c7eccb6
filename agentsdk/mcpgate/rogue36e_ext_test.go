package mcpgate_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
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
	// A session the SDK does not know: its handler answers it itself
	// (404), before the gateway's MCP server.
	status, answer := answerPastTheDoorAsCloseBegins(t, "Mcp-Session-Id: rogue-picked-session\r\nMcp-Protocol-Version: 2025-06-18\r\n", `{"jsonrpc":"2.0","id":7,"method":"ping"}`)
	if status != http.StatusServiceUnavailable || !strings.Contains(answer, fmt.Sprint(mcpgate.CodeUnavailable)) || !strings.Contains(answer, `"id":7`) {
		t.Fatalf("the rogue's request past the door of a closing gateway: %d %s, want it refused (503, %d, under its id), not answered by the SDK unreported", status, answer, mcpgate.CodeUnavailable)
	}
}
