package mcpgate

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tetherhq/tether/capability"
)

// stdioEndWait bounds how long the gateway, ending a stdio session whose
// grant was revoked, waits for the answers of the requests in flight on it
// to be written (an agent that does not read its stdout holds them) before
// it closes the session all the same.
const stdioEndWait = DefaultWriteStallTimeout

// stdioSession is the one agent session ServeStdio serves.
type stdioSession struct {
	conn *stdioConn
	// gone is closed when the gateway ends the session because its token's
	// grant was revoked (why is set before): its calls in flight stop
	// waiting, as an HTTP session's do (call).
	gone chan struct{}
	once sync.Once
	why  error
	// token is the last of the agent's tokens that verified (under mu).
	mu    sync.Mutex
	token string
	// ss is set once the session is connected, then connected is closed
	// (ss stays nil when the connection failed).
	ss        *mcp.ServerSession
	connected chan struct{}
	// done is closed once the session has closed (ServeStdio's).
	done chan struct{}
	// abandoned is closed when the session, ended, did not close within
	// stdioEndWait (an answer's write to an agent that does not read held
	// it): ServeStdio returns without it.
	abandoned chan struct{}
}

// agentStdio is the agent's stdio transport with its connection wrapped
// in conn. (The wrapper hides the SDK's unexported hook that tells its
// stdio connection the negotiated protocol revision, which it reads only
// to refuse batches from sessions at 2025-06-18 and later: the gateway
// refuses every batch before the SDK reads it, refuseStdioBatches.)
type agentStdio struct {
	mcp.Transport
	conn *stdioConn
}

func (t agentStdio) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := t.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	t.conn.Connection = c
	return t.conn, nil
}

// stdioConn keeps the ids of the agent's requests not yet answered, so
// that a session the gateway ends is closed once their answers have been
// written (the SDK drops the answers of a closing session), and each
// request's callMark: an answer to a request the control plane has not
// been told of is reported (seen) before it is written. The MCP SDK
// answers some requests before the gateway's handler sees them (a method
// it does not know, parameters it cannot read, a request before the
// session's initialize): unreported, a rogue behind `tether mcp wrap`
// that claimed its exit and went on sending such requests was answered,
// unseen. The handler finds its request's mark under the key the
// connection gives it (RequestExtra's Header, stdioCallHeader).
type stdioConn struct {
	mcp.Connection
	// seen reports the agent served (ServeStdio's), before an answer is
	// written to a request no one told the control plane of.
	seen  func(context.Context)
	mu    sync.Mutex
	open  map[jsonrpc.ID]*stdioCalls
	marks map[string]*callMark // by key, of the requests not yet answered
	next  uint64
}

// stdioCalls are the agent's requests under one id not yet answered.
type stdioCalls struct {
	answered chan struct{} // closed once all are
	keys     []string      // each one's mark's key
}

// stdioCallHeader is the key, in a stdio request's RequestExtra.Header,
// under which the gateway's handler finds its callMark.
const stdioCallHeader = "X-Tether-Stdio-Request"

func (c *stdioConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	msg, err := c.Connection.Read(ctx)
	if req, ok := msg.(*jsonrpc.Request); ok && err == nil && req.IsCall() {
		c.mu.Lock()
		if c.open == nil {
			c.open = map[jsonrpc.ID]*stdioCalls{}
			c.marks = map[string]*callMark{}
		}
		calls := c.open[req.ID]
		if calls == nil {
			calls = &stdioCalls{answered: make(chan struct{})}
			c.open[req.ID] = calls
		}
		// A request under an id in use is dropped by the SDK, unanswered:
		// kept, a rogue's requests under the id of its slow call stayed
		// until that call's answer, without end.
		if len(calls.keys) == 0 {
			key := strconv.FormatUint(c.next, 10)
			c.next++
			c.marks[key] = &callMark{}
			calls.keys = append(calls.keys, key)
			if req.Extra == nil {
				req.Extra = &mcp.RequestExtra{Header: http.Header{stdioCallHeader: {key}}}
			}
		}
		c.mu.Unlock()
	}
	return msg, err
}

// mark is the callMark of the request req carries the key of, or nil.
func (c *stdioConn) mark(req mcp.Request) *callMark {
	extra := req.GetExtra()
	if extra == nil || extra.Header == nil {
		return nil
	}
	key := extra.Header.Get(stdioCallHeader)
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.marks[key]
}

