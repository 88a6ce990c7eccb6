package mcpgate_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/controlplane/testserver"
)

// floodingUpstream is a hostile Streamable HTTP upstream: it answers
// initialize and tools/list, and on its standalone stream (the GET the
// client opens after initialize) says its tools changed without end.
// sent counts the notifications written.
func floodingUpstream(t *testing.T, sent *atomic.Int64) *httptest.Server {
	t.Helper()
	stop := make(chan struct{})
	up := scriptedUpstream(t, "flood", func(method, id string) []string {
		if method == "tools/list" {
			return []string{rpcResult(id, `{"tools":[{"name":"tool","inputSchema":{"type":"object"}}]}`)}
		}
		return nil
	}, func(wr http.ResponseWriter, r *http.Request) {
		wr.Header().Set("Content-Type", "text/event-stream")
		wr.WriteHeader(http.StatusOK)
		flusher, _ := wr.(http.Flusher)
		for r.Context().Err() == nil && !closed(stop) {
			sseEvent(wr, listChanged)
			if flusher != nil {
				flusher.Flush()
			}
			sent.Add(1)
		}
	})
	// Ends the flood before the server closes (this cleanup runs first), a
	// test that failed included: a client that stopped reading would hold
	// the server's Close.
	t.Cleanup(func() { close(stop) })
	return up
}

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// An upstream flooding the gateway with word that its tools changed
// cannot hold the gateway's Close. Close took the gateway's lock and then
// closed each upstream's connection, which waits for the notification
// being handled; the handler of a list_changed notification waits for
// that same lock to find its upstream: the two waited on each other for
// ever (an operator's `tether mcp serve` never exited; a test package hung
// 25 minutes in its cleanups). Close now closes the connections without
// the lock. Each round closes a gateway while the flood is in full flow.
func TestAFloodOfListChangedCannotHoldTheGatewaysClose(t *testing.T) {
	w := newWorld(t, "mcp:*")
	var sent atomic.Int64
	up := floodingUpstream(t, &sent)
	for round := range 20 {
		gw, err := mcpgate.Open(context.Background(), mcpgate.OpenConfig{
			ControlPlane: w.srv.URL, Credential: w.srv.ToolServerToken(t, gateID), GateID: gateID, HTTP: w.srv.HTTP,
			Upstreams: []mcpgate.Upstream{{Name: "flood", URL: up.URL}},
		})
		if err != nil {
			t.Fatal(err)
		}
		before := sent.Load()
		testserver.WaitFor(t, guardWait, "the upstream's flood to reach the gateway", func() bool { return sent.Load() > before+200 })
		closed := make(chan struct{})
		go func() { gw.Close(); close(closed) }()
		select {
		case <-closed:
		case <-time.After(guardWait):
			t.Fatalf("round %d: the gateway's Close did not return within %s while its upstream flooded it with list_changed (%d sent)", round, guardWait, sent.Load())
		}
	}
}
