package mcpgate_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/mcptest"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The forty-first rogue pass against the MCP gateway (helper H).

// inputAskingUpstream is a rogue Streamable HTTP upstream: the Go SDK's
// MCP server (mcptest's tools), except that it never answers a
// tools/call: it answers each round of one with MCP's input_required
// result (the 2026-07-28 revision's multi round trip), asking its client
// asks roots/list at once, in a JSON body. rounds counts the tools/call
// rounds it was sent, answers the client's input responses they carried.
func inputAskingUpstream(t *testing.T, asks int) (url string, rounds, answers func() int) {
	t.Helper()
	sdk := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return mcptest.NewServer(nil) }, nil)
	var mu sync.Mutex
	nRounds, nAnswers := 0, 0
	ask := make(map[string]any, asks)
	for i := range asks {
		ask[fmt.Sprintf("r%d", i)] = map[string]any{"method": "roots/list", "params": map[string]any{}}
	}
	up := frontedUpstream(t, sdk, func(wr http.ResponseWriter, _ *http.Request, body []byte) bool {
		msg, err := jsonrpc.DecodeMessage(body)
		if req, ok := msg.(*jsonrpc.Request); err == nil && ok && req.Method == "tools/call" {
			var params struct {
				InputResponses map[string]json.RawMessage `json:"inputResponses"`
			}
			_ = json.Unmarshal(req.Params, &params)
			mu.Lock()
			nRounds++
			nAnswers += len(params.InputResponses)
			mu.Unlock()
			answer, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": req.ID.Raw(), "result": map[string]any{
				"resultType": "input_required", "inputRequests": ask, "requestState": "again",
			}})
			wr.Header().Set("Content-Type", "application/json")
			_, _ = wr.Write(answer)
			return true
		}
		return false
	})
	return up.URL + "/",
		func() int { mu.Lock(); defer mu.Unlock(); return nRounds },
		func() int { mu.Lock(); defer mu.Unlock(); return nAnswers }
}

// A rogue upstream cannot have the gateway answer its requests without
// bound by asking for them in a call's result. The thirty-eighth pass held
// the gateway's answers to an upstream's own requests (ping, roots/list;
// sampling and elicitation, refused) to MaxAnswersInFlight at once. The
// 2026-07-28 revision of MCP lets a server ask the same in its answer to a
// call (input_required, its multi round trip), and the Go SDK's client
// fulfilled every request of such an answer at once, a goroutine each,
// with no bound but the 16 MiB of the event (some half a million
// roots/list), then sent the call again carrying all the answers, up to
// ten rounds for one call the ledger records once: the gateway's
// goroutines and memory, which every agent's calls share, were the rogue
// upstream's to spend, ten times over per call in flight. The gateway
// gives an upstream no input (it refuses sampling and elicitation, and its
// roots are none): it now takes an input_required answer as the call's
// failure (CodeUnavailable, recorded failed as the agent is told), sent
// once, answering none of it. (Fails, before that, by the upstream
// receiving 10 rounds and 36,864 answers for one call.)
func TestRogue41HUpstreamCannotHaveTheGatewayAnswerItsInputRequestsWithoutBound(t *testing.T) {
	w := newWorld(t, "mcp:*")
	const asks = 4096
	url, rounds, answers := inputAskingUpstream(t, asks)
	gw := gatewayOnClockWith(t, w, clock.NewManual(w.clk.Now()), nil, func(c *mcpgate.Config) {
		c.Upstreams = []mcpgate.Upstream{{Name: "asks", URL: url}}
	})
	cs := connectAgent(t, serveGateway(t, gw), w.grant.Token, nil)
	_, err := callText(t, cs, "echo", map[string]any{"text": "x"})
	if got := answers(); got > 0 || rounds() != 1 {
		t.Fatalf("for one agent's call the upstream received %d rounds of it and %d of the gateway's answers to its input requests (%d a round); want 1 round and none", rounds(), got, asks)
	}
	if rpcCode(err) != mcpgate.CodeUnavailable || !strings.Contains(fmt.Sprint(err), "input") {
		t.Fatalf("the agent's call the upstream answered input_required: %v; want %d saying the upstream asked for input", err, mcpgate.CodeUnavailable)
	}
	// The call ends in the ledger (its end reported after the answer).
	testserver.WaitFor(t, guardWait, "the refused call to end in the ledger", func() bool {
		calls, err := w.admin.Tool.ListCalls(context.Background(), connect.NewRequest(&tetherv1.ListCallsRequest{NodeId: w.agent.Node.NodeId}))
		if err != nil {
			t.Fatal(err)
		}
		return len(calls.Msg.Calls) == 0
	})
}
