package mcpgate

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// lateCalls is a Streamable HTTP upstream's transport that keeps a call's
// POST open past the call's cancel, so that the gateway hears what the
// upstream answers after it (ranOnPastCancel), as it hears a stdio
// upstream's on its connection. The SDK's client sends a call's POST under
// the call's context: the control plane's cancel ended the POST, and with
// it the answer's event stream or body, so an upstream that ignored
// notifications/cancelled and ran the call to its end was heard by nobody,
// and the call was recorded cancelled_acked (rogue46d tests). The POST of
// a call the gateway listens for (a lateWatch in its context) is now sent
// under a context of its own, which ends as the call is forgotten (its
// answer in, or the grace over), as the SDK lets go of the answer, or as
// the gateway closes; the SDK still stops waiting for it as the call is
// cancelled. What the POST carries is read as it passes to the SDK, and,
// once the SDK no longer waits (the headers came after the cancel), by
// the gateway alone; each message of it is handed to the call's lateWatch
// once the call is cancelled.
type lateCalls struct {
	next    http.RoundTripper
	closing context.Context // ends as the gateway closes
}

func (l lateCalls) RoundTrip(r *http.Request) (*http.Response, error) {
	w, _ := r.Context().Value(lateKey{}).(*lateWatch)
	if w == nil || r.Method != http.MethodPost || r.Context().Err() != nil {
		// (A call cancelled before it is sent is not sent.)
		return l.next.RoundTrip(r)
	}
	raw, call := callID(r) // (not the call's notifications/cancelled, which carries its context's values)
	if !call {
		return l.next.RoundTrip(r)
	}
	var id any
	if err := json.Unmarshal(raw, &id); err != nil {
		return l.next.RoundTrip(r)
	}
	rid, err := jsonrpc.MakeID(id)
	if err != nil {
		return l.next.RoundTrip(r)
	}
	on := newLateAnswers() // this POST's, ended with it
	on.written(r.Context(), &jsonrpc.Request{ID: rid, Method: "tools/call"})

	ctx, stop := context.WithCancel(context.WithoutCancel(r.Context()))
	unclosing := context.AfterFunc(l.closing, stop)
	heard := &lateHeard{on: on}
	// A request not yet sent whole as the call is cancelled is not sent
	// on (the upstream never has the call, as over stdio: rogue20 test).
	// The call's cancel hands what was heard to the lateWatch from then on,
	// and the last message heard before (an answer the SDK may have read as
	// the call was cancelled, and dropped).
	sent := &sentBody{ReadCloser: r.Body}
	if r.Body == nil || r.Body == http.NoBody {
		sent.whole.Store(true)
	}
	uncancelled := context.AfterFunc(r.Context(), func() {
		if !sent.whole.Load() {
			stop()
		}
		heard.cancelled()
	})
	end := func() {
		stop()
		unclosing()
		on.end()
	}
	w.onForget(func() {
		end()
		uncancelled()
		heard.forget()
	})

	type exchange struct {
		resp *http.Response
		err  error
	}
	got := make(chan exchange, 1)
	detached := r.WithContext(ctx)
	if r.Body != nil && r.Body != http.NoBody {
		detached.Body = sent
	}
	go func() {
		resp, err := l.next.RoundTrip(detached)
		got <- exchange{resp, err}
	}()
	var x exchange
	select {
	case x = <-got:
	case <-r.Context().Done():
		// The SDK stops waiting; the gateway reads what comes.
		go func() {
			x := <-got
			if x.err != nil || x.resp.Body == nil {
				end()
				return
			}
			body := newLateBody(x.resp, heard, end)
			_, _ = io.Copy(io.Discard, body)
			_ = body.Close()
		}()
		return nil, context.Cause(r.Context())
	}
	if x.err != nil || x.resp.Body == nil {
		end()
		return x.resp, x.err
	}
	x.resp.Body = newLateBody(x.resp, heard, end)
	return x.resp, nil
}

// sentBody is a call's request body, whole once read to its end.
type sentBody struct {
	io.ReadCloser
	whole atomic.Bool
}

func (b *sentBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.whole.Store(true)
	}
	return n, err
}

// lateHeard is what a call's POST carried: each message is handed to the
// call's lateWatch once the call is cancelled; before, the last one is
// kept until then.
type lateHeard struct {
	on    *lateAnswers
	mu    sync.Mutex
	fired bool   // the call was cancelled
	over  bool   // the call was forgotten
	last  []byte // the last message heard before the cancel
}

