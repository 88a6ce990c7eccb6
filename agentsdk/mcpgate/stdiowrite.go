package mcpgate

import (
	"context"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// stdioTransport is a stdio upstream's transport: the SDK's, whose writes
// its callers can abandon (abandonableWrites).
type stdioTransport struct{ mcp.Transport }

func (t stdioTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := t.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return abandonableWrites{c}, nil
}

// abandonableWrites ends the connection when a write is still under way
// as its context ends. The Go SDK writes a message to a stdio upstream
// without regard to the context: a call whose request did not fit in the
// pipe of an upstream that no longer reads its input stayed blocked in the
// write, and the control plane's cancel could not end it — the gateway
// never acknowledged the cancel, nor answered the agent. Ending the
// connection closes the upstream's input (the write returns, the rest of
// the message is never written, so the upstream never has the request
// whole) and stops the process; the gateway starts it again (watch), and
// the other calls in flight on it fail, as on any stdio upstream's exit.
// A write that completes before the connection ends was written whole:
// the call goes on as any the cancel overtook after its request was sent.
type abandonableWrites struct{ mcp.Connection }

func (c abandonableWrites) Write(ctx context.Context, msg jsonrpc.Message) error {
	done := make(chan error, 1)
	go func() { done <- c.Connection.Write(ctx, msg) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	// Close closes the input first, which ends the write, then waits for
	// the process to exit (signalling it if it does not): not on this path.
	go func() { _ = c.Connection.Close() }()
	if err := <-done; err != nil {
		return ctx.Err()
	}
	return nil
}
