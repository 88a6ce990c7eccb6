package mcpgate

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/modelcontextprotocol/go-sdk/oauthex"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/internal/clock"
)

// tokenKey holds the raw capability token in auth.TokenInfo.Extra, for the
// per-call checks (the bearer of each HTTP request: a refreshed token is
// used from the next request on).
const tokenKey = "tether_capability_token"

// EndpointPath is where Handler serves MCP.
const EndpointPath = "/mcp"

// MetadataPath is where Handler serves the OAuth protected-resource
// metadata (RFC 9728) that MCP clients read to learn how to authenticate;
// it is also served under MetadataPath + EndpointPath.
const MetadataPath = "/.well-known/oauth-protected-resource"

// HTTPOptions configures Handler.
type HTTPOptions struct {
	// BaseURL is the gateway's public URL (scheme://host:port), the base
	// of the resource identifier in the protected-resource metadata.
	BaseURL string
	// AuthorizationServers are listed in the metadata (e.g. the control
	// plane's URL when it issues the agents' tokens); may be empty.
	AuthorizationServers []string
	// MaxSessionsPerNode bounds the MCP sessions one node (the holder of
	// the tokens that opened them) keeps open at once: its next initialize
	// is refused with CodeTooManySessions. Zero means
	// DefaultMaxSessionsPerNode.
	MaxSessionsPerNode int
	// SessionIdleTimeout closes a session that has had no request for
	// this long (an agent that died without closing its sessions does not
	// hold them forever). Zero means DefaultSessionIdleTimeout.
	SessionIdleTimeout time.Duration

	// The connection limits of HTTPServer (network timeouts, on the real
	// clock); zero means the default. ReadHeaderTimeout bounds reading a
	// request's headers, ReadTimeout its body (once the body is read, the
	// answer — a slow tool's, an SSE stream — has no deadline), and
	// IdleTimeout a keep-alive connection with no request in flight.
	// MaxHeaderBytes bounds a request's headers.
	ReadHeaderTimeout, ReadTimeout, IdleTimeout time.Duration
	MaxHeaderBytes                              int
	// WriteStallTimeout bounds each write of an answer to an agent: a
	// write (a chunk of a tool's result, an event of a stream) that the
	// agent does not take in this long ends its connection, and the
	// answer is dropped. An answer as such has no deadline (a slow tool's,
	// a session's stream); an agent that stops reading has. Zero means
	// DefaultWriteStallTimeout. (It is Handler's, not only HTTPServer's.)
	WriteStallTimeout time.Duration
	// MaxConnsPerNode bounds the connections to HTTPServer that one node
	// (the holder of the token of a request admitted on them) holds open:
	// its request on one more is refused (429, CodeTooManyConnections) and
	// that connection closed. A connection counts against every node whose
	// requests it carried, until it closes. Zero means the node's calls in
	// flight and its sessions, and 16 more (288 with the defaults): over
	// HTTP/1.1 each call in flight and each session's stream takes a
	// connection of its own. Negative means no bound. (Handler served by
	// another server is not bounded: the bound needs HTTPServer's hooks.)
	MaxConnsPerNode int
	// MaxBodyBytesPerNode bounds the bytes of request bodies one node has
	// in the gateway's memory at once: a request's body counts from its
	// first byte read until the request ends (its answer written), and a
	// request that would take the node past the bound is refused at once
	// (429, CodeTooManyBodyBytes) and its connection closed. The gateway
	// reads a request it admits whole (to count its calls in flight) and
	// the MCP SDK reads it again, so the memory held is up to about twice
	// the bound. Zero means DefaultMaxBodyBytesPerNode; negative means no
	// bound.
	MaxBodyBytesPerNode int64
}

// Defaults of HTTPOptions (the connection limits are `tether serve`'s).
const (
	DefaultMaxSessionsPerNode = 16
	DefaultSessionIdleTimeout = 30 * time.Minute
	DefaultReadHeaderTimeout  = 10 * time.Second
	DefaultReadTimeout        = 30 * time.Second
	DefaultIdleTimeout        = 2 * time.Minute
	DefaultMaxHeaderBytes     = 64 << 10
	DefaultWriteStallTimeout  = 30 * time.Second
	// DefaultMaxBodyBytesPerNode is four of the largest bodies the MCP
	// SDK takes (4 MiB each).
	DefaultMaxBodyBytesPerNode = 4 * mcp.DefaultMaxRequestBodyBytes
)

