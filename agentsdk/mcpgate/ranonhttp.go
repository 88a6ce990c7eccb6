package mcpgate

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"net/url"
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
	// conn hears the connection's other streams (the standalone one the
	// SDK's client opens with a GET at revisions before 2026-07-28, and
	// its resumptions): an upstream that answered a cancelled call there,
	// not on the call's own stream, was read by the SDK's client, which
	// had forgotten the call, and dropped (rogue48f tests). Each call's
	// answer is listened for there too, by its request's id.
	conn *lateAnswers
}

func (l lateCalls) RoundTrip(r *http.Request) (*http.Response, error) {
	w, _ := r.Context().Value(lateKey{}).(*lateWatch)
	if w != nil && r.Method == http.MethodGet && r.Header.Get("Last-Event-ID") != "" {
		if st := w.resumable(); st != nil && st.ctx.Err() == nil && r.Context().Err() == nil {
			return st.resumedBySDK(r)
		}
	}
	if w == nil && r.Method == http.MethodGet {
		return l.heardOnConnection(r)
	}
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
	if l.conn != nil {
		l.conn.listen(w, rid)
	}

	ctx, stop := context.WithCancel(context.WithoutCancel(r.Context()))
	unclosing := context.AfterFunc(l.closing, stop)
	heard := &lateHeard{on: on}
	st := &lateStream{ctx: ctx, next: l.next, url: r.URL, header: resumeHeader(r.Header), heard: heard, conn: l.conn}
	st.release = func() {
		stop()
		unclosing()
	}
	st.end = func() {
		st.endOnce.Do(func() {
			st.release()
			on.end()
		})
	}
	// A request not yet sent whole as the call is cancelled is not sent
	// on (the upstream never has the call, as over stdio: rogue20 test).
	// The call's cancel hands what was heard to the lateWatch from then on,
	// and the last message heard before (an answer the SDK may have read as
	// the call was cancelled, and dropped); a stream broken before it, the
	// SDK no longer resuming it, the gateway resumes.
	sent := &sentBody{ReadCloser: r.Body}
	if r.Body == nil || r.Body == http.NoBody {
		sent.whole.Store(true)
	}
	uncancelled := context.AfterFunc(r.Context(), func() {
		if !sent.whole.Load() {
			stop()
		}
		heard.cancelled()
		st.resume()
	})
	w.onForget(func() {
		st.end()
		uncancelled()
		heard.forget()
	})
	w.mu.Lock()
	w.stream = st
	w.mu.Unlock()

	detached := r.WithContext(ctx)
	if r.Body != nil && r.Body != http.NoBody {
		detached.Body = sent
	}
	return st.send(r, detached, st.end)
}

// heardOnConnection sends r, a GET of no call's (the standalone stream,
// or the SDK's resumption of it), and has each answer its event stream
// carries heard by the call it answers, if the gateway listens for it
// (l.conn): the SDK's client reads the stream on, as before.
func (l lateCalls) heardOnConnection(r *http.Request) (*http.Response, error) {
	resp, err := l.next.RoundTrip(r)
	if err != nil || l.conn == nil || resp.Body == nil || resp.StatusCode != http.StatusOK {
		return resp, err
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "text/event-stream" {
		return resp, err
	}
	l.conn.streams.Add(1)
	st := &lateStream{ctx: r.Context(), heard: &lateHeard{on: l.conn, fired: true}, conn: l.conn, standalone: true}
	resp.Body = newLateBody(resp, st)
	return resp, nil
}

// send sends out (r, under the stream's context) and reads its answer as
// the call's POST's is read: handed to r's sender while it waits, read by
// the gateway once r's context is done. failed is what an exchange that
// fails, or answers without a body, does.
func (s *lateStream) send(r, out *http.Request, failed func()) (*http.Response, error) {
	type exchange struct {
		resp *http.Response
		err  error
	}
	got := make(chan exchange, 1)
	go func() {
		resp, err := s.next.RoundTrip(out)
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
				failed()
				return
			}
			body := newLateBody(x.resp, s)
			_, _ = io.Copy(io.Discard, body)
			_ = body.Close()
		}()
		return nil, context.Cause(r.Context())
	}
	if x.err != nil || x.resp.Body == nil {
		failed()
		return x.resp, x.err
	}
	x.resp.Body = newLateBody(x.resp, s)
	return x.resp, nil
}

