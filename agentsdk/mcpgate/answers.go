package mcpgate

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tetherhq/tether/internal/clock"
)

// MaxUpstreamAnswerBytes bounds an upstream's answer: a body that is not
// an event stream (a Streamable HTTP server may answer a POST with one
// JSON body, or an error status with a body), which the SDK's client reads
// whole into memory, and each event of an event stream (mcp.DefaultMaxEventSize,
// the same figure, less a few hundred bytes). An answer to a call beyond it
// fails that call alone (CodeUnavailable): a rogue upstream answering
// without end cuts off neither the gateway's memory nor, on that upstream,
// the other callers; nor does an agent asking an honest upstream for too
// much. Beyond it on any other request (the standalone event stream, or a
// stream resumed after a break) the SDK drops the connection to that
// upstream, and the gateway reconnects.
const MaxUpstreamAnswerBytes = mcp.DefaultMaxEventSize

// eventSlack is what the gateway may add to an event it cuts (a line's
// end, an event name), within the SDK's own bound on an event.
const eventSlack = 256

// codeAnswerRefused is the JSON-RPC error the gateway's transport answers
// a call with in place of an upstream's answer that would have ended the
// whole connection: the agent gets CodeUnavailable.
const codeAnswerRefused = -32069

// boundedAnswers is the upstreams' HTTP transport. It bounds what the
// gateway reads of an answer (MaxUpstreamAnswerBytes), and it keeps one
// call's answer from ending the connection every agent's calls to that
// upstream share: the Go SDK's client ends it on an HTTP error that is not
// a JSON-RPC one (a filter's plain 403 in front of the upstream, a 400, a
// 413), on a body it cannot read whole and on an event too large, and
// every call in flight on it fails. Each of those, answering a call, is
// turned into that call's JSON-RPC error. A 404 still ends the connection:
// it is MCP's word that the upstream's session is over (the gateway then
// reconnects). The statuses the SDK takes as transient (500, 502, 503,
// 504, 429) already fail only their call.
type boundedAnswers struct{ next http.RoundTripper }

func (b boundedAnswers) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := b.next.RoundTrip(r)
	if err != nil || resp.Body == nil {
		return resp, err
	}
	stream := false
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt == "text/event-stream" {
		stream = true
	}
	var id json.RawMessage
	call := false
	if r.Method == http.MethodPost {
		// Only a call's answer is read here: a notification's is closed
		// unread by the SDK (a 202 with no body, MCP says).
		id, call = callID(r)
	}
	switch {
	case call && resp.StatusCode/100 == 2 && stream:
		resp.Body = &eventGuard{body: resp.Body, id: id, limit: MaxUpstreamAnswerBytes - eventSlack, onlyCR: true}
	case call && resp.StatusCode/100 == 2:
		body, err := io.ReadAll(io.LimitReader(resp.Body, MaxUpstreamAnswerBytes+1))
		_ = resp.Body.Close()
		switch {
		case err != nil:
			// The SDK's client would end the connection on a body it could
			// not read (the call's own cancellation, mid-body, included).
			setAnswer(resp, http.StatusOK, refusal(id, "tether: reading the upstream's answer failed"))
		case len(body) <= MaxUpstreamAnswerBytes:
			resp.Body = newWholeBody(body)
		default:
			setAnswer(resp, http.StatusOK, refusal(id, fmt.Sprintf("tether: the upstream's answer exceeds %d bytes, the most the gateway relays", MaxUpstreamAnswerBytes)))
		}
	case call && resp.StatusCode != http.StatusNotFound && !transientStatus(resp.StatusCode):
		// An HTTP error: the SDK keeps the connection when its body is a
		// JSON-RPC error, and ends it otherwise.
		body, err := io.ReadAll(io.LimitReader(resp.Body, MaxUpstreamAnswerBytes+1))
		_ = resp.Body.Close()
		if err == nil && len(body) <= MaxUpstreamAnswerBytes {
			if msg, derr := jsonrpc.DecodeMessage(body); derr == nil {
				if res, ok := msg.(*jsonrpc.Response); ok && res.Error != nil {
					resp.Body = newWholeBody(body)
					return resp, nil
				}
			}
		}
		setAnswer(resp, resp.StatusCode, refusal(id, fmt.Sprintf("tether: the upstream answered the call with HTTP %d %s", resp.StatusCode, http.StatusText(resp.StatusCode))))
	case !stream:
		resp.Body = &boundedBody{ReadCloser: resp.Body, left: MaxUpstreamAnswerBytes}
	}
	return resp, nil
}

