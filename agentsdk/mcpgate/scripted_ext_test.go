package mcpgate_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// sseEvent writes msg as one event of a text/event-stream.
func sseEvent(wr io.Writer, msg string) { _, _ = fmt.Fprintf(wr, "event: message\ndata: %s\n\n", msg) }

// rpcResult is the JSON-RPC answer to request id with result.
func rpcResult(id, result string) string {
	return `{"jsonrpc":"2.0","id":` + id + `,"result":` + result + `}`
}

// listChanged is an upstream's word that its tools changed.
const listChanged = `{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}`

// scriptedUpstream is a hand-written Streamable HTTP upstream named name,
// for upstreams the Go SDK's server would not play. It answers initialize
// (tools that may change), each other request with the events respond
// gives for its method and id (none: method not found), a notification
// with 202, and a GET (the standalone stream) with get, or 405 when get is
// nil. It closes at the test's end, its client connections first.
func scriptedUpstream(t *testing.T, name string, respond func(method, id string) []string, get http.HandlerFunc) *httptest.Server {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(wr http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodGet && get != nil:
			get(wr, r)
			return
		case r.Method != http.MethodPost:
			wr.WriteHeader(http.StatusMethodNotAllowed)
			return
		}
		var req struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.ID == nil {
			wr.WriteHeader(http.StatusAccepted) // a notification
			return
		}
		id := string(req.ID)
		wr.Header().Set("Mcp-Session-Id", name)
		wr.Header().Set("Content-Type", "text/event-stream")
		if req.Method == "initialize" {
			sseEvent(wr, rpcResult(id, `{"protocolVersion":"2025-06-18","capabilities":{"tools":{"listChanged":true}},"serverInfo":{"name":"`+name+`","version":"1"}}`))
			return
		}
		events := respond(req.Method, id)
		if events == nil {
			events = []string{`{"jsonrpc":"2.0","id":` + id + `,"error":{"code":-32601,"message":"no"}}`}
		}
		for _, e := range events {
			sseEvent(wr, e)
		}
	}))
	t.Cleanup(func() {
		up.CloseClientConnections()
		up.Close()
	})
	return up
}