// HTTPServer is the server `tether mcp serve` runs: Handler behind
// connection limits. Without them, a client (any, before its bearer is
// checked) could hold keep-alive connections, slow bodies and slow
// headers open for ever, and enough of them take the gateway's file
// handles — the ones it needs to accept the other agents and to reach the
// control plane, where it reports how their calls ended.
//
// A node holds at most MaxConnsPerNode of its connections open: within
// the timeouts, a keep-alive connection with a request now and then (a
// ping a minute) stayed open for ever, and an agent holding as many as it
// could open took the gateway's file handles all the same.
func (g *Gateway) HTTPServer(opts HTTPOptions) *http.Server {
	read := cmp.Or(opts.ReadTimeout, DefaultReadTimeout)
	var open sync.Map // net.Conn → *heldConn
	return &http.Server{
		Handler:           bodyDeadline(read, g.Handler(opts)),
		ReadHeaderTimeout: cmp.Or(opts.ReadHeaderTimeout, DefaultReadHeaderTimeout),
		IdleTimeout:       cmp.Or(opts.IdleTimeout, DefaultIdleTimeout),
		MaxHeaderBytes:    cmp.Or(opts.MaxHeaderBytes, DefaultMaxHeaderBytes),
		// "OPTIONS *" goes to the handler, which closes its connection:
		// net/http's own answer kept it open, one such request a minute
		// holding it for ever, counted against no node.
		DisableGeneralOptionsHandler: true,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			hc := &heldConn{}
			open.Store(c, hc)
			return context.WithValue(ctx, heldConnKey{}, hc)
		},
		ConnState: func(c net.Conn, state http.ConnState) {
			if state != http.StateClosed && state != http.StateHijacked {
				return
			}
			if hc, ok := open.LoadAndDelete(c); ok {
				g.conns.release(hc.(*heldConn))
			}
		},
	}
}

// heldConnKey holds a connection's *heldConn in its requests' contexts.
type heldConnKey struct{}

// heldConn is one connection HTTPServer accepted: the nodes whose requests
// it carried (connCount's, under its lock), until it closed.
type heldConn struct {
	nodes  []string
	closed bool
}

// connCount counts the open connections of each node (HTTPServer's).
type connCount struct {
	mu     sync.Mutex
	max    int
	byNode map[string]int
}

// admit counts c against node, unless it counts already, or reports
// false when node holds the maximum (none when it is negative).
func (cc *connCount) admit(c *heldConn, node string) bool {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if c.closed || slices.Contains(c.nodes, node) {
		return true
	}
	if cc.max > 0 && cc.byNode[node] >= cc.max {
		return false
	}
	if cc.byNode == nil {
		cc.byNode = map[string]int{}
	}
	cc.byNode[node]++
	c.nodes = append(c.nodes, node)
	return true
}

// limit is the maximum.
func (cc *connCount) limit() int {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.max
}

// release uncounts a closed connection.
func (cc *connCount) release(c *heldConn) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	c.closed = true
	for _, node := range c.nodes {
		if cc.byNode[node]--; cc.byNode[node] <= 0 {
			delete(cc.byNode, node)
		}
	}
	c.nodes = nil
}

// closeAfter closes the connection after next's answer (a request no
// bearer admits keeps no connection open).
func closeAfter(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		next.ServeHTTP(w, r)
	})
}

// refuseRevoked refuses a request whose bearer the gateway's verifier
// knows revoked, with the check tools/call makes (Verifier.Verify: the
// revocation feed's tombstones of the grant and its chain), before the
// request is counted against its node or reaches a session. The bearer
// checked only the signature and expiry: a revoked (or terminated) node's
// token had its tools refused, but its ping kept its sessions and
// connections alive, and its initialize opened new ones, until the token
// expired. The refusal is 403 (the token verifies; its grant is dead) with
// a JSON-RPC error, CodeDenied, naming the grant (never the token), which
// the MCP SDKs' clients pass to the agent as the request's error; the
// connection is closed after it (Handler's Connection: close stays).
func (g *Gateway) refuseRevoked(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info := auth.TokenInfoFromContext(r.Context())
		var token string
		if info != nil {
			token, _ = info.Extra[tokenKey].(string)
		}
		if token == "" {
			next.ServeHTTP(w, r)
			return
		}
		if _, err := g.cfg.Verifier.Verify(r.Context(), token); err != nil {
			g.reportRefused(r.Context(), token, info.UserID, err)
			status := http.StatusUnauthorized
			refusal := verifierRefusal(err)
			switch refusal.Code {
			case CodeDenied:
				status = http.StatusForbidden
			case CodeUnavailable:
				status = http.StatusServiceUnavailable
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_, _ = w.Write(errorAnswer(requestID(r), refusal))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// MaxRefusedBodyBytes is the most of a request's body the door reads to
// find the JSON-RPC id it refuses the request under (refuseRevoked): the
// refused request is counted against no node, so what the door reads of
// it is held for as many such requests as a client sends at once.
const MaxRefusedBodyBytes = 64 << 10

// requestID is the id of the JSON-RPC request r's body carries, or null:
// an MCP client takes an HTTP error's JSON-RPC error as its request's
// answer only under the request's id. It reads at most
// MaxRefusedBodyBytes of the body: a revoked rogue's bodies of 4 MiB (the
// SDK's limit), their last byte held back, were each read and held whole,
// as many as it opened connections. A body that does not end within the
// part read has its id found there when it comes first (as the Go and
// Python SDKs write it), a top-level key; otherwise the answer is under
// null.
func requestID(r *http.Request) json.RawMessage {
	null := json.RawMessage("null")
	if r.Method != http.MethodPost || r.Body == nil || r.Body == http.NoBody {
		return null
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxRefusedBodyBytes+1))
	if err != nil {
		return null
	}
	if len(body) > MaxRefusedBodyBytes {
		return leadingID(body[:MaxRefusedBodyBytes])
	}
	msg, err := jsonrpc.DecodeMessage(body)
	req, ok := msg.(*jsonrpc.Request)
	if err != nil || !ok || !req.IsCall() {
		return null
	}
	id, err := json.Marshal(req.ID.Raw())
	if err != nil {
		return null
	}
	return id
}

// leadingID is the id among the top-level keys of the JSON object that
// part begins (the last one, as the SDK's decoder takes it), up to where
// part ends or stops being JSON; null when there is none, or it is not a
// JSON-RPC id.
func leadingID(part []byte) json.RawMessage {
	null := json.RawMessage("null")
	dec := json.NewDecoder(bytes.NewReader(part))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return null
	}
	var found any
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			break
		}
		var v any
		if err := dec.Decode(&v); err != nil {
			break
		}
		if key, _ := t.(string); key == "id" {
			found = v
		}
	}
	if found == nil {
		return null
	}
	id, err := jsonrpc.MakeID(found)
	if err != nil || !id.IsValid() {
		return null
	}
	b, err := json.Marshal(id.Raw())
	if err != nil {
		return null
	}
	return b
}

