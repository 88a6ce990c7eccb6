package agentsdk

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// CapabilityHeader carries the caller's capability token to a tool server.
// (Authorization stays free for the tool's own authentication.)
const CapabilityHeader = "X-Tether-Capability"

// ToolGate stands in front of tools. For each call it has the control plane
// verify the capability token and the caller's node state and record the
// call; it runs the handler under a context that a cancel order from the
// control plane cancels; and once the handler has returned it reports what
// the handler did: the cancel acknowledgement only when the handler stopped
// because of the cancel (it returned the context's error, context.Canceled
// or ErrCancelled), otherwise the end, completed (it returned nil, even
// after the order) or failed (its own error). A handler stopped by the
// caller's own cancellation (it returned the caller's context's error) is
// acknowledged if the control plane has ordered its cancel by the time the
// gate reports, and failed otherwise.
//
// A gate is the tool layer, not the agent: it authenticates with a
// tool-server token (`tether token create --tool-server NAME`, or
// AuthService.CreateToken with tool_server), which the agents whose calls
// it gates never hold. The control plane refuses tool-call reports from
// agent credentials and operator tokens, so an agent cannot end or
// acknowledge its own calls, and the record names the tool server that
// began, ended and acknowledged each one.
type ToolGate struct {
	// ID names the gate in the ledger (provenance of every entry): the tool
	// server's name in its token, or "" to let the control plane use it.
	ID   string
	conn *Conn

	mu       sync.Mutex
	inflight map[string]context.CancelCauseFunc
	// Cancel orders that arrived before their call was registered here,
	// each with how many begins had started by then: an order can only be
	// for a call whose begin had started (the control plane orders the
	// cancel of a call it recorded), so it is dropped once those begins
	// have all settled. Orders for calls this gate never began (a previous
	// process's, or a hostile peer's made-up ids) are not kept.
	orders    map[string]uint64
	begins    uint64
	beginning map[uint64]struct{}

	// NeverAck makes the gate ignore cancel orders and acknowledge no call,
	// not even one its caller cancelled (fault injection for tests and
	// demos: a gate that never acknowledges).
	NeverAck bool

	cancelWatch context.CancelFunc
	watchDone   chan struct{}
	watching    chan struct{}
}

// ErrCancelled is the cause of a handler's context when the control plane
// cancelled its call.
var ErrCancelled = errors.New("agentsdk: tool call cancelled by the control plane")

// NewToolGate returns a gate reporting as id over conn, which carries the
// tool server's token (id is that tool server's name, or ""), and starts
// following its cancel orders.
func NewToolGate(conn *Conn, id string) *ToolGate {
	ctx, cancel := context.WithCancel(context.Background())
	g := &ToolGate{ID: id, conn: conn, inflight: map[string]context.CancelCauseFunc{},
		orders: map[string]uint64{}, beginning: map[uint64]struct{}{},
		cancelWatch: cancel, watchDone: make(chan struct{}), watching: make(chan struct{})}
	go g.watch(ctx)
	return g
}

// HeldOrders reports how many cancel orders the gate holds for calls it
// has not registered (yet).
func (g *ToolGate) HeldOrders() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.orders)
}

// Ready is closed once the gate follows its cancel orders.
func (g *ToolGate) Ready() <-chan struct{} { return g.watching }

// Close stops following cancel orders.
func (g *ToolGate) Close() {
	g.cancelWatch()
	<-g.watchDone
}

