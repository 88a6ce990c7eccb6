package mcpgate

import (
	"encoding/json"
	"errors"
	"io"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// stdioBatchRefusal is the answer to a JSON-RPC batch on stdio: the HTTP
// endpoint's (refuseBatches), one line.
const stdioBatchRefusal = `{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"tether: JSON-RPC batches are refused: send one request per message (MCP has no batches since 2025-06-18)"}}` + "\n"

// refuseStdioBatches is the agent's stdio with its JSON-RPC batches
// answered stdioBatchRefusal, before the SDK reads them, and every other
// message passed on, one a line. The SDK's stdio server took a batch from
// a session that negotiated 2025-03-26 (each of its requests run at once,
// their answers held until the last was ready: a batch of tools/list,
// which stdio does not count against the calls in flight, held as many
// tool lists as fit in a 16 MiB line), and ended the whole session on one
// from a session of a later revision: over HTTP the gateway refuses
// batches, one POST at a time. Writes to w are made whole under one lock,
// the SDK's and the refusals alike (the SDK writes each message in one
// Write), so a refusal never lands inside another message.
//
// A batch is the agent's token at work as any request is: refused gives,
// first, the answer of an agent whose token the gateway refuses (its
// grant revoked: the refusal reported), "" when the batch is only a
// batch, and what to do once that answer is written (end the session).
// A revoked rogue's batches were answered -32600 with no look at its
// token, and nothing reported.
func refuseStdioBatches(r io.ReadCloser, w io.WriteCloser, refused func() (string, func())) (io.ReadCloser, io.WriteCloser) {
	out := &lockedWriter{w: w}
	limit := &frameLimit{r: r, limit: mcp.DefaultMaxLineLength}
	return &batchFilter{dec: json.NewDecoder(limit), limit: limit, out: out, closer: r, refused: refused}, out
}

// lockedWriter makes each Write whole.
type lockedWriter struct {
	mu sync.Mutex
	w  io.WriteCloser
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (l *lockedWriter) Close() error { return l.w.Close() }

// errFrameTooLarge: one message beyond mcp.DefaultMaxLineLength (the
// SDK's own bound on a stdio message, which it ends the session on).
var errFrameTooLarge = errors.New("a JSON-RPC message from the agent is longer than the gateway reads")

// frameLimit bounds the bytes read for one message.
type frameLimit struct {
	r            io.Reader
	limit, count int
}

func (f *frameLimit) Read(p []byte) (int, error) {
	if f.count >= f.limit {
		return 0, errFrameTooLarge
	}
	if len(p) > f.limit-f.count {
		p = p[:f.limit-f.count]
	}
	n, err := f.r.Read(p)
	f.count += n
	return n, err
}

// batchFilter reads the agent's messages, refuses its batches, and hands
// the SDK the rest.
type batchFilter struct {
	dec     *json.Decoder
	limit   *frameLimit
	out     *lockedWriter
	closer  io.Closer
	refused func() (string, func())
	next    []byte // what is left of the message being handed over
}

func (b *batchFilter) Read(p []byte) (int, error) {
	for len(b.next) == 0 {
		b.limit.count = 0 // the SDK's own rule: a message's bytes from the end of the last
		var raw json.RawMessage
		if err := b.dec.Decode(&raw); err != nil {
			return 0, err
		}
		if len(raw) > 0 && raw[0] == '[' {
			answer, then := stdioBatchRefusal, func() {}
			if b.refused != nil {
				if a, after := b.refused(); a != "" {
					answer, then = a, after
				}
			}
			_, err := io.WriteString(b.out, answer)
			// Once written: the session's end closes the agent's stdout.
			then()
			if err != nil {
				return 0, err
			}
			continue
		}
		b.next = append(raw, '\n')
	}
	n := copy(p, b.next)
	b.next = b.next[n:]
	return n, nil
}

func (b *batchFilter) Close() error { return b.closer.Close() }
