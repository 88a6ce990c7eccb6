package mcpgate

import (
	"context"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// stdioTransport is a stdio upstream's transport: the SDK's, whose writes
// its callers can abandon (abandonableWrites), its answers to the
// upstream's requests under bound (answerBound).
type stdioTransport struct {
	mcp.Transport
	bound answerBound
}

func (t stdioTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := t.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return abandonableWrites{Connection: c, bound: t.bound}, nil
}

// abandonedWriteGrace is how long a write whose context ended may still
// take before abandonableWrites ends the connection: writing a request of
// MaxForwardedParamsBytes to an upstream that reads takes milliseconds.
const abandonedWriteGrace = time.Second

// abandonableWrites ends the connection when a write is still under way
// abandonedWriteGrace after its context ended. The Go SDK writes a message to a stdio upstream
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
//
// The gateway's answer to the upstream's own request is written under
// bound: the SDK's client writes it under a context that never ends, and
// an upstream that asked and no longer read its input held the gateway's
// Close for ever.
type abandonableWrites struct {
	mcp.Connection
	bound answerBound
}

func (c abandonableWrites) Write(ctx context.Context, msg jsonrpc.Message) error {
	if _, answer := msg.(*jsonrpc.Response); answer {
		var done func()
		ctx, done = c.bound.bind(ctx)
		defer done()
	}
	if err := ctx.Err(); err != nil {
		return err // not written at all (the SDK's own rule)
	}
	done := make(chan error, 1)
	go func() { done <- c.Connection.Write(ctx, msg) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	// A write that was about to end (an upstream that reads) is let end:
	// an honest upstream is not restarted, and its other calls not failed,
	// for a cancel that came as it took the request.
	grace := time.NewTimer(abandonedWriteGrace)
	defer grace.Stop()
	select {
	case err := <-done:
		return err
	case <-grace.C:
	}
	// Close closes the input first, which ends the write, then waits for
	// the process to exit (signalling it if it does not): not on this path.
	go func() { _ = c.Connection.Close() }()
	if err := <-done; err != nil {
		return ctx.Err()
	}
	return nil
}