// answerBound is how long the gateway waits to write to an upstream its
// answer to the upstream's own request (ping, roots/list; sampling and
// elicitation, refused). The Go SDK's client writes such an answer under
// a context that never ends, and closing a connection waits for every
// request of the upstream's being answered: an upstream that asked and
// never took the answer (over HTTP, never answered the POST carrying it;
// over stdio, no longer read its input) held the gateway's Close for
// ever, and each such answer held a goroutine and a connection for as
// long. Each write of an answer now ends as the gateway closes, or wait
// (the gateway's ConnectTimeout) after it began. (The gateway's requests
// end with their own contexts; its notifications — initialized, within
// the connection's ConnectTimeout, and cancelled, within the SDK's 5 s —
// too.)
type answerBound struct {
	closing context.Context // ends as the gateway closes
	clock   clock.Clock
	wait    time.Duration
	held    *answersHeld // the connection's, nil for none
}

// bind is ctx, ended as b says; done lets go of it.
func (b answerBound) bind(ctx context.Context) (_ context.Context, done func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	stops := []func() bool{}
	if b.clock != nil && b.wait > 0 {
		stops = append(stops, b.clock.AfterFunc(b.wait, func() { cancel(errConnectTimeout) }).Stop)
	}
	if b.closing != nil {
		stops = append(stops, context.AfterFunc(b.closing, func() { cancel(errGatewayClosing) }))
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel(nil)
	}
}

// answerWaits is an HTTP upstream's transport with answerBound on each
// POST that carries the gateway's answer to the upstream's own request.
type answerWaits struct {
	next  http.RoundTripper
	bound answerBound
}

func (a answerWaits) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method != http.MethodPost {
		return a.next.RoundTrip(r)
	}
	if !carriesAnswer(r) {
		return a.next.RoundTrip(r)
	}
	if !a.bound.held.take() {
		// Not sent: as far as the SDK knows, taken (MCP's 202).
		return &http.Response{Status: "202 Accepted", StatusCode: http.StatusAccepted, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header: http.Header{}, Body: http.NoBody, Request: r}, nil
	}
	ctx, unbind := a.bound.bind(r.Context())
	done := func() {
		unbind()
		a.bound.held.release()
	}
	resp, err := a.next.RoundTrip(r.WithContext(ctx))
	if err != nil || resp.Body == nil {
		done()
		return resp, err
	}
	resp.Body = &closeThen{ReadCloser: resp.Body, then: done}
	return resp, nil
}

// carriesAnswer reports whether the POST r carries a JSON-RPC response
// (the gateway's answer to the upstream's request), not a request or a
// notification of the gateway's.
func carriesAnswer(r *http.Request) bool {
	if _, call := callID(r); call || r.GetBody == nil {
		return false
	}
	body, err := r.GetBody()
	if err != nil {
		return false
	}
	defer body.Close()
	b, err := io.ReadAll(io.LimitReader(body, mcp.DefaultMaxRequestBodyBytes))
	if err != nil {
		return false
	}
	msg, err := jsonrpc.DecodeMessage(b)
	_, answer := msg.(*jsonrpc.Response)
	return err == nil && answer
}

// closeThen runs then once its body is closed.
type closeThen struct {
	io.ReadCloser
	once sync.Once
	then func()
}

func (c *closeThen) Close() error {
	err := c.ReadCloser.Close()
	c.once.Do(c.then)
	return err
}