// limitConns refuses a request of a node that holds its maximum of
// connections, on a connection it does not hold yet, and closes that
// connection (HTTPServer's connections only). A request it admits keeps
// its connection open (Handler closes every other after its answer).
func (g *Gateway) limitConns(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hc, _ := r.Context().Value(heldConnKey{}).(*heldConn)
		info := auth.TokenInfoFromContext(r.Context())
		if hc != nil && info != nil && !g.conns.admit(hc, info.UserID) {
			// The node answered, reported before it is: refused unreported,
			// a rogue holding its connections from before its claim of exit
			// was answered on each new one unseen.
			token, _ := info.Extra[tokenKey].(string)
			g.reportSeen(r.Context(), token, info.UserID)
			// Handler set Connection: close: the connection closes after this.
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = w.Write(errorAnswer(json.RawMessage("null"), rpcError(CodeTooManyConnections, "node %s already holds %d connections open to this gateway, the maximum; send over one it holds, or close one", info.UserID, g.conns.limit())))
			return
		}
		w.Header().Del("Connection")
		next.ServeHTTP(w, r)
	})
}

// bodyDeadline gives a request's body d to arrive, from the request's
// start; once it is read to its end (or there is none) the deadline is
// lifted, so that a long answer — a slow tool's result, a session's SSE
// stream — lives as long as it needs. (http.Server's ReadTimeout would
// cancel those too.)
func bodyDeadline(d time.Duration, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		if r.Body == nil || r.Body == http.NoBody {
			_ = rc.SetReadDeadline(time.Time{})
		} else {
			_ = rc.SetReadDeadline(time.Now().Add(d))
			r.Body = &liftAtEOF{ReadCloser: r.Body, rc: rc}
		}
		next.ServeHTTP(w, r)
	})
}

// liftAtEOF lifts the connection's read deadline once the body is read.
type liftAtEOF struct {
	io.ReadCloser
	rc   *http.ResponseController
	once sync.Once
}

func (b *liftAtEOF) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.once.Do(func() { _ = b.rc.SetReadDeadline(time.Time{}) })
	}
	return n, err
}