func (g *ToolGate) watch(ctx context.Context) {
	defer close(g.watchDone)
	var once sync.Once
	for ctx.Err() == nil {
		sctx, scancel := context.WithCancel(ctx)
		stream, err := g.conn.Tool.WatchCancels(sctx, connect.NewRequest(&tetherv1.WatchCancelsRequest{GateId: g.ID}))
		refreshed := false
		if err == nil {
			once.Do(func() { close(g.watching) })
			stop := g.refreshWhileBusy(sctx, func() { refreshed = true; scancel() })
			for stream.Receive() {
				g.cancel(stream.Msg().CallId)
			}
			stop()
			stream.Close()
		}
		scancel()
		if refreshed && ctx.Err() == nil {
			continue // opened anew at once: the control plane sends every pending order again
		}
		t := time.NewTimer(200 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
	once.Do(func() { close(g.watching) })
}

// CancelWatchRefresh is how long a gate with calls in flight (or begins
// under way) keeps one WatchCancels stream before it opens another. The
// stream carries cancel orders only, so a silent one is what an honest
// control plane with nothing to cancel sends too: a hostile element on the
// gate's path (a proxy that stalls the stream, a peer) that held the
// stream open and relayed nothing had the gate deaf to every cancel order
// for good, its handlers running on past their cancel and the agent's
// abort recording them unacknowledged, even once the path was honest
// again (rogue43l test). The control plane sends every pending order again
// on a new stream, so a stalled stream costs a gate at most this long; a
// gate with nothing in flight keeps its stream (an order is only ever for
// a call it began, and a begin makes it busy).
const CancelWatchRefresh = 15 * time.Second

// cancelWatchRefresh is CancelWatchRefresh, in nanoseconds; a test sets
// it shorter.
var cancelWatchRefresh atomic.Int64

func init() { cancelWatchRefresh.Store(int64(CancelWatchRefresh)) }

// refreshWhileBusy calls refresh once the stream opened with sctx has
// lasted a refresh interval (cancelWatchRefresh) at a moment the gate has
// a call in flight or a begin under way; stop ends the watch of it.
func (g *ToolGate) refreshWhileBusy(sctx context.Context, refresh func()) (stop func()) {
	every := time.Duration(cancelWatchRefresh.Load())
	ticker := time.NewTicker(every)
	done := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		defer ticker.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case <-done:
				return
			case <-ticker.C:
			}
			g.mu.Lock()
			busy := len(g.inflight) > 0 || len(g.beginning) > 0
			g.mu.Unlock()
			if busy {
				refresh()
				return
			}
		}
	}()
	return func() { close(done); <-ended }
}