// transientStatus is what the SDK's client keeps a connection through
// (its isTransientHTTPStatus).
func transientStatus(code int) bool {
	switch code {
	case http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout, http.StatusTooManyRequests:
		return true
	}
	return false
}

// callID is the id of the JSON-RPC call r carries, if it carries one (not
// a notification, nor a response). The SDK's client writes a request's id
// and method before its params, so the scan stops before the params.
func callID(r *http.Request) (json.RawMessage, bool) {
	if r.GetBody == nil {
		return nil, false
	}
	body, err := r.GetBody()
	if err != nil {
		return nil, false
	}
	defer body.Close()
	id, _, ok := requestOf(body)
	return id, ok
}

// requestOf is the id and method of the JSON-RPC call body holds, if it
// holds one (not a notification, a response nor a batch). The scan stops
// once it has both.
func requestOf(body io.Reader) (json.RawMessage, string, bool) {
	dec := json.NewDecoder(io.LimitReader(body, mcp.DefaultMaxRequestBodyBytes))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, "", false
	}
	var (
		id     json.RawMessage
		method string
	)
	for dec.More() && (id == nil || method == "") {
		key, err := dec.Token()
		if err != nil {
			return nil, "", false
		}
		switch key {
		case "id":
			err = dec.Decode(&id)
		case "method":
			err = dec.Decode(&method)
		default:
			var skip json.RawMessage
			err = dec.Decode(&skip)
		}
		if err != nil {
			return nil, "", false
		}
	}
	if method == "" || len(id) == 0 || string(id) == "null" {
		return nil, "", false
	}
	return id, method, true
}

// refusal is the JSON-RPC answer to call id that fails it with message.
func refusal(id json.RawMessage, message string) []byte {
	return errorAnswer(id, &jsonrpc.Error{Code: codeAnswerRefused, Message: refusalMark + " " + message})
}

// refusalMark begins the message of each refusal the gateway's transport
// writes: 64 random bits, drawn once per process, that tell its refusal
// from an upstream's error of the same code (an upstream can send any).
var refusalMark = func() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return "tether-refusal-" + hex.EncodeToString(b[:])
}()

// transportsRefusal is the message of the refusal the gateway's transport
// wrote in place of an upstream's answer, if e is one.
func transportsRefusal(e *jsonrpc.Error) (string, bool) {
	if e.Code != codeAnswerRefused {
		return "", false
	}
	msg, ok := strings.CutPrefix(e.Message, refusalMark+" ")
	return msg, ok
}

// errorAnswer is the JSON-RPC answer to call id that fails it with e.
func errorAnswer(id json.RawMessage, e *jsonrpc.Error) []byte {
	b, _ := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   *jsonrpc.Error  `json:"error"`
	}{"2.0", id, e})
	return b
}

// setAnswer makes resp a JSON answer of status with body.
func setAnswer(resp *http.Response, status int, body []byte) {
	resp.StatusCode = status
	resp.Status = fmt.Sprintf("%d %s", status, http.StatusText(status))
	resp.Header = resp.Header.Clone()
	resp.Header.Set("Content-Type", "application/json")
	resp.Header.Del("Content-Length")
	resp.ContentLength = int64(len(body))
	resp.Body = newWholeBody(body)
}

// wholeBody is an answer the gateway read whole: the SDK reads it, and
// lateCalls hears it without a copy.
type wholeBody struct {
	*bytes.Reader
	whole []byte
}

func newWholeBody(b []byte) wholeBody { return wholeBody{Reader: bytes.NewReader(b), whole: b} }

func (wholeBody) Close() error { return nil }

// errAnswerTooLarge is the read error of an upstream's answer beyond
// MaxUpstreamAnswerBytes (in the gateway's log, not the agent's answer).
var errAnswerTooLarge = fmt.Errorf("mcpgate: the upstream's answer exceeds %d bytes, the most the gateway reads", MaxUpstreamAnswerBytes)

type boundedBody struct {
	io.ReadCloser
	left int64
}