// Handler serves the gateway as a Streamable HTTP MCP endpoint at
// EndpointPath. Every request must carry the agent's capability token as
// its bearer; a request without a valid one gets 401 with a
// WWW-Authenticate header pointing at the protected-resource metadata, and
// every request gets 503 while the revocation feed is stale.
// A node keeps at most MaxSessionsPerNode sessions open: every session is
// held in the gateway's memory, so an agent opening them in a loop must
// not exhaust the gateway the other agents' calls go through. A token the
// gateway's verifier knows revoked (its grant's, or an ancestor's,
// tombstone: a terminated node's grants are revoked) is refused at this
// door, every request, with 403 and the reason (CodeDenied). A session
// belongs to the node that holds the token that opened it.
func (g *Gateway) Handler(opts HTTPOptions) http.Handler {
	base := strings.TrimRight(opts.BaseURL, "/")
	meta := &oauthex.ProtectedResourceMetadata{
		Resource:               base + EndpointPath,
		AuthorizationServers:   opts.AuthorizationServers,
		BearerMethodsSupported: []string{"header"},
		ResourceName:           "Tether MCP gateway",
		ScopesSupported:        g.Scopes(),
	}
	g.sessions.setMax(cmp.Or(opts.MaxSessionsPerNode, DefaultMaxSessionsPerNode))
	g.conns.mu.Lock()
	g.conns.max = cmp.Or(opts.MaxConnsPerNode, g.calls.max+cmp.Or(opts.MaxSessionsPerNode, DefaultMaxSessionsPerNode)+16)
	g.conns.mu.Unlock()
	g.bodies.setMax(cmp.Or(opts.MaxBodyBytesPerNode, DefaultMaxBodyBytesPerNode))
	mcpHandler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return g.server }, &mcp.StreamableHTTPOptions{
		SessionTimeout: cmp.Or(opts.SessionIdleTimeout, DefaultSessionIdleTimeout),
	})
	bearer := auth.RequireBearerToken(g.verifyBearer, &auth.RequireBearerTokenOptions{
		ResourceMetadataURL: base + MetadataPath + EndpointPath,
	})(g.refuseRevoked(g.holdSeen(g.limitConns(g.refuseBatches(g.holdCalls(g.refuseClosed(mcpHandler)))))))
	mux := http.NewServeMux()
	mux.Handle(MetadataPath, auth.ProtectedResourceMetadataHandler(meta))
	mux.Handle(MetadataPath+EndpointPath, auth.ProtectedResourceMetadataHandler(meta))
	mux.Handle(EndpointPath, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A closed gateway serves nothing: its reports to the control plane
		// are over (Close sent the last), and the sessions it had opened
		// answered ping and tools/list on, unreported, for as long as the
		// handler was served — a rogue that claimed its exit was answered
		// unseen by a gateway its embedder had closed.
		select {
		case <-g.closed:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write(errorAnswer(json.RawMessage("null"), rpcError(CodeUnavailable, "this gateway is closed; reach the one that replaces it")))
			return
		default:
		}
		// Fail closed before anything else when revocations may be unknown.
		if err := g.cfg.Verifier.Fresh(); err != nil {
			// A bearer that names its holder (offline: the signature, a
			// token past its expiry included) is that node refused,
			// reported before it is: refused unreported, a rogue that
			// claimed its exit and knocked on through the feed's outage
			// left the record reading its exit confirmed. (The report,
			// the control plane out of reach, is owed until it lands.)
			if f := strings.Fields(r.Header.Get("Authorization")); len(f) == 2 && strings.EqualFold(f[0], "bearer") {
				g.noteSeen(r.Context(), f[1])
			}
			http.Error(w, "tether: the gateway has not heard the control plane's revocation feed recently; retry later", http.StatusServiceUnavailable)
			return
		}
		bearer.ServeHTTP(w, r)
	}))
	// Every connection is closed after the answer unless the bearer admits
	// the request (limitConns keeps it open): a client without a token,
	// refused, answered the metadata or a 404 of a path not served here,
	// kept its keep-alive connections open with one such request a minute,
	// as many as it opened, counted against no node.
	return writeStallDeadline(cmp.Or(opts.WriteStallTimeout, DefaultWriteStallTimeout), closeAfter(mux))
}

// writeStallDeadline gives each write of an answer d to reach the agent.
// The gateway holds what it has not written — up to a tool's whole result,
// 16 MiB, per call — so an agent that asked and then read nothing kept it
// in memory for as long as it kept its connection (one per call, up to its
// calls in flight, and a swarm's agents each as many). Each write and
// flush is now armed with d (from when it starts, so a long answer the
// agent keeps reading has no deadline as a whole); one the agent does not
// take in d fails, which ends the request and closes the connection. A
// request starts with the deadline cleared (a keep-alive connection keeps
// the last one armed), and the server's own last flush after the handler
// gets d too.
// refuseClosed refuses a request that reaches the MCP SDK's handler once
// the gateway is closed, as its door does. The gateway's MCP server refuses
// what reaches it then (middleware), but the SDK's handler answers some
// requests itself, before that server: a request of a session it does not
// know, a GET stream, a body it cannot read. One already past the door as
// Close began was answered so, its report not sent (the reports were
// over): a rogue that held its body back until the gateway was closing was
// answered, unseen. A request that passes this check had its report made
// (holdCalls) before Close began, which sends it. (Its answer, written
// later by the SDK, is the request's; a tools/call's report made as its
// answer is written, reportFirst, may still come after the reports are
// over.)
func (g *Gateway) refuseClosed(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-g.closed:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write(errorAnswer(requestID(r), rpcError(CodeUnavailable, "this gateway is closed; reach the one that replaces it")))
			return
		default:
		}
		next.ServeHTTP(w, r)
	})
}