// resumeHeader is what a resumption of a call's stream carries of the
// call's POST's headers: the upstream's session and protocol version.
func resumeHeader(h http.Header) http.Header {
	out := http.Header{}
	for _, k := range []string{"Mcp-Session-Id", "Mcp-Protocol-Version", "Authorization"} {
		if v := h.Values(k); len(v) > 0 {
			out[k] = v
		}
	}
	out.Set("Accept", "text/event-stream")
	return out
}

// lateStream is a call's event stream at a Streamable HTTP upstream,
// across its resumptions. An upstream may end a call's event stream before
// it answers and have the client resume it (a GET with Last-Event-ID:
// MCP's SEP-1699), which the SDK's client does only under the call's
// context: after the control plane's cancel nobody resumed it, the
// stream's end was taken as the connection's, and an answer the upstream
// gave on the resumed stream was never heard — the call recorded
// cancelled_acked though the upstream ran it (rogue47c tests). A stream
// that ends without the call's answer, having carried an event id, is
// now not the end of the gateway's wait: while the call is on, the SDK resumes it as before, its GET sent under the call's
// POST's context and read as the POST is, so that the cancel does not end
// it; after the cancel the gateway resumes it, from the last event id it
// read, as long as it listens for the call's answer (the grace),
// MaxStreamResumptions times at most.
type lateStream struct {
	ctx     context.Context // the call's POST's, ended by end
	next    http.RoundTripper
	url     *url.URL
	header  http.Header // of a resumption
	heard   *lateHeard
	end     func() // the stream is over: no answer comes on it any more
	endOnce sync.Once
	release func()       // lets go of the POST, not of the wait (unresumable)
	conn    *lateAnswers // the connection's other streams (lateCalls.conn)

	mu      sync.Mutex
	lastID  string // the last event id the stream carried
	broken  bool   // ended without the answer, resumable, not resumed yet
	resumed int    // resumptions by the gateway

	// standalone is a stream of the connection's that is no call's
	// (heardOnConnection): its end ends no wait, and the SDK's client
	// resumes it.
	standalone bool
}

// MaxStreamResumptions bounds the gateway's resumptions of one call's
// event stream after its cancel: an upstream that ends each resumed stream
// at once would have the gateway send GET after GET for as long as the
// grace lasted.
const MaxStreamResumptions = 8

// resumable is the call's stream, if its POST is one lateCalls carries.
func (w *lateWatch) resumable() *lateStream {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stream
}

// sawID records an event id the stream carried.
func (s *lateStream) sawID(id string) {
	s.mu.Lock()
	s.lastID = id
	s.mu.Unlock()
}

// ended takes the end of one body of the call's stream (its POST's, or a
// resumption's): the stream's end, unless it can be resumed.
func (s *lateStream) ended(stream bool) {
	if s.standalone {
		s.conn.streams.Add(-1) // (once: lateBody)
		return
	}
	if !stream || s.ctx.Err() != nil || s.heard.answered.Load() {
		s.end()
		return
	}
	s.mu.Lock()
	if s.lastID == "" {
		s.mu.Unlock()
		s.unresumable()
		return
	}
	if s.resumed >= MaxStreamResumptions {
		s.mu.Unlock()
		s.end()
		return
	}
	s.broken = true
	s.mu.Unlock()
	if s.heard.isCancelled() {
		s.resume()
	}
}

