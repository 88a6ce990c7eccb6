package mcpgate_test

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/internal/mcptest"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The seventeenth rogue pass against the gateway.

// A call the upstream's transport failed leaves neither the upstream's key
// nor the gateway's session there in the ledger. The agent was told only
// that the upstream was unavailable (rogue10), but the gateway reported
// the call's end with the Go SDK client's own error text — the request's
// URL, with the key a hosted MCP server takes in its query — and the
// ledger keeps a failed call's error in the termination's record, which
// every viewer reads (and the console shows): an agent whose call drew
// such a failure while it was being stopped wrote the gateway's key into
// the record. The gateway now reports the failure in the words the agent
// gets, naming the upstream only; its log has the detail.
func TestAnUpstreamsKeyStaysOutOfTheRecordOfACallItsTransportFailed(t *testing.T) {
	w := newWorld(t, "mcp:*")
	const secret = "s3cret-upstream-key"
	sdk := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return mcptest.NewServer(nil) }, nil)
	arrived, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	var sessions sync.Map
	up := frontedUpstream(t, sdk, func(wr http.ResponseWriter, r *http.Request, body []byte) bool {
		if id := r.Header.Get("Mcp-Session-Id"); id != "" {
			sessions.Store(id, true)
		}
		if !strings.Contains(string(body), "cut-me-off") {
			return false
		}
		once.Do(func() { close(arrived) })
		<-release
		// The connection breaks before any answer: a transport failure.
		if conn, _, err := http.NewResponseController(wr).Hijack(); err == nil {
			_ = conn.Close()
		}
		return true
	})
	gw := w.open(t, mcpgate.Upstream{Name: "keyed", URL: up.URL + "/mcp?api_key=" + secret})
	agent := connectAgent(t, serveGateway(t, gw), w.grant.Token, nil)

	answer := make(chan error, 1)
	go func() {
		_, err := callText(t, agent, "echo", map[string]any{"text": "cut-me-off"})
		answer <- err
	}()
	<-arrived
	term := terminate(t, w, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Hour, time.Minute)
	waitState(t, w, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)
	close(release)
	if err := <-answer; rpcCode(err) != mcpgate.CodeUnavailable {
		t.Fatalf("the call whose connection broke: %v; want unavailable (%d)", err, mcpgate.CodeUnavailable)
	}
	waitState(t, w, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	confirmExit(t, w)
	waitState(t, w, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	calls := callsByTool(t, recordOf(t, w, term.TerminationId))["keyed/echo"]
	if len(calls) != 1 || calls[0].Resolution != tetherv1.CallResolution_CALL_RESOLUTION_FAILED {
		t.Fatalf("record: %v; want the call failed", calls)
	}
	got := calls[0].Error
	if strings.Contains(got, secret) {
		t.Errorf("the record keeps the upstream's key: %q", got)
	}
	sessions.Range(func(id, _ any) bool {
		if strings.Contains(got, id.(string)) {
			t.Errorf("the record keeps the gateway's session id at the upstream: %q", got)
		}
		return true
	})
	if !strings.Contains(got, "keyed") {
		t.Errorf("the record's error %q does not name the upstream", got)
	}
}
