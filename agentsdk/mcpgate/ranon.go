package mcpgate

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// CancelAnswerGrace is how long, once the control plane's cancel has
// stopped the gateway's wait for a call to an upstream, the gateway
// still listens for the upstream's answer to it before it acknowledges
// the cancel (on the gateway's clock; an abort's acknowledgement window
// is 10 s by default). MCP's cancellation is advisory: an upstream that
// ignores notifications/cancelled goes on with the call. The Go SDK's
// client forgets a call as its context is cancelled and drops the answer
// that comes after, so the gateway acknowledged the cancel of a call the
// upstream then ran to its end and answered: the record read
// cancelled_acked, the gateway's word that the call stopped on its cancel,
// of a call that did not (rogue44h test). An answer with a result in the
// grace (not an error, nor a result with isError set: the Go SDK's server
// answers a call its cancel stopped with one) is the upstream's word that
// the call ran on past its cancel: it is recorded completed, as the Go
// ToolGate records a handler that returned a result after the order. An
// upstream that answers nothing (MCP's advice to one that stops) has the
// cancel acknowledged when the grace is over; so does one whose
// connection ends meanwhile. Over Streamable HTTP the answer is heard on
// the call's POST, kept open for the grace (lateCalls; rogue46d tests), and
// on its event stream resumed when the upstream ends it (lateStream;
// rogue47c tests), and on the upstream's standalone stream (lateCalls.conn;
// rogue48f tests). An
// answer after the grace is still dropped (docs/design.md §11).
const CancelAnswerGrace = 2 * time.Second

// lateKey keys, in the context of a call's upstream request, the
// lateWatch the connection registers the request under as it writes it.
type lateKey struct{}

// lateWatch is one call's ear for its upstream's answer, on the
// connection its request was written to (a stdio upstream's), or on the
// call's own POST (a Streamable HTTP upstream's: lateCalls).
type lateWatch struct {
	answer chan *jsonrpc.Response // the upstream's answer (1)
	mu     sync.Mutex
	on     *lateAnswers // the connection, once its request was written to it
	id     jsonrpc.ID
	over   bool         // forgotten
	stops  []func()     // run as it is forgotten
	stream *lateStream  // the call's event stream at a Streamable HTTP upstream
	also   *lateAnswers // the connection's other streams, listened on too (lateCalls.conn)
}

// onForget runs stop as w is forgotten (at once if it was).
func (w *lateWatch) onForget(stop func()) {
	w.mu.Lock()
	if !w.over {
		w.stops = append(w.stops, stop)
		w.mu.Unlock()
		return
	}
	w.mu.Unlock()
	stop()
}

// connectionGone is the end of the connection the call's request was
// written to, or nil if it was not written to one that listens.
func (w *lateWatch) connectionGone() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.on == nil {
		return nil
	}
	return w.on.gone
}

// forget stops listening: the call is over, however it ended.
func (w *lateWatch) forget() {
	w.mu.Lock()
	on, also, stops := w.on, w.also, w.stops
	w.over, w.stops = true, nil
	w.mu.Unlock()
	for _, stop := range stops {
		stop()
	}
	for _, l := range []*lateAnswers{on, also} {
		if l == nil {
			continue
		}
		l.mu.Lock()
		if l.calls[w.id] == w {
			delete(l.calls, w.id)
		}
		l.mu.Unlock()
	}
}

// lateAnswers are the calls of one stdio upstream's connection (or the
// one call of a Streamable HTTP upstream's POST) whose answers the gateway
// listens for, by their request's id.
type lateAnswers struct {
	mu    sync.Mutex
	calls map[jsonrpc.ID]*lateWatch
	gone  chan struct{} // closed as the connection ends
	once  sync.Once
	// streams are the event streams open on a Streamable HTTP upstream's
	// connection that are no call's (lateCalls.conn's: the standalone
	// stream), on which an answer may still come.
	streams atomic.Int32
}

func newLateAnswers() *lateAnswers {
	return &lateAnswers{calls: map[jsonrpc.ID]*lateWatch{}, gone: make(chan struct{})}
}

// written registers msg, a call's request about to be written, under the
// lateWatch its context holds, if any.
func (l *lateAnswers) written(ctx context.Context, msg jsonrpc.Message) {
	req, ok := msg.(*jsonrpc.Request)
	if !ok || !req.IsCall() {
		return
	}
	w, _ := ctx.Value(lateKey{}).(*lateWatch)
	if w == nil {
		return
	}
	l.mu.Lock()
	l.calls[req.ID] = w
	l.mu.Unlock()
	w.mu.Lock()
	w.on, w.id = l, req.ID
	w.mu.Unlock()
}

// listen has l hear the answer to the request id, w's call, as well as
// the connection it was written to (written): l is not where its wait
// ends.
func (l *lateAnswers) listen(w *lateWatch, id jsonrpc.ID) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.over {
		return
	}
	w.also = l
	l.mu.Lock()
	l.calls[id] = w
	l.mu.Unlock()
}

// read hands an answer to the call it answers, if it is listened for.
func (l *lateAnswers) read(msg jsonrpc.Message) {
	resp, ok := msg.(*jsonrpc.Response)
	if !ok {
		return
	}
	l.mu.Lock()
	w := l.calls[resp.ID]
	delete(l.calls, resp.ID)
	l.mu.Unlock()
	if w != nil {
		select {
		case w.answer <- resp:
		default:
		}
	}
}

// end marks the connection ended: no answer comes on it any more.
func (l *lateAnswers) end() { l.once.Do(func() { close(l.gone) }) }

// ranOnPastCancel waits, up to CancelAnswerGrace, for the upstream's
// answer to a call whose cancel the control plane ordered and the SDK
// abandoned. ranOn is true if the upstream answered with a result: the
// call ran on past its cancel (res, or err if the result cannot be read).
func (g *Gateway) ranOnPastCancel(w *lateWatch) (res *mcp.CallToolResult, err error, ranOn bool) {
	gone := w.connectionGone()
	if gone == nil {
		return nil, nil, false
	}
	var resp *jsonrpc.Response
	grace := g.cfg.Clock.NewTimer(CancelAnswerGrace)
	defer grace.Stop()
	select {
	case resp = <-w.answer:
	case <-gone:
	case <-grace.C():
	case <-g.closing.Done():
	}
	if resp == nil {
		select {
		case resp = <-w.answer: // (it came as the wait ended)
		default:
			return nil, nil, false
		}
	}
	if resp.Error != nil {
		return nil, nil, false // the upstream's word that the call did not complete
	}
	var r mcp.CallToolResult
	if uerr := json.Unmarshal(resp.Result, &r); uerr != nil {
		return nil, errors.New("the upstream answered the call after its cancel with a result the gateway cannot read"), true
	}
	if r.IsError {
		return nil, nil, false
	}
	return &r, nil, true
}