// unresumable takes the end of the call's stream, which carried no event
// id to resume it from, without its answer: the end of the wait for the
// answer, unless the connection has another stream open (the standalone
// one), where an upstream that ended the call's stream may still answer
// the call (rogue48f tests): then the POST is let go, and the wait ends as
// the call is forgotten (the answer heard there, the grace over after a
// cancel; before one, the SDK's client ends the call at this end, the
// request terminated without its response). (A stream whose resumptions
// are spent ends the wait, as before: MaxStreamResumptions bounds what an
// upstream ending each resumption costs an abort.)
func (s *lateStream) unresumable() {
	if s.conn != nil && s.conn.streams.Load() > 0 {
		s.release()
		return
	}
	s.end()
}

// take claims the resumption of a broken stream, from its last event id.
func (s *lateStream) take() (from string, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.broken {
		return "", false
	}
	s.broken = false
	s.resumed++
	return s.lastID, true
}

// resume has the gateway resume the broken stream (after the call's
// cancel), if it is.
func (s *lateStream) resume() {
	from, ok := s.take()
	if !ok {
		return
	}
	go func() {
		req, err := http.NewRequestWithContext(s.ctx, http.MethodGet, s.url.String(), nil)
		if err != nil {
			s.end()
			return
		}
		req.Header = s.header.Clone()
		req.Header.Set("Last-Event-ID", from)
		resp, err := s.next.RoundTrip(req)
		if err != nil {
			s.end()
			return
		}
		if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); resp.StatusCode != http.StatusOK || mt != "text/event-stream" {
			_ = resp.Body.Close()
			s.end()
			return
		}
		body := newLateBody(resp, s)
		_, _ = io.Copy(io.Discard, body)
		_ = body.Close()
	}()
}

// resumedBySDK sends the SDK's resumption r of the call's stream under
// the stream's context, and reads it as the call's POST is read: the
// call's cancel does not end it.
func (s *lateStream) resumedBySDK(r *http.Request) (*http.Response, error) {
	s.mu.Lock()
	s.broken = false
	s.mu.Unlock()
	return s.send(r, r.WithContext(s.ctx), func() {
		// Resumable again (the SDK tries again while the call is on; the
		// gateway after the cancel).
		s.ended(true)
	})
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
	// answered is set once the stream carried an answer (the call's: a
	// call's stream carries no other).
	answered atomic.Bool
}

func (h *lateHeard) isCancelled() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.fired
}

// heard is one message (an event's data, or a JSON body).
func (h *lateHeard) heard(msg []byte) {
	if bytes.Contains(msg, []byte(`"result"`)) || bytes.Contains(msg, []byte(`"error"`)) {
		if m, err := jsonrpc.DecodeMessage(msg); err == nil {
			if _, ok := m.(*jsonrpc.Response); ok {
				h.answered.Store(true)
			}
		}
	}
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
	s     *lateStream
	once  sync.Once

	stream bool
	whole  bool   // heard already
	line   []byte // the current line (of an event stream), or the JSON body
	data   []byte // the current event's data
	inData bool   // the current event has a data field
	name   string // the current event's name
	id     string // the current event's id
}

func newLateBody(resp *http.Response, s *lateStream) *lateBody {
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	b := &lateBody{body: resp.Body, heard: s.heard, s: s, stream: mt == "text/event-stream"}
	if whole, ok := resp.Body.(wholeBody); ok && !b.stream {
		// Read whole already (boundedAnswers): heard as it is, not copied.
		b.heard.heard(whole.whole)
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
		b.once.Do(func() { b.s.ended(b.stream) })
	}
	return n, err
}

func (b *lateBody) Close() error {
	err := b.body.Close()
	b.once.Do(func() { b.s.ended(b.stream) })
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
		if b.id != "" {
			b.s.sawID(b.id)
		}
		b.data, b.inData, b.name, b.id = nil, false, "", ""
		return
	}
	key, value, found := bytes.Cut(line, []byte{':'})
	if !found {
		return
	}
	switch string(key) {
	case "event":
		b.name = string(bytes.TrimSpace(value))
	case "id":
		b.id = string(bytes.TrimSpace(value))
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