func (g *ToolGate) cancel(callID string) {
	if g.NeverAck {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if c, ok := g.inflight[callID]; ok {
		c(ErrCancelled)
		return
	}
	if len(g.beginning) > 0 && len(g.orders) < MaxEarlyOrders && len(callID) <= maxCallIDBytes {
		g.orders[callID] = g.begins
	}
}

// MaxEarlyOrders bounds the cancel orders a gate holds for calls it has
// not registered, however many begins are under way: an order is early by
// a round trip at most, and each begin settled walks the orders held.
const MaxEarlyOrders = 1024

// maxCallIDBytes bounds the call id of an order a gate holds: the control
// plane's call ids are some thirty bytes, and an order for a longer one
// (a hostile peer's, up to a message's 16 MiB each) is for no call this
// gate could begin. The TypeScript and Python gates hold the same.
const maxCallIDBytes = 256

// settled settles the begin numbered n: it drops the orders no begin
// still under way can be for. g.mu is held.
func (g *ToolGate) settled(n uint64) {
	delete(g.beginning, n)
	oldest := uint64(math.MaxUint64)
	for b := range g.beginning {
		oldest = min(oldest, b)
	}
	for id, begun := range g.orders {
		if begun < oldest {
			delete(g.orders, id)
		}
	}
}

// Call runs handler as one recorded tool call. It returns the control
// plane's refusal (permission_denied for a bad or revoked token,
// failed_precondition while the node drains) without running the handler.
// A call whose ctx ends while the control plane begins it is recorded as
// failed, also without running the handler, unless the control plane has
// ordered its cancel meanwhile (then it is acknowledged, as is a handler
// stopped by ctx after the order existed). After a cancel order, a handler
// that stops returns ctx's error (and Call returns ErrCancelled once the
// cancel is acknowledged); a handler that returns nil or its own error is
// recorded completed or failed, and Call returns what it returned. A
// handler that panics is recorded failed, the panic named in its error,
// and its panic then goes on (Middleware's server recovers it).
// The token must allow the scope "tool:" + tool.
func (g *ToolGate) Call(ctx context.Context, token, tool string, handler func(ctx context.Context) error) error {
	return g.CallScoped(ctx, token, tool, "", handler)
}

// CallScoped is Call for a tool whose grant is checked against
// requiredScope rather than "tool:" + tool (an MCP gateway records the
// tool "fs/read_file" under the scope "mcp:fs/read_file"). An empty
// requiredScope means "tool:" + tool.
func (g *ToolGate) CallScoped(ctx context.Context, token, tool, requiredScope string, handler func(ctx context.Context) error) error {
	// BeginCall does not follow the caller's cancellation: a caller that
	// gives up once the control plane has recorded the begin, but before
	// the answer arrives, would leave a call in flight in the ledger that
	// nobody ends (the gate never learns its id), blocking a drain and then
	// recorded as the gate's unacknowledged cancel. The gate waits for the
	// answer, and ends a call whose caller is gone without running it.
	g.mu.Lock()
	g.begins++
	n := g.begins
	g.beginning[n] = struct{}{}
	g.mu.Unlock()
	bctx, bcancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	begin, err := g.conn.Tool.BeginCall(bctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: token, Tool: tool, GateId: g.ID, RequiredScope: requiredScope}))
	bcancel()
	callID := ""
	if err == nil {
		callID = begin.Msg.GetCall().GetCallId()
		switch {
		case callID == "": // a proxy's, or a hostile peer's answer
			err = connect.NewError(connect.CodeInternal, errors.New("agentsdk: the control plane answered BeginCall without a call"))
		case begin.Msg.GetCall().GetTool() != tool:
			// Another call's answer (the control plane records the tool it
			// is asked for): run under it, the tool was recorded as that
			// call, whose end was already reported or is another gate's
			// (rogue45f test).
			err = connect.NewError(connect.CodeInternal, fmt.Errorf("agentsdk: the control plane answered BeginCall of %q with a call of another tool", clipUTF8(strings.ToValidUTF8(tool, "\uFFFD"), 128)))
		}
	}
	if err != nil {
		g.mu.Lock()
		g.settled(n)
		g.mu.Unlock()
		return err
	}
	hctx, cancel := context.WithCancelCause(context.WithValue(ctx, gateCallKey{}, gateCall{id: callID, node: begin.Msg.GetCall().GetNodeId()}))
	defer cancel(nil)
	g.mu.Lock()
	if _, taken := g.inflight[callID]; taken {
		// An answer naming a call this gate has in flight: the control
		// plane begins each call under an id of its own, so it is another
		// call's answer (a path that replays or crosses answers). Run
		// under it, the tool's registration replaced the other call's
		// cancel and its end removed it, and its EndCall recorded the other
		// call ended while that call's tool ran on, deaf to its cancel
		// (rogue45f test). The tool is not run and nothing is reported: the
		// call this answer should have named is unknown to the gate, and
		// stays in flight in the ledger (a termination records it
		// unacknowledged), as a call whose answer a path withholds.
		g.settled(n)
		g.mu.Unlock()
		return connect.NewError(connect.CodeInternal, fmt.Errorf("agentsdk: the control plane answered BeginCall with call %q, which this gate has in flight", clipUTF8(strings.ToValidUTF8(callID, "\uFFFD"), maxCallIDBytes)))
	}
	g.inflight[callID] = cancel
	_, early := g.orders[callID]
	delete(g.orders, callID)
	g.settled(n)
	g.mu.Unlock()
	if early {
		cancel(ErrCancelled)
	}
	var herr error
	var panicked any // the handler's panic, when it panicked
	switch {
	case early:
		// The control plane ordered the call's cancel before the tool ran
		// (the order came before BeginCall's answer): the handler is not
		// called. Run with a cancelled context, a tool that does its side
		// effect before it looks at its context (most never look) did it
		// after its stop, and the ledger read the call completed
		// (rogue43g test). The cancel is acknowledged below: the call
		// stopped on it.
		herr = ErrCancelled
	case ctx.Err() != nil:
		herr = context.Cause(ctx) // the caller left before the tool ran
	default:
		herr, panicked = runHandler(hctx, handler)
	}
	g.mu.Lock()
	delete(g.inflight, callID)
	g.mu.Unlock()
	if panicked != nil {
		// A handler that panicked (an input that crashes the tool, which
		// net/http's recovery then hides from a Middleware's server) is
		// recorded failed before its panic goes on: the call stayed in
		// flight in the ledger, held its drain to the deadline, and was
		// recorded as this gate's unacknowledged cancel (rogue39a test).
		g.reportFailed(ctx, callID, herr, token)
		panic(panicked)
	}

	// Report with a context that outlives a cancelled caller: the ledger
	// must hear how the call ended.
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer rcancel()
	// Only a handler the cancel order stopped acknowledges it. One that
	// returned a result after the order ran to its end (its side effect
	// happened), and one that failed on its own account failed: the ledger
	// records them as such, never as cancelled.
	if errors.Is(context.Cause(hctx), ErrCancelled) && (errorIs(herr, context.Canceled) || errorIs(herr, ErrCancelled)) {
		if _, err := g.conn.Tool.CancelAck(rctx, connect.NewRequest(&tetherv1.CancelAckRequest{CallId: callID, GateId: g.ID})); err != nil {
			return errors.Join(herr, err)
		}
		if !errors.Is(herr, ErrCancelled) {
			herr = ErrCancelled
		}
		return herr
	}
	// A handler stopped by its caller's own cancellation, before the gate
	// heard an order (an agent's run is cancelled on its abort signal, which
	// can arrive first; the control plane writes an aborting node's cancel
	// orders before it tells the agent): if the control plane has ordered
	// the cancel, the abort waits for this call's acknowledgement, and the
	// call did stop after the order existed, so the gate acknowledges it.
	// The control plane refuses the acknowledgement of a call with no order
	// (failed_precondition): the call then failed, with the caller's
	// cancellation as its error.
	if !g.NeverAck && stoppedByCaller(ctx, herr) {
		_, err := g.conn.Tool.CancelAck(rctx, connect.NewRequest(&tetherv1.CancelAckRequest{CallId: callID, GateId: g.ID}))
		if err == nil {
			return herr
		}
		if connect.CodeOf(err) != connect.CodeFailedPrecondition {
			return errors.Join(herr, err)
		}
	}
	req := &tetherv1.EndCallRequest{CallId: callID, GateId: g.ID, Failed: herr != nil}
	if herr != nil {
		req.Error = reportedError(herr, token)
	}
	if _, err := g.conn.Tool.EndCall(rctx, connect.NewRequest(req)); err != nil {
		return errors.Join(herr, err)
	}
	return herr
}