// heard is one message (an event's data, or a JSON body).
func (h *lateHeard) heard(msg []byte) {
	h.mu.Lock()
	switch {
	case h.over:
		h.mu.Unlock()
	case !h.fired:
		h.last = msg
		h.mu.Unlock()
	default:
		h.mu.Unlock()
		h.hand(msg)
	}
}

func (h *lateHeard) cancelled() {
	h.mu.Lock()
	last := h.last
	h.fired, h.last = true, nil
	h.mu.Unlock()
	if last != nil {
		h.hand(last)
	}
}

func (h *lateHeard) forget() {
	h.mu.Lock()
	h.over, h.last = true, nil
	h.mu.Unlock()
}

func (h *lateHeard) hand(msg []byte) {
	if m, err := jsonrpc.DecodeMessage(msg); err == nil {
		h.on.read(m)
	}
}

// lateBody is a call's POST's answer, its messages heard as they are read:
// an event stream's events (as the SDK's client reads them), or a JSON
// body whole. Its end (read or closed) runs end.
type lateBody struct {
	body  io.ReadCloser
	heard *lateHeard
	end   func()
	once  sync.Once

	stream bool
	whole  bool   // heard already
	line   []byte // the current line (of an event stream), or the JSON body
	data   []byte // the current event's data
	inData bool   // the current event has a data field
	name   string // the current event's name
}

func newLateBody(resp *http.Response, heard *lateHeard, end func()) *lateBody {
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	b := &lateBody{body: resp.Body, heard: heard, end: end, stream: mt == "text/event-stream"}
	if whole, ok := resp.Body.(wholeBody); ok && !b.stream {
		// Read whole already (boundedAnswers): heard as it is, not copied.
		heard.heard(whole.whole)
		b.whole = true
	}
	return b
}

func (b *lateBody) Read(p []byte) (int, error) {
	n, err := b.body.Read(p)
	b.scan(p[:n])
	if err != nil {
		if err == io.EOF {
			b.finish()
		}
		b.once.Do(b.end)
	}
	return n, err
}

func (b *lateBody) Close() error {
	err := b.body.Close()
	b.once.Do(b.end)
	return err
}

// scan reads p, the next bytes of the answer. What it holds is bounded by
// the gateway's bounds on an answer (boundedAnswers, beneath it).
func (b *lateBody) scan(p []byte) {
	if b.whole {
		return
	}
	if !b.stream {
		if len(b.line)+len(p) <= MaxUpstreamAnswerBytes+1 {
			b.line = append(b.line, p...)
		}
		return
	}
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			if len(b.line)+len(p) <= MaxUpstreamAnswerBytes {
				b.line = append(b.line, p...)
			}
			return
		}
		if len(b.line)+i <= MaxUpstreamAnswerBytes {
			b.line = append(b.line, p[:i]...)
		}
		p = p[i+1:]
		b.field()
	}
}

// field takes the line read, as the SDK's client reads an event stream.
func (b *lateBody) field() {
	line := bytes.TrimRight(b.line, "\r\n")
	b.line = b.line[:0]
	if len(line) == 0 {
		if b.inData && (b.name == "" || b.name == "message") && len(b.data) > 0 {
			b.heard.heard(b.data)
		}
		b.data, b.inData, b.name = nil, false, ""
		return
	}
	key, value, found := bytes.Cut(line, []byte{':'})
	if !found {
		return
	}
	switch string(key) {
	case "event":
		b.name = string(bytes.TrimSpace(value))
	case "data":
		if b.inData {
			b.data = append(b.data, '\n')
		}
		if len(b.data)+len(value) <= MaxUpstreamAnswerBytes {
			b.data = append(b.data, bytes.TrimSpace(value)...)
		}
		b.inData = true
	}
}

// finish takes the answer's end: an event stream's last event, a JSON
// body whole.
func (b *lateBody) finish() {
	if b.whole {
		return
	}
	if b.stream {
		if len(b.line) > 0 {
			b.field()
		}
		b.field()
		return
	}
	if len(b.line) > 0 && len(b.line) <= MaxUpstreamAnswerBytes {
		b.heard.heard(b.line)
	}
	b.line = nil
}