func writeStallDeadline(d time.Duration, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		_ = rc.SetWriteDeadline(time.Time{})
		sw := &stallWriter{ResponseWriter: w, rc: rc, d: d}
		next.ServeHTTP(sw, r)
		sw.arm()
	})
}

// stallWriter arms the connection's write deadline before each write.
type stallWriter struct {
	http.ResponseWriter
	rc *http.ResponseController
	d  time.Duration
}

func (w *stallWriter) arm() { _ = w.rc.SetWriteDeadline(time.Now().Add(w.d)) }

func (w *stallWriter) Write(p []byte) (int, error) {
	w.arm()
	return w.ResponseWriter.Write(p)
}

func (w *stallWriter) Flush() { _ = w.FlushError() }

func (w *stallWriter) FlushError() error {
	w.arm()
	return w.rc.Flush()
}

// Unwrap lets an http.ResponseController reach the connection.
func (w *stallWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// refuseBatches answers a POST whose body is a JSON-RPC batch with 400 and
// a JSON-RPC error, before any of it runs. A batch is as many requests as
// fit in one body, all run at once, their answers held in memory until the
// last is ready; MCP has none since 2025-06-18 and no MCP SDK's client
// sends them, but the SDK's server still takes them under 2025-03-26.
// The refusal is the node served (reportSeen), reported before it is
// answered as any request is: a rogue that claimed its exit and went on
// POSTing batches was answered, unseen.
func (g *Gateway) refuseBatches(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.Body != nil && r.Body != http.NoBody {
			br := bufio.NewReader(r.Body)
			// The first byte that is not JSON whitespace says: '[' is a batch.
			// Whitespace beyond the SDK's body limit is left to it to refuse.
			for range mcp.DefaultMaxRequestBodyBytes {
				c, err := br.ReadByte()
				if err != nil {
					break
				}
				if c == ' ' || c == '\t' || c == '\r' || c == '\n' {
					continue
				}
				_ = br.UnreadByte()
				if c == '[' {
					if info := auth.TokenInfoFromContext(r.Context()); info != nil {
						token, _ := info.Extra[tokenKey].(string)
						g.reportSeen(r.Context(), token, info.UserID)
					}
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(http.StatusBadRequest)
					_, _ = io.WriteString(w, `{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"tether: JSON-RPC batches are refused: send one request per POST (MCP has no batches since 2025-06-18)"}}`+"\n")
					return
				}
				break
			}
			r.Body = struct {
				io.Reader
				io.Closer
			}{br, r.Body}
		}
		next.ServeHTTP(w, r)
	})
}

// heldKey holds, in a request's auth.TokenInfo.Extra, the *callHold of a
// tools/call that holdCalls counted against its node's calls in flight:
// call joins it rather than count the call again.
const heldKey = "tether_call_held"

// callHold is one count of a node's calls in flight, held by the HTTP
// request that carries a call and by the call itself: released when both
// have ended. (An agent that closes its connection does not cancel its
// call, which goes on at the upstream; one that does not read its answer
// has the call end while the request goes on.)
type callHold struct {
	calls *callCount
	node  string
	mu    sync.Mutex
	refs  int
	// ended is closed when the HTTP request has ended, its answer written
	// (or the agent gone): a session the gateway ends waits for it.
	ended chan struct{}
}

// join adds a holder, unless the count was released already.
func (h *callHold) join() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.refs == 0 {
		return false
	}
	h.refs++
	return true
}

func (h *callHold) leave() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.refs--; h.refs == 0 {
		h.calls.release(h.node)
	}
}