// runHandler runs handler, and recovers a panic of it: panicked is the
// panic's value (never nil when it panicked) and herr an error that names
// it.
func runHandler(ctx context.Context, handler func(ctx context.Context) error) (herr error, panicked any) {
	done := false
	defer func() {
		if done {
			return
		}
		panicked = recover()
		if panicked == nil {
			panicked = errHandlerPanicked
		}
		herr = fmt.Errorf("%w: %s", errHandlerPanicked, panicText(panicked))
	}()
	herr = handler(ctx)
	done = true
	return herr, nil
}

// errHandlerPanicked is the error a call whose handler panicked is
// recorded failed with.
var errHandlerPanicked = errors.New("agentsdk: the tool panicked")

// reportFailed records the call failed with herr (its report's context
// outlives ctx), and gives up on an error: it is called on the way to a
// panic.
func (g *ToolGate) reportFailed(ctx context.Context, callID string, herr error, token string) {
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer rcancel()
	_, _ = g.conn.Tool.EndCall(rctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: callID, GateId: g.ID, Failed: true, Error: reportedError(herr, token)}))
}

// reportedError is herr as EndCall reports it: the handler's error may
// echo anything (the agent's input), so only valid UTF-8 of a bounded size
// is sent (the call's end must reach the ledger, which keeps
// maxCallErrorBytes anyway), without the caller's token.
func reportedError(herr error, token string) string {
	return clipUTF8(strings.ToValidUTF8(withoutToken(errorText(herr), token), "\uFFFD"), maxCallErrorBytes)
}

// errNoText stands for the text of a tool's error that has none.
const errNoText = "agentsdk: the tool failed with an error that has no text"

// errorText is herr.Error(), or errNoText when that panics. A handler's
// error comes from code a rogue agent's input steers: a typed nil (a nil
// *T returned as an error, whose Error reads its receiver) panics when it
// is read, and the gate, panicking on its way to EndCall, left the call in
// flight for good: the agent's drain held to its deadline, its abort's
// cancel recorded unacknowledged (rogue40k test). The TypeScript and
// Python gates do the same.
func errorText(herr error) (text string) {
	defer func() {
		if recover() != nil {
			text = errNoText
		}
	}()
	return herr.Error()
}

// errorIs is errors.Is, false when herr's chain panics as it is walked
// (a typed nil's Unwrap or Is reading its receiver; see errorText).
func errorIs(herr, target error) (is bool) {
	defer func() {
		if recover() != nil {
			is = false
		}
	}()
	return errors.Is(herr, target)
}

// panicText is a handler's panic value as text, or a placeholder when
// describing it panics: fmt recovers one panic of a value's Error or
// String method, not a second one while it describes the first.
func panicText(v any) (text string) {
	defer func() {
		if recover() != nil {
			text = "a value that has no text"
		}
	}()
	return fmt.Sprint(v)
}

// gateCallKey keys the ToolGate call a handler runs in (a gateCall).
type gateCallKey struct{}

// gateCall is the call a handler runs in: its id and the node whose
// capability token began it, as the control plane answered BeginCall.
type gateCall struct{ id, node string }