func (c *stdioConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	resp, isResp := msg.(*jsonrpc.Response)
	var calls *stdioCalls
	untold := false
	if isResp {
		c.mu.Lock()
		if calls = c.open[resp.ID]; calls != nil && len(calls.keys) > 0 {
			// The request it answers (one per id: Read keeps no other).
			i := 0
			for j, key := range calls.keys {
				if c.marks[key].tell() {
					i, untold = j, true
					break
				}
			}
			delete(c.marks, calls.keys[i])
			calls.keys = slices.Delete(calls.keys, i, i+1)
		}
		c.mu.Unlock()
	}
	if untold && c.seen != nil {
		c.seen(ctx)
	}
	err := c.Connection.Write(ctx, msg)
	if calls != nil {
		c.mu.Lock()
		if len(calls.keys) == 0 && c.open[resp.ID] == calls {
			close(calls.answered)
			delete(c.open, resp.ID)
		}
		c.mu.Unlock()
	}
	return err
}

// unanswered are the requests not yet answered.
func (c *stdioConn) unanswered() []chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]chan struct{}, 0, len(c.open))
	for _, calls := range c.open {
		out = append(out, calls.answered)
	}
	return out
}

// stdioRevoked is the stdio agent's token, and the verifier's word that
// its grant (or an ancestor) is revoked, or nil. The token is the token
// source's current one, or, when that cannot be read or does not verify,
// the last one that did (a token that verifies nowhere is refused per
// request): a revoked agent that broke its token file kept its session,
// its pings answered, as nothing could be judged. A token past its expiry
// still names its holder (Verifier.Holder): the last that verified, expired
// since, or else the source's, expired already — whose request the gateway
// reports as that holder seen, and whose revoked grant ends the session.
// Judged by Identify alone, an agent that outlived its token (no one
// renews a claimed node's) had ping, initialize and notifications served
// unreported, and its session kept through its grant's revocation.
func (g *Gateway) stdioRevoked(ctx context.Context) (string, error) {
	src, st := g.stdioToken.Load(), g.stdio.Load()
	if src == nil || st == nil {
		return "", nil
	}
	current, err := (*src).Token()
	var claims capability.Claims
	if err == nil {
		claims, err = g.cfg.Verifier.Identify(ctx, current)
	}
	st.mu.Lock()
	token := current
	if err == nil {
		st.token = current
	} else if st.token != "" {
		token = st.token
	}
	st.mu.Unlock()
	if err != nil {
		if token == "" {
			return "", nil
		}
		if claims, _ = g.cfg.Verifier.Holder(ctx, token); claims.HolderNodeID == "" {
			return "", nil
		}
	}
	return token, g.cfg.Verifier.Revoked(claims)
}

// checkStdio ends the stdio session if its token's grant is revoked.
func (g *Gateway) checkStdio() {
	st := g.stdio.Load()
	if st == nil {
		return
	}
	if _, err := g.stdioRevoked(context.Background()); err != nil {
		g.endStdio(st, err)
	}
}

// endStdio ends the stdio session, once, as endSession ends an HTTP one:
// its calls in flight answer the agent that its grant was revoked (each
// goes on at the upstream, recorded as it ends), and once the requests in
// flight have been answered (or stdioEndWait has passed) the session
// closes, and ServeStdio returns. The stdio session was never ended: a
// revoked agent behind `tether mcp wrap` kept it, pinged through it, and
// was handed the results of its calls in flight.
func (g *Gateway) endStdio(st *stdioSession, why error) {
	st.once.Do(func() {
		st.why = why
		close(st.gone)
		g.log.Info("mcpgate: ended the stdio session: its grant was revoked", "error", why)
		go func() {
			<-st.connected
			if st.ss == nil {
				return
			}
			timer := g.cfg.Clock.NewTimer(stdioEndWait)
			defer timer.Stop()
		wait:
			for _, answered := range st.conn.unanswered() {
				select {
				case <-answered:
				case <-timer.C():
					break wait
				case <-st.done:
					return
				}
			}
			// The SDK closes a session once its requests in flight have
			// returned, so a write the agent does not take holds it for ever:
			// ServeStdio gives up on it after stdioEndWait more (`tether mcp
			// wrap` exits all the same; it did not return at all).
			closed := make(chan struct{})
			go func() {
				_ = st.ss.Close()
				close(closed)
			}()
			stuck := g.cfg.Clock.NewTimer(stdioEndWait)
			defer stuck.Stop()
			select {
			case <-closed:
			case <-st.done:
			case <-stuck.C():
				close(st.abandoned)
			}
		}()
	})
}

// stdioOf is the stdio session when req came over stdio (no bearer),
// else nil.
func (g *Gateway) stdioOf(req mcp.Request) *stdioSession {
	if extra := req.GetExtra(); extra != nil && extra.TokenInfo != nil {
		return nil
	}
	return g.stdio.Load()
}