// holdCalls counts a node's tools/call and tools/list against its calls in
// flight (Config.MaxCallsPerNode) until the HTTP request that carries it
// ends — until its answer has been written to the agent, or the agent's
// connection has ended — and a tools/call until the call has ended too,
// and refuses one past the maximum with CodeTooManyCalls, before the SDK
// reads it. Counted only until the upstream answered, a call's answer
// written to an agent that does not read it was held in the gateway's
// memory, with its connection, while the node's count went back down: a
// rogue could have as many answers held as it opened connections.
func (g *Gateway) holdCalls(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info := auth.TokenInfoFromContext(r.Context())
		if info == nil || info.Extra == nil {
			next.ServeHTTP(w, r)
			return
		}
		node := info.UserID
		token, _ := info.Extra[tokenKey].(string)
		if r.Method != http.MethodPost || r.Body == nil || r.Body == http.NoBody {
			// A GET stream, a session's DELETE: the node served, reported at
			// its opening only, so that its node's report state is let go
			// of (holdSeen): a stream held for a session's life held its
			// node's place for as long.
			g.reportSeen(r.Context(), token, node)
			if unpin, ok := info.Extra[unpinKey].(func()); ok {
				unpin()
			}
			next.ServeHTTP(w, r)
			return
		}
		body, held, err := g.bodies.read(node, r.Body, mcp.DefaultMaxRequestBodyBytes+1)
		defer g.bodies.give(node, held)
		if errors.Is(err, errTooManyBodyBytes) {
			// The node answered, reported before it is (as limitConns does).
			g.reportSeen(r.Context(), token, node)
			w.Header().Set("Connection", "close") // the rest of the body is not read
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = w.Write(errorAnswer(json.RawMessage("null"), rpcError(CodeTooManyBodyBytes, "node %s's request bodies held by this gateway (being read, or their requests in flight) would pass the maximum of %d bytes with this request's; wait for its requests to end, or send smaller ones", node, g.bodies.limit())))
			return
		}
		r.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(body), r.Body), r.Body}
		if err != nil || len(body) > mcp.DefaultMaxRequestBodyBytes {
			g.reportSeen(r.Context(), token, node)
			next.ServeHTTP(w, r) // the SDK refuses it
			return
		}
		// The request as the SDK's server reads it (the last of a key named
		// twice, its own decoder's rules), not a scan of its own: a body
		// naming "ping" and then "tools/list" was a listing to the SDK and
		// went uncounted here.
		msg, err := jsonrpc.DecodeMessage(body)
		req, isReq := msg.(*jsonrpc.Request)
		if err != nil || !isReq || !req.IsCall() || req.Method != "tools/call" {
			// Any request but a tool call (which the ledger sees begin) is
			// the node served, reported before it is: a rogue's ping after
			// its claim of exit was served offline, unseen.
			g.reportSeen(r.Context(), token, node)
		}
		if err != nil || !isReq || !req.IsCall() || (req.Method != "tools/call" && req.Method != "tools/list") {
			next.ServeHTTP(w, r)
			return
		}
		id, err := json.Marshal(req.ID.Raw())
		if err != nil {
			next.ServeHTTP(w, r)
			return
		}
		if !g.calls.take(node) {
			if req.Method == "tools/call" {
				g.reportSeen(r.Context(), token, node) // refused here, never begun
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(errorAnswer(id, rpcError(CodeTooManyCalls, "node %s already has %d tool calls and listings in flight through this gateway (each until its answer is read), the maximum; wait for one to end", node, g.calls.max)))
			return
		}
		hold := &callHold{calls: &g.calls, node: node, refs: 1, ended: make(chan struct{})}
		defer hold.leave()
		defer close(hold.ended)
		info.Extra[heldKey] = hold
		if req.Method == "tools/call" {
			// A call answered without being begun (a tool the gateway does
			// not have, parameters refused, by the gateway or by the SDK
			// before it) is the node served, reported before its answer.
			mark := &callMark{}
			info.Extra[markKey] = mark
			w = &reportFirst{ResponseWriter: w, before: func() {
				if mark.tell() {
					g.reportSeen(r.Context(), token, node)
				}
			}}
		}
		next.ServeHTTP(w, r)
	})
}

// verifyBearer is the auth.TokenVerifier: the capability token's signature
// and expiry, checked offline. Revocation is checked next, by
// refuseRevoked, where the refusal can say why in JSON-RPC (the bearer's
// refusal is a bare 401), and scopes per MCP request (tools/list,
// tools/call). The
// session's user is the node that holds the grant, so another node's
// token cannot ride on a session it did not open.
func (g *Gateway) verifyBearer(ctx context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
	claims, err := g.cfg.Verifier.Identify(ctx, token)
	if err != nil {
		// A token past its expiry still names its holder: its 401 is that
		// node answered, reported before it is (a rogue that claimed its
		// exit and outlived its token was refused unseen).
		if errors.Is(err, capability.ErrTokenExpired) {
			g.noteSeen(ctx, token)
		}
		return nil, fmt.Errorf("%w: %v", auth.ErrInvalidToken, err)
	}
	return &auth.TokenInfo{
		Scopes:     claims.Scopes,
		Expiration: claims.ExpiresAt,
		UserID:     claims.HolderNodeID,
		Extra:      map[string]any{tokenKey: token, claimsKey: claims},
	}, nil
}

// sessionCount counts the open HTTP sessions of each node, and keeps
// what each was last admitted with (its request's grant), so that the
// gateway can end a session whose grant the revocation feed kills.
type sessionCount struct {
	mu        sync.Mutex
	max       int
	byNode    map[string]map[*mcp.ServerSession]bool
	bySession map[*mcp.ServerSession]*sessionState
}

// sessionState is one HTTP session the gateway holds.
type sessionState struct {
	// claims are those of the token of the session's latest request (a
	// refreshed token is the same grant's), under sessionCount.mu.
	claims capability.Claims
	// gone is closed when the gateway ends the session because that grant
	// was revoked: its requests in flight stop waiting (a tools/call's
	// upstream call goes on, and is recorded), so that it can close.
	gone  chan struct{}
	ended bool  // gone is closed (under sessionCount.mu)
	why   error // why it was ended, set before gone is closed
	// calls are the HTTP requests of its tools/call in flight (under
	// sessionCount.mu): the session closes once they have ended, so that
	// their answers are written first (the SDK drops the answers of a
	// closing session).
	calls map[*callHold]bool
}

