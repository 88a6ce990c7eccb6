package auth

import (
	"fmt"
	"io"
	"net/http"
	"sync"

	"connectrpc.com/connect"
)

// bodies counts the admitted requests whose bodies have not all arrived
// (awaitBody), and answers the admitted unary calls' answers being
// written (TakeAnswer): by principal, by lineage (those against
// MaxLineageStreams) and, by principal, those held from a node's
// BodyReserve.
type bodies struct {
	mu       sync.Mutex
	caller   map[string]int
	lineage  map[string]int
	reserved map[string]int
}

// awaitBody takes, for a request admitted from its headers whose body may
// not all have arrived, a slot of its caller's until the body has (a read
// of it ends, EOF or not) or its handler returns: of the node's own
// BodyReserve first, then of its lineage's share (MaxLineageStreams), and
// of the caller's MaxStreams. The handler of such a call waits for the
// body until the read timeout, its goroutine and its stream held: a rogue
// that sent headers alone, a call after another on every connection its
// lineage may hold, had its budget pay for as many waiting handlers as it
// liked — 800 on four connections, and 250 a connection on as many as
// half the server's (rogue36b test). A client stream (MessagesCharged)
// holds a stream slot instead; a tool server's Evidence and Relayed calls
// are not bounded so (they are not priced either).
func (i *Interceptor) awaitBody(p Principal, r *http.Request) (release func(), err error) {
	if r.Body == nil || r.Body == http.NoBody || i.MessagesCharged[r.URL.Path] {
		return nil, nil
	}
	return i.bodies.take(i, p, r.URL.Path, "calls whose request bodies have not all arrived", "send their bodies first")
}

// TakeAnswer takes, for an admitted unary call whose answer is about to
// be written, a slot of its caller's until the answer's stream ends
// (release): as awaitBody's, counted apart. A client that grants no
// flow-control window (HTTP/2) kept each answer waiting until the write
// timeout, its handler's goroutine, its answer and its stream held, on
// as many connections as its lineage may hold: a unary answer never read
// was bounded per connection only (rogue37b test). An error: the caller
// has too many answers being written; the answer is not to be written
// (its stream is reset). A tool server's Evidence and Relayed calls are
// not bounded so.
func (i *Interceptor) TakeAnswer(p Principal, procedure string) (release func(), err error) {
	return i.answers.take(i, p, procedure, "answers being written that its client has not taken", "read their answers first")
}

// take takes a slot of b for p's call of procedure (see awaitBody); what
// names what b counts and fix what the caller should do, in a refusal.
func (b *bodies) take(i *Interceptor, p Principal, procedure, what, fix string) (release func(), err error) {
	if p.Kind == KindToolServer && (i.Evidence[procedure] || i.Relayed[procedure]) {
		return nil, nil
	}
	lineage := ""
	if p.IsAgent() && i.MaxLineageStreams > 0 {
		lineage = p.Lineage
	}
	if i.MaxStreams <= 0 && lineage == "" {
		return nil, nil
	}
	key := p.ID()
	b.mu.Lock()
	defer b.mu.Unlock()
	if i.MaxStreams > 0 && b.caller[key] >= i.MaxStreams {
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("auth: %s already has %d %s, the limit per caller (tether serve --max-streams-per-caller); %s", key, i.MaxStreams, what, fix))
	}
	reserved := false
	if lineage != "" {
		reserved = b.reserved[key] < i.BodyReserve
		if !reserved && b.lineage[lineage] >= i.MaxLineageStreams {
			return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("auth: lineage %s (%s shares it with its root and every descendant) already has %d %s, the limit per lineage (tether serve --max-streams-per-lineage), and %s its own %d beside them; %s", lineage, key, i.MaxLineageStreams, what, key, i.BodyReserve, fix))
		}
	}
	if b.caller == nil {
		b.caller, b.lineage, b.reserved = map[string]int{}, map[string]int{}, map[string]int{}
	}
	b.caller[key]++
	switch {
	case reserved:
		b.reserved[key]++
	case lineage != "":
		b.lineage[lineage]++
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			b.mu.Lock()
			defer b.mu.Unlock()
			dec := func(m map[string]int, k string) {
				if m[k]--; m[k] <= 0 {
					delete(m, k)
				}
			}
			dec(b.caller, key)
			switch {
			case reserved:
				dec(b.reserved, key)
			case lineage != "":
				dec(b.lineage, lineage)
			}
		})
	}, nil
}

// awaitedBody gives its request's slot back (awaitBody) once a read of
// it ends the body, or it is closed.
type awaitedBody struct {
	io.ReadCloser
	release func()
}

func (b *awaitedBody) Read(buf []byte) (int, error) {
	n, err := b.ReadCloser.Read(buf)
	if err != nil {
		b.release()
	}
	return n, err
}

func (b *awaitedBody) Close() error {
	b.release()
	return b.ReadCloser.Close()
}

// AwaitedBodies returns how many admitted requests of principal (its ID)
// wait for their bodies, and how many of its lineage's share (lineage:
// its root's node id; "" for none).
func (i *Interceptor) AwaitedBodies(principal, lineage string) (int, int) {
	i.bodies.mu.Lock()
	defer i.bodies.mu.Unlock()
	return i.bodies.caller[principal], i.bodies.lineage[lineage]
}

// UnreadAnswers returns how many answers of principal's admitted unary
// calls are being written (TakeAnswer), and how many of its lineage's
// share (lineage: its root's node id; "" for none).
func (i *Interceptor) UnreadAnswers(principal, lineage string) (int, int) {
	i.answers.mu.Lock()
	defer i.answers.mu.Unlock()
	return i.answers.caller[principal], i.answers.lineage[lineage]
}