// GateCallID returns the id of the ToolGate call whose handler runs under
// ctx (the control plane's call id, as BeginCall answered it), or "" outside
// a gate's handler. A Fence whose Check is IssuedGenerations names it in its
// question, so the control plane knows whose side effect it is asked about
// (the call's node, from its own ledger) and keeps it on the lease's holder
// only when the call is the holder's.
func GateCallID(ctx context.Context) string {
	c, _ := ctx.Value(gateCallKey{}).(gateCall)
	return c.id
}

// gateCallNode returns the node whose ToolGate call runs under ctx, or "".
func gateCallNode(ctx context.Context) string {
	c, _ := ctx.Value(gateCallKey{}).(gateCall)
	return c.node
}

// stoppedByCaller reports whether herr is the caller's own cancellation:
// ctx has ended and the handler returned its error (or cause).
func stoppedByCaller(ctx context.Context, herr error) bool {
	if herr == nil || ctx.Err() == nil {
		return false
	}
	return errorIs(herr, ctx.Err()) || errorIs(herr, context.Cause(ctx))
}

// Middleware guards an HTTP tool: the capability token comes in the
// X-Tether-Capability header (or "Authorization: Capability <token>"). A
// refused call answers 403 (bad or revoked token), 409 (node stopping) or
// 401 (no token); a cancelled call answers 499 if the handler wrote nothing.
// A handler that wrote its answer is recorded completed, even after a cancel
// order: the gate cannot tell what it did before it answered.
//
// The handler's request context is cancelled by the control plane's cancel
// order, not by its caller: an agent that closes its connection (or
// cancels its HTTP/2 stream) does not stop the handler, which runs to its
// end and is recorded as it ended (its answer is written to nobody). The
// caller is the agent the record is about: had its leaving cancelled the
// handler, an agent being drained could have a call whose side effect was
// done recorded failed ("context canceled") on its own word, and taken out
// of the drain's wait.
//
// The cancel order also cuts the call's exchange with its caller, which
// the caller controls and no context reaches: a read of the request's body
// not yet at its end fails with an error wrapping ErrCancelled, and so
// does every read after it, and once the handler has begun its answer
// (at the order or after it) its writes fail. A rogue agent that held back
// the rest of its body, or read none of a long answer, kept its handler
// waiting in that read or write for as long as it liked, so its abort
// waited out the acknowledgement window and recorded the gate's cancel
// unacknowledged (rogue40a tests). A call whose body the order cut short
// is acknowledged (it stopped on the order, whatever it answered); one
// whose answer was cut is completed. The cut sets the stream's read and
// write deadlines (http.ResponseController): behind a ResponseWriter that
// allows neither (a wrapper without Unwrap), a read or write already
// waiting is not cut, only the reads after the order.
func (g *ToolGate) Middleware(tool string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token := r.Header.Get(CapabilityHeader)
		if token == "" {
			if scheme, t, ok := strings.Cut(r.Header.Get("Authorization"), " "); ok && strings.EqualFold(scheme, "Capability") {
				token = t
			}
		}
		if token == "" {
			http.Error(w, "capability token required in "+CapabilityHeader, http.StatusUnauthorized)
			return
		}
		x := &gatedExchange{rc: http.NewResponseController(w), bodyEnded: r.Body == nil || r.Body == http.NoBody}
		rw := &trackingWriter{ResponseWriter: w, x: x}
		wrote := false
		err := g.Call(context.WithoutCancel(r.Context()), token, tool, func(ctx context.Context) error {
			gr := r.WithContext(ctx)
			if r.Body != nil {
				gr.Body = &gatedBody{ReadCloser: r.Body, x: x}
			}
			stop := context.AfterFunc(ctx, x.cancelOrdered)
			next.ServeHTTP(rw, gr)
			stop()
			var bodyCut bool
			wrote, bodyCut = x.handlerReturned()
			switch {
			case bodyCut:
				// The order cut its input short: it stopped on the order.
				return ctx.Err()
			case wrote:
				// It answered: whatever it did happened, even after a cancel.
				return nil
			}
			return ctx.Err()
		})
		if wrote || err == nil {
			return
		}
		switch {
		case errors.Is(err, ErrCancelled):
			http.Error(w, "tool call cancelled by the control plane", 499)
		case connect.CodeOf(err) == connect.CodeFailedPrecondition:
			http.Error(w, connect.CodeOf(err).String()+": "+errMessage(err), http.StatusConflict)
		case connect.CodeOf(err) == connect.CodePermissionDenied, connect.CodeOf(err) == connect.CodeUnauthenticated:
			http.Error(w, connect.CodeOf(err).String()+": "+errMessage(err), http.StatusForbidden)
		default:
			http.Error(w, "tool gate: "+errMessage(err), http.StatusBadGateway)
		}
	})
}