func (c *sessionCount) setMax(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.max = n
}

// admit counts the session an initialize opens for its token's holder,
// until the session closes, or refuses it when the holder is at the
// maximum (the SDK then closes the session it had opened). Sessions not
// opened over HTTP (stdio: one per process) are not counted.
func (c *sessionCount) admit(req mcp.Request) *jsonrpc.Error {
	extra := req.GetExtra()
	ss, ok := req.GetSession().(*mcp.ServerSession)
	if extra == nil || extra.TokenInfo == nil || !ok {
		return nil
	}
	node := extra.TokenInfo.UserID
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.max <= 0 {
		if c.bySession[ss] == nil {
			c.track(ss, func() {})
		}
		return nil
	}
	open := c.byNode[node]
	if open[ss] {
		return nil
	}
	if len(open) >= c.max {
		return rpcError(CodeTooManySessions, "node %s already has %d MCP sessions open on this gateway, the maximum; close one (DELETE the session) or let one idle out", node, len(open))
	}
	if open == nil {
		if c.byNode == nil {
			c.byNode = map[string]map[*mcp.ServerSession]bool{}
		}
		open = map[*mcp.ServerSession]bool{}
		c.byNode[node] = open
	}
	open[ss] = true
	c.track(ss, func() {
		delete(open, ss)
		if len(open) == 0 && len(c.byNode[node]) == 0 {
			delete(c.byNode, node)
		}
	})
	return nil
}

// track keeps ss's state until it closes, then forgets it and runs
// untrack (both under c.mu). Callers hold c.mu.
func (c *sessionCount) track(ss *mcp.ServerSession, untrack func()) {
	if c.bySession == nil {
		c.bySession = map[*mcp.ServerSession]*sessionState{}
	}
	c.bySession[ss] = &sessionState{gone: make(chan struct{})}
	go func() {
		_ = ss.Wait()
		c.mu.Lock()
		defer c.mu.Unlock()
		delete(c.bySession, ss)
		untrack()
	}()
}

// note records claims as those of ss's latest request and returns its
// state, or nil when ss is not a session the gateway holds (stdio).
func (c *sessionCount) note(ss *mcp.ServerSession, claims capability.Claims) *sessionState {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.bySession[ss]
	if st != nil {
		st.claims = claims
	}
	return st
}

// enter counts h as one of st's calls in flight, or reports false when
// the gateway has ended st.
func (c *sessionCount) enter(st *sessionState, h *callHold) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st.ended {
		return false
	}
	if st.calls == nil {
		st.calls = map[*callHold]bool{}
	}
	st.calls[h] = true
	return true
}

// leave uncounts h.
func (c *sessionCount) leave(st *sessionState, h *callHold) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(st.calls, h)
}

// state is ss's state, or nil.
func (c *sessionCount) state(ss *mcp.ServerSession) *sessionState {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bySession[ss]
}

// held lists the sessions held and the claims of each one's latest request.
func (c *sessionCount) held() map[*mcp.ServerSession]capability.Claims {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[*mcp.ServerSession]capability.Claims, len(c.bySession))
	for ss, st := range c.bySession {
		if st.claims.GrantID != "" {
			out[ss] = st.claims
		}
	}
	return out
}

// claimsKey holds, in a request's auth.TokenInfo.Extra, the claims of its
// bearer (verifyBearer's).
const claimsKey = "tether_claims"

// noteSession records the grant of an HTTP session's request (the claims
// of its bearer) and ends the session if that grant is known revoked
// already. Recorded first, checked second, as endRevokedSessions checks
// what is recorded after each revocation: a revocation applied as the
// request is noted is seen by one or the other.
func (g *Gateway) noteSession(req mcp.Request) {
	ss, ok := req.GetSession().(*mcp.ServerSession)
	extra := req.GetExtra()
	if !ok || extra == nil || extra.TokenInfo == nil {
		return
	}
	claims, ok := extra.TokenInfo.Extra[claimsKey].(capability.Claims)
	if !ok {
		return
	}
	st := g.sessions.note(ss, claims)
	if st == nil {
		return
	}
	if err := g.cfg.Verifier.Revoked(claims); err != nil {
		g.endSession(ss, st, err)
	}
}