func (b *boundedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		// One byte more says whether the body ended exactly at the bound.
		var one [1]byte
		if n, err := b.ReadCloser.Read(one[:]); n == 0 {
			return 0, err
		}
		return 0, errAnswerTooLarge
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	return n, err
}

// eventGuard passes an upstream's event stream (the answer to one call)
// through, until an event grows past limit: it then ends that event as
// one the SDK skips (named tether-dropped, its line closed as a field the
// SDK ignores), answers the call with a JSON-RPC error event, and ends the
// stream. The SDK's client would have taken the event as a malformed
// stream and ended the whole connection.
type eventGuard struct {
	body  io.ReadCloser
	id    json.RawMessage // the call's
	limit int

	event  int  // bytes of the current event passed on
	line   int  // bytes of the current line passed on
	colon  bool // the current line has its ':'
	onlyCR bool // the current line is nothing but '\r' so far (a blank line, to the SDK)

	cut  bool
	tail []byte // what is left to hand out after the cut
}

func (g *eventGuard) Read(p []byte) (int, error) {
	if !g.cut && g.event >= g.limit {
		g.cutHere()
	}
	if g.cut {
		if len(g.tail) == 0 {
			return 0, io.EOF
		}
		n := copy(p, g.tail)
		g.tail = g.tail[n:]
		return n, nil
	}
	if room := g.limit - g.event; len(p) > room {
		p = p[:room]
	}
	n, err := g.body.Read(p)
	for _, c := range p[:n] {
		g.event++
		switch c {
		case '\n':
			if g.onlyCR { // a blank line: the event ends
				g.event = 0
			}
			g.line, g.colon, g.onlyCR = 0, false, true
		default:
			g.line++
			g.colon = g.colon || c == ':'
			g.onlyCR = g.onlyCR && c == '\r'
		}
	}
	return n, err
}

func (g *eventGuard) cutHere() {
	g.cut = true
	_ = g.body.Close()
	var tail bytes.Buffer
	if g.line > 0 {
		if !g.colon {
			tail.WriteString(":") // a field with no name's worth: ignored
		}
		tail.WriteString("\n")
	}
	tail.WriteString("event: tether-dropped\n\n")
	tail.WriteString("data: ")
	tail.Write(refusal(g.id, fmt.Sprintf("tether: an event of the upstream's answer exceeds %d bytes, the most the gateway relays", g.limit)))
	tail.WriteString("\n\n")
	g.tail = tail.Bytes()
}

func (g *eventGuard) Close() error {
	if g.cut {
		return nil
	}
	return g.body.Close()
}

// MaxAnswersInFlight bounds the gateway's answers to an upstream's own
// requests (ping, roots/list; sampling and elicitation, refused) being
// written to one connection to it at once (over Streamable HTTP, each a
// POST until the upstream has answered it). The Go SDK's client answers
// each request in a goroutine of its own, each waiting for the upstream
// to take its answer (answerBound): an upstream that asked thousands of
// times at once and took none of the answers had the gateway hold a
// goroutine, and over HTTP a request and a connection, for each. An
// answer past the bound is not written: the upstream's request is left
// unanswered (the gateway logs it, once per connection).
const MaxAnswersInFlight = 64

// answersHeld counts the answers to one connection's upstream being
// written (MaxAnswersInFlight).
type answersHeld struct {
	n        atomic.Int32
	logged   atomic.Bool
	log      *slog.Logger
	upstream string
}

// take counts one answer more, unless MaxAnswersInFlight are being
// written: then the answer is not to be written, and take says false.
func (h *answersHeld) take() bool {
	if h == nil {
		return true
	}
	if h.n.Add(1) > MaxAnswersInFlight {
		h.n.Add(-1)
		if !h.logged.Swap(true) {
			h.log.Warn("mcpgate: an upstream asked the gateway more than it takes answers from: its requests past the gateway's answers in flight to it are left unanswered", "upstream", h.upstream, "max", MaxAnswersInFlight)
		}
		return false
	}
	return true
}

// release counts one answer less.
func (h *answersHeld) release() {
	if h != nil {
		h.n.Add(-1)
	}
}
