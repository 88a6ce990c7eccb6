package mcpgate

import (
	"context"
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
// written (the SDK drops the answers of a closing session).
type stdioConn struct {
	mcp.Connection
	mu   sync.Mutex
	open map[jsonrpc.ID]chan struct{} // closed once answered
}

func (c *stdioConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	msg, err := c.Connection.Read(ctx)
	if req, ok := msg.(*jsonrpc.Request); ok && err == nil && req.IsCall() {
		c.mu.Lock()
		if c.open == nil {
			c.open = map[jsonrpc.ID]chan struct{}{}
		}
		if _, dup := c.open[req.ID]; !dup {
			c.open[req.ID] = make(chan struct{})
		}
		c.mu.Unlock()
	}
	return msg, err
}

func (c *stdioConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	err := c.Connection.Write(ctx, msg)
	if resp, ok := msg.(*jsonrpc.Response); ok {
		c.mu.Lock()
		if ch, ok := c.open[resp.ID]; ok {
			close(ch)
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
	for _, ch := range c.open {
		out = append(out, ch)
	}
	return out
}

// stdioRevoked is the stdio agent's token, and the verifier's word that
// its grant (or an ancestor) is revoked, or nil. The token is the token
// source's current one, or, when that cannot be read or does not verify,
// the last one that did (a token that verifies nowhere is refused per
// request): a revoked agent that broke its token file kept its session,
// its pings answered, as nothing could be judged.
func (g *Gateway) stdioRevoked(ctx context.Context) (string, error) {
	src, st := g.stdioToken.Load(), g.stdio.Load()
	if src == nil || st == nil {
		return "", nil
	}
	token, err := (*src).Token()
	var claims capability.Claims
	if err == nil {
		claims, err = g.cfg.Verifier.Identify(ctx, token)
	}
	st.mu.Lock()
	if err == nil {
		st.token = token
	} else {
		token = st.token
	}
	st.mu.Unlock()
	if err != nil {
		if token == "" {
			return "", nil
		}
		if claims, err = g.cfg.Verifier.Identify(ctx, token); err != nil {
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