// endRevokedSessions ends every HTTP session whose latest request's grant
// the verifier learns revoked, as it learns it (until the gateway
// closes). The door refused a revoked token's every request, but the
// sessions it had opened stayed, and with them their streams — the
// session's GET stream, a long call's answer — until they idled out.
//
// Each pass reads every session the gateway holds, so passes start
// RevocationScanInterval apart at the least (on the gateway's clock), any
// number of revocations within it making one pass at its end: a rogue
// revoking grants it delegates, in a loop (two requests of its budget
// each), had every gateway read all its sessions for each one.
func (g *Gateway) endRevokedSessions() {
	defer g.watchers.Done()
	var last time.Time // when the last pass a revocation asked for started
	for {
		revised := g.cfg.Verifier.Revised()
		for ss, claims := range g.sessions.held() {
			if err := g.cfg.Verifier.Revoked(claims); err != nil {
				if st := g.sessions.state(ss); st != nil {
					g.endSession(ss, st, err)
				}
			}
		}
		g.checkStdio()
		select {
		case <-revised:
		case <-g.closed:
			return
		}
		if !last.IsZero() {
			if at := last.Add(RevocationScanInterval); clock.Until(g.cfg.Clock, at) > 0 {
				timer := clock.NewTimerAt(g.cfg.Clock, at)
				select {
				case <-timer.C():
				case <-g.closed:
					timer.Stop()
					return
				}
			}
		}
		last = g.cfg.Clock.Now()
	}
}

// RevocationScanInterval is the least time between the starts of two
// passes over the gateway's sessions for revoked grants (each revocation
// the verifier applies asks for one): a revoked agent's sessions end
// within it of the revocation's arrival.
const RevocationScanInterval = 250 * time.Millisecond

// endSession ends ss, once: its requests in flight stop waiting (a
// tools/call answers the agent that its grant was revoked; the upstream
// call goes on and is recorded as it ends), and then the session closes,
// and with it its streams (the SDK closes a session once its requests in
// flight have returned).
func (g *Gateway) endSession(ss *mcp.ServerSession, st *sessionState, why error) {
	g.sessions.mu.Lock()
	if st.ended {
		g.sessions.mu.Unlock()
		return
	}
	st.ended, st.why = true, why
	close(st.gone)
	var calls []*callHold
	for h := range st.calls {
		calls = append(calls, h)
	}
	g.sessions.mu.Unlock()
	g.log.Info("mcpgate: ended an MCP session whose grant was revoked", "session", ss.ID(), "error", why)
	go func() {
		// Their answers first (each call stops waiting on gone, and its
		// request ends once its answer is written, or its agent is gone, or
		// a write stalls past the write-stall timeout).
		for _, h := range calls {
			<-h.ended
		}
		_ = ss.Close()
	}()
}

// bodyBudget counts the bytes of request bodies each node has in the
// gateway's memory (holdCalls reads them), against a maximum.
type bodyBudget struct {
	mu     sync.Mutex
	max    int64 // none when negative
	byNode map[string]int64
}

// errTooManyBodyBytes: the node's bodies would exceed the maximum.
var errTooManyBodyBytes = errors.New("mcpgate: the node's request bodies would exceed the gateway's maximum")

func (b *bodyBudget) setMax(n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.max = n
}

func (b *bodyBudget) limit() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.max
}

// take counts up to n more bytes against node, as many as the maximum
// leaves it, and returns how many (0: none are left).
func (b *bodyBudget) take(node string, n int64) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.max >= 0 {
		n = max(0, min(n, b.max-b.byNode[node]))
	}
	if n == 0 {
		return 0
	}
	if b.byNode == nil {
		b.byNode = map[string]int64{}
	}
	b.byNode[node] += n
	return n
}

// give uncounts n bytes of node's.
func (b *bodyBudget) give(node string, n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.byNode[node] -= n; b.byNode[node] <= 0 {
		delete(b.byNode, node)
	}
}

// bodyChunk is how much of a body read takes from its node's budget at a
// time, before it is read.
const bodyChunk = 32 << 10

// read reads r up to limit bytes, each read's size (up to bodyChunk, as
// much as the maximum leaves) counted against node before it is read, and
// returns what it read and how many bytes it counted (the caller gives
// them back once the request has ended, also on an error). A read with
// nothing left of node's maximum stops with errTooManyBodyBytes, its bytes
// given back already.
func (b *bodyBudget) read(node string, r io.Reader, limit int64) ([]byte, int64, error) {
	var buf []byte
	var held int64
	for int64(len(buf)) < limit {
		n := b.take(node, min(bodyChunk, limit-int64(len(buf))))
		if n == 0 {
			// Nothing left: a body that filled it exactly has ended.
			var one [1]byte
			if _, err := io.ReadAtLeast(r, one[:], 1); err == io.EOF {
				return buf, held, nil
			} else if err != nil {
				return buf, held, err
			}
			b.give(node, held)
			return nil, 0, errTooManyBodyBytes
		}
		buf = slices.Grow(buf, int(n))
		got, err := r.Read(buf[len(buf) : len(buf)+int(n)])
		buf = buf[:len(buf)+got]
		b.give(node, n-int64(got))
		held += int64(got)
		if err == io.EOF {
			return buf, held, nil
		}
		if err != nil {
			return buf, held, err
		}
	}
	return buf, held, nil
}
