package mcpgate

import (
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// discard is an agent's stdout nobody reads.
type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
func (discard) Close() error                { return nil }

// A rogue over stdio sending requests without end under the id of one in
// flight (the MCP SDK drops each, unanswered, while the id is in use)
// cannot grow what the gateway keeps of its requests: the stdio
// connection kept a mark per request read, dropped only by the answer
// under its id, so each such request's stayed until the first one's
// answer (the rogue's slow call's, or never). (Fails if the connection
// keeps more than one request under the id, or anything once it is
// answered.)
func TestRogue31AStdioRequestsUnderAnIDInUseAreKeptOnce(t *testing.T) {
	ctx := context.Background()
	const n = 100
	in := strings.NewReader(strings.Repeat(`{"jsonrpc":"2.0","id":5,"method":"ping"}`+"\n", n))
	conn, err := (&mcp.IOTransport{Reader: io.NopCloser(in), Writer: discard{}}).Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := &stdioConn{Connection: conn}
	var id jsonrpc.ID
	for range n {
		msg, err := c.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		id = msg.(*jsonrpc.Request).ID
	}
	c.mu.Lock()
	marks, keys := len(c.marks), len(c.open[id].keys)
	c.mu.Unlock()
	if marks != 1 || keys != 1 {
		t.Fatalf("after %d requests under one id, unanswered: the connection keeps %d marks, %d under the id; want 1", n, marks, keys)
	}
	if err := c.Write(ctx, &jsonrpc.Response{ID: id, Result: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	marks, open := len(c.marks), len(c.open)
	c.mu.Unlock()
	if marks != 0 || open != 0 {
		t.Fatalf("once the id is answered the connection keeps %d marks and %d ids; want none", marks, open)
	}
}