// maxCallErrorBytes is as much of a handler's error as the ledger keeps.
// Sending more could make EndCall larger than the control plane accepts,
// and the call's end would never be recorded.
const maxCallErrorBytes = 512

// withoutToken cuts the caller's capability token, and its signature (what
// makes a copy of it usable), out of a tool's error before the gate reports
// it: a handler's error may quote the agent's request, the ledger keeps the
// error for every viewer of a record, and the token is a bearer credential
// for tools. The TypeScript and Python gates do the same.
func withoutToken(s, token string) string { return withoutSecret(s, token, "capability token") }

// clipUTF8 keeps at most n bytes of s, cut at a character boundary.
func clipUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

func errMessage(err error) string {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Message()
	}
	return err.Error()
}

// trackingWriter is the ResponseWriter a gated handler writes its answer
// to: it notes that the answer began (and cuts it past a cancel order).
type trackingWriter struct {
	http.ResponseWriter
	x *gatedExchange
}

func (t *trackingWriter) WriteHeader(code int) { t.x.answering(); t.ResponseWriter.WriteHeader(code) }
func (t *trackingWriter) Write(b []byte) (int, error) {
	t.x.answering()
	return t.ResponseWriter.Write(b)
}

// gatedBody is the request body a gated handler reads: past the call's
// cancel order, a read ends with errBodyCut unless the body had ended.
type gatedBody struct {
	io.ReadCloser
	x *gatedExchange
}

func (b *gatedBody) Read(p []byte) (int, error) {
	if b.x.bodyRead(nil) {
		return 0, errBodyCut
	}
	n, err := b.ReadCloser.Read(p)
	if err != nil && b.x.bodyRead(err) {
		return n, errBodyCut
	}
	return n, err
}

// errBodyCut ends a gated handler's read of its request's body once the
// call's cancel order came.
var errBodyCut = fmt.Errorf("%w: the request's body was cut", ErrCancelled)

// gatedExchange is a gated HTTP call's exchange with its caller, which the
// call's cancel order cuts (Middleware): the caller holds it, and no
// context reaches a read of the body or a write of the answer that waits
// for the caller.
type gatedExchange struct {
	rc *http.ResponseController

	mu sync.Mutex
	// ordered: the cancel order came while the handler ran; over: the
	// handler returned (nothing is cut after it).
	ordered, over bool
	// wrote: the handler began its answer; writesCut: its writes were cut.
	wrote, writesCut bool
	// bodyEnded: the body was read to its end (or there is none); bodyCut:
	// a read of it ended on the order before its end.
	bodyEnded, bodyCut bool
}

// longAgo is a deadline already passed: set, it ends the read or write
// waiting at once.
var longAgo = time.Unix(1, 0)

// cancelOrdered cuts the exchange on the call's cancel order: the body's
// read waiting, and the answer if the handler has begun it.
func (x *gatedExchange) cancelOrdered() {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.over {
		return
	}
	x.ordered = true
	if !x.bodyEnded {
		_ = x.rc.SetReadDeadline(longAgo)
	}
	if x.wrote {
		x.cutWrites()
	}
}

// cutWrites makes the answer's writes fail, the one waiting included.
// x.mu is held.
func (x *gatedExchange) cutWrites() {
	if !x.writesCut && !x.over {
		x.writesCut = true
		_ = x.rc.SetWriteDeadline(longAgo)
	}
}

// answering notes that the handler writes its answer, cut once the order
// came.
func (x *gatedExchange) answering() {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.wrote = true
	if x.ordered {
		x.cutWrites()
	}
}

// bodyRead notes how a read of the body ended (err nil: before one) and
// reports whether the order cut it.
func (x *gatedExchange) bodyRead(err error) (cut bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.bodyEnded {
		return false
	}
	if err == io.EOF {
		x.bodyEnded = true
		return false
	}
	if x.ordered {
		x.bodyCut = true
	}
	return x.ordered
}

// handlerReturned notes that the handler returned, and reports whether it
// began its answer and whether the order cut its body short.
func (x *gatedExchange) handlerReturned() (wrote, bodyCut bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.over = true
	return x.wrote, x.bodyCut
}
