package mcpgate

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/orphans"
)

// Config configures a Gateway.
type Config struct {
	Upstreams []Upstream
	// Gate records the calls in the ledger with the gateway's own
	// credential; its ID is the gate id in the record.
	Gate *agentsdk.ToolGate
	// Verifier checks agents' capability tokens offline; run it.
	Verifier *agentsdk.Verifier
	// Name and Version are what agents see as the server's implementation
	// (default "tether-mcp-gateway", "1").
	Name, Version string
	// MaxCallsPerNode bounds the tools/call one node (the holder of the
	// tokens that make them) has in flight through the gateway at once,
	// from the offline check to the answer (over HTTP, until the answer is
	// written to the agent, tools/list included); its next is refused with
	// CodeTooManyCalls, reaching neither the control plane nor the
	// upstream. Every call the gateway forwards is a BeginCall on the
	// gateway's own credential, whose request budget on the control plane
	// all agents' calls share: without the bound, one agent firing calls
	// without waiting spent it, and the other agents' calls were refused.
	// Zero means DefaultMaxCallsPerNode.
	MaxCallsPerNode int
	// ConnectTimeout bounds each connection to an upstream, from its start
	// to the answer to its first listing of tools (MCP's initialize, then
	// tools/list), and each later listing: an upstream that does not answer
	// in time is not connected (at Start, the gateway does not open; when
	// reconnecting, the gateway tries again, backing off). Zero means
	// DefaultConnectTimeout.
	ConnectTimeout time.Duration
	// Clock times the gateway's own waits (ConnectTimeout, the backoff of
	// its reconnections, the spacing of its relistings); nil means the
	// wall clock. Tests inject a manual one.
	Clock clock.Clock
	// Stderr receives stdio upstreams' stderr (default: discarded).
	Stderr io.Writer
	Logger *slog.Logger
	// OwedReportsFile, when set, keeps the reports the gateway owes the
	// control plane on disk (a JSON file, mode 0600: it holds the tokens
	// whose use they report): the nodes it served whose reports did not
	// land, and the refusals waiting for their interval's end. The
	// gateway rewrites it as they change, answers a request whose report
	// did not land only once its debt is written, leaves in it at Close
	// the reports that did not land then, and at Start sends each report
	// the file holds. Without it, those reports are lost to a gateway
	// killed, and to one whose last sending at Close fails. Give each
	// gateway its own file.
	OwedReportsFile string
}

// DefaultConnectTimeout is Config.ConnectTimeout's default.
const DefaultConnectTimeout = 30 * time.Second

// RelistInterval is the least time between the starts of two listings of
// an upstream's tools that its notifications/tools/list_changed ask for:
// any number of them within it make one listing, at its end.
const RelistInterval = time.Second

// errConnectTimeout ends a connection attempt or a listing that took
// longer than Config.ConnectTimeout.
var errConnectTimeout = errors.New("the upstream did not answer within the gateway's connect timeout")

// Gateway forwards MCP tool calls to upstreams, each one gated by the
// agent's capability token and recorded in the ledger by the gateway's
// gate. A Gateway serves any number of agent sessions.
type Gateway struct {
	cfg    Config
	log    *slog.Logger
	server *mcp.Server
	client *mcp.Client
	// received is the SDK client's own handling of what an upstream sends
	// it (below any middleware): forgetListing hands it the gateway's word
	// that a listing is to be forgotten.
	received mcp.MethodHandler

	mu        sync.RWMutex
	upstreams map[string]*upstream // by name
	routes    map[string]*route    // by the tool name agents see

	progress sync.Map // the gateway's progress token (string) → *progressRoute

	sessions   sessionCount // HTTP sessions by node (Handler sets the maximum)
	calls      callCount    // tools/call in flight by node
	conns      connCount    // HTTPServer's connections by node
	refusals   refusalReports
	seen       seenReports
	owed       owedFile   // Config.OwedReportsFile
	bodies     bodyBudget // HTTP request bodies held, by node (Handler sets the maximum)
	stdioToken atomic.Pointer[TokenSource]
	stdio      atomic.Pointer[stdioSession] // ServeStdio's session
	stop       func()                       // what Open started
	reports    sync.WaitGroup

	closed    chan struct{} // closed by Close: no more reconnecting
	closeOnce sync.Once
	// closing ends as Close begins (closed's context): the gateway's own
	// waits on an upstream (a relisting, its answer to the upstream's own
	// request) end with it, or closing the upstream's connection, which
	// waits for them, held Close for as long as the upstream did.
	closing    context.Context
	endClosing context.CancelFunc
	watchers   sync.WaitGroup
	// exits are the stdio upstreams' connections being closed, each
	// waiting for its process to exit (abandonableWrites.Close).
	exits exits
	// upstreamsGone is closed once Close has closed every upstream's
	// connection, each stdio upstream's process gone.
	upstreamsGone chan struct{}
	goneOnce      sync.Once
	// begins counts the calls whose begin has not been resolved (begun,
	// or refused and its report owed): Close sends the reports owed once
	// they are.
	begins sync.WaitGroup

	// running is the context every forwarded call runs under (beside the
	// control plane's cancel): not the agent's request, which the agent
	// cancels, but the gateway's own life, ended by Close or by the end of
	// ServeStdio's context with errGatewayClosing.
	running      context.Context
	abandonCalls context.CancelCauseFunc
}

// errGatewayClosing is the recorded error of a call the gateway stopped
// waiting for because it was shutting down.
var errGatewayClosing = errors.New("the gateway shut down while the call was in flight and stopped waiting for the upstream; whether the upstream ran it is unknown")

type upstream struct {
	cfg     Upstream
	prefix  string
	session *mcp.ClientSession
	// ended is set (under g.mu) when session's connection has ended and
	// the gateway is reconnecting: calls are refused meanwhile, before
	// they are begun.
	ended bool

	// relisting is set while a relisting of its tools is in flight or
	// waiting its turn, again when the upstream said its tools changed
	// meanwhile: an upstream repeating it cannot pile up relistings (each
	// waits for its answer), nor have them run back to back (each starts
	// RelistInterval after the last listing started, listed).
	relistMu         sync.Mutex
	relisting, again bool
	listed           time.Time // when the last listing started, on g.clock
}

// route is one tool agents see, and where it goes.
type route struct {
	up         *upstream
	tool       string // the upstream's name for it
	scope      string // mcp:<upstream>/<tool>
	ledgerTool string // <upstream>/<tool>
}

type progressRoute struct {
	ctx      context.Context // the agent's request, so progress reaches its stream
	session  *mcp.ServerSession
	token    any                // the agent's own progress token
	upstream *mcp.ClientSession // the only connection its progress may come from

	// The latest notification not yet written to the agent, and whether a
	// relay is writing: each call's progress is written on its own, so
	// that an agent that does not read its stream holds up its own call's
	// progress only (relayProgress).
	mu       sync.Mutex
	next     *mcp.ProgressNotificationParams
	relaying bool
}

// progressToken is a fresh progress token for one upstream call: 128
// random bits, so that no upstream (nor agent) can guess the token of
// another's call from its own.
func progressToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return "tether-" + hex.EncodeToString(b[:])
}

// New returns a gateway; Start connects it to its upstreams.
func New(cfg Config) (*Gateway, error) {
	if err := validateUpstreams(cfg.Upstreams); err != nil {
		return nil, err
	}
	if cfg.Gate == nil || cfg.Verifier == nil {
		return nil, errors.New("mcpgate: a gateway needs a ToolGate and a Verifier")
	}
	if cfg.Name == "" {
		cfg.Name = "tether-mcp-gateway"
	}
	if cfg.Version == "" {
		cfg.Version = "1"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.MaxCallsPerNode <= 0 {
		cfg.MaxCallsPerNode = DefaultMaxCallsPerNode
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = DefaultConnectTimeout
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	g := &Gateway{cfg: cfg, log: cfg.Logger, upstreams: map[string]*upstream{}, routes: map[string]*route{}, closed: make(chan struct{}), upstreamsGone: make(chan struct{})}
	g.running, g.abandonCalls = context.WithCancelCause(context.Background())
	g.closing, g.endClosing = context.WithCancel(context.Background())
	g.owed.path = cfg.OwedReportsFile
	g.calls.max = cfg.MaxCallsPerNode
	g.server = mcp.NewServer(&mcp.Implementation{Name: cfg.Name, Version: cfg.Version}, &mcp.ServerOptions{
		Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{ListChanged: true}},
		Instructions: "Tools behind this server are gated by Tether: each call needs the agent's capability token to allow the scope mcp:<upstream>/<tool>, and is recorded.",
		PageSize:     1 << 16,
	})
	g.server.AddReceivingMiddleware(g.middleware)
	g.client = mcp.NewClient(&mcp.Implementation{Name: cfg.Name, Version: cfg.Version}, &mcp.ClientOptions{
		Capabilities:                &mcp.ClientCapabilities{},
		ProgressNotificationHandler: g.relayProgress,
		// An upstream's input_required answer to a call (MCP's multi round
		// trip) is the call's failure (inputRequired), not the SDK's to
		// fulfil: it answered every request of one at once, a goroutine
		// each and no bound but the event's 16 MiB, and sent the call again
		// with all the answers, ten rounds for one call.
		MultiRoundTrip: &mcp.MultiRoundTripOptions{Disabled: true},
		ToolListChangedHandler: func(_ context.Context, req *mcp.ToolListChangedRequest) {
			if req.Params == listingForgotten {
				return // the gateway's own word (forgetListing), not the upstream's
			}
			g.refreshSession(req.Session)
		},
	})
	g.client.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		g.received = next
		return next
	})
	for _, u := range cfg.Upstreams {
		g.upstreams[u.Name] = &upstream{cfg: u, prefix: toolPrefix(u, len(cfg.Upstreams))}
	}
	g.watchers.Add(1)
	go g.endRevokedSessions()
	return g, nil
}

// Start sends the reports Config.OwedReportsFile holds, then connects to
// every upstream and learns its tools, each within ConnectTimeout.
func (g *Gateway) Start(ctx context.Context) error {
	if err := g.loadOwed(); err != nil {
		g.owed.mu.Lock()
		g.owed.final = true // the file is left as it is
		g.owed.mu.Unlock()
		g.Close()
		return err
	}
	for _, name := range slices.Sorted(maps.Keys(g.upstreams)) {
		up := g.upstreams[name]
		cctx, done := g.bounded(ctx)
		session, err := g.client.Connect(cctx, g.transport(up.cfg), nil)
		if err != nil {
			err = g.explain(cctx, fmt.Errorf("mcpgate: connect to upstream %s: %w", name, err), up, "its connection (MCP's initialize)")
			done()
			g.Close()
			return err
		}
		g.mu.Lock()
		up.session = session
		g.mu.Unlock()
		err = g.refresh(cctx, up)
		if err != nil {
			err = g.explain(cctx, err, up, "tools/list")
		}
		done()
		if err != nil {
			g.Close()
			return err
		}
		g.watch(up, session, 0)
	}
	return nil
}

// bounded is ctx, ended ConnectTimeout from now with errConnectTimeout
// as its cause; call done once the work under it is over.
func (g *Gateway) bounded(ctx context.Context) (_ context.Context, done func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	deadline := g.cfg.Clock.AfterFunc(g.cfg.ConnectTimeout, func() { cancel(errConnectTimeout) })
	return ctx, func() {
		deadline.Stop()
		cancel(nil)
	}
}

// explain words err, from up's work under ctx (bounded), as the connect
// timeout when that is what ended it.
func (g *Gateway) explain(ctx context.Context, err error, up *upstream, what string) error {
	if errors.Is(context.Cause(ctx), errConnectTimeout) {
		return fmt.Errorf("mcpgate: upstream %s did not answer %s within %s, the gateway's connect timeout", up.cfg.Name, what, g.cfg.ConnectTimeout)
	}
	return err
}

// watch reconnects up when session ends while the gateway is open. The Go
// SDK's client ends a connection for good on an HTTP answer that is not a
// JSON-RPC one (a filter's 403, a restarted upstream's 404), and one
// agent's call can draw such an answer: without reconnecting, every agent
// was cut off the upstream until the gateway restarted. Calls in flight
// on the ended connection fail; the next ones are refused (before they are
// begun, so the ledger does not record them) until the new connection is
// up. Each attempt has ConnectTimeout to connect: an upstream that never
// answered initialize held the attempt for ever, and the gateway never
// tried again. A connection that ends within MaxReconnectBackoff of being
// made is made again only after backoff (which doubles, from
// MinReconnectBackoff, each time it does): an upstream that exits or ends
// its connection as soon as it has answered the gateway's listing had the
// gateway start it again, and relist its tools, without pause.
func (g *Gateway) watch(up *upstream, session *mcp.ClientSession, backoff time.Duration) {
	g.watchers.Add(1)
	go func() {
		defer g.watchers.Done()
		connected := g.cfg.Clock.Now()
		_ = session.Wait()
		g.mu.Lock()
		if up.session == session {
			up.ended = true
		}
		g.mu.Unlock()
		if g.cfg.Clock.Now().Sub(connected) >= MaxReconnectBackoff {
			backoff = 0 // a connection that lasted: reconnect at once
		}
		for {
			if backoff > 0 {
				timer := g.cfg.Clock.NewTimer(backoff)
				select {
				case <-g.closed:
					timer.Stop()
					return
				case <-timer.C():
				}
			}
			backoff = min(max(2*backoff, MinReconnectBackoff), MaxReconnectBackoff)
			g.mu.RLock()
			current := up.session
			g.mu.RUnlock()
			if current != session { // closed, or replaced
				return
			}
			ctx, cancel := context.WithCancel(context.Background())
			go func() {
				select {
				case <-g.closed:
					cancel()
				case <-ctx.Done():
				}
			}()
			cctx, done := g.bounded(ctx)
			next, err := g.client.Connect(cctx, g.transport(up.cfg), nil)
			if err == nil {
				g.mu.Lock()
				if up.session != session { // the gateway closed meanwhile
					g.mu.Unlock()
					_ = next.Close()
					done()
					cancel()
					return
				}
				up.session, up.ended = next, false
				g.mu.Unlock()
				g.log.Warn("mcpgate: reconnected to an upstream whose connection had ended", "upstream", up.cfg.Name)
				if err := g.refresh(cctx, up); err != nil {
					g.log.Warn("mcpgate: relisting a reconnected upstream's tools failed", "upstream", up.cfg.Name, "error", g.explain(cctx, err, up, "tools/list"))
				}
				done()
				cancel()
				g.watch(up, next, backoff)
				return
			}
			err = g.explain(cctx, err, up, "its connection (MCP's initialize)")
			done()
			cancel()
			g.log.Warn("mcpgate: reconnecting to an upstream failed; will retry", "upstream", up.cfg.Name, "error", err)
		}
	}()
}

// The backoff of the gateway's reconnections to an upstream (watch).
const (
	MinReconnectBackoff = 50 * time.Millisecond
	MaxReconnectBackoff = 5 * time.Second
)

func (g *Gateway) transport(u Upstream) mcp.Transport {
	if u.URL != "" {
		// MaxEventSize set, not left 0: the SDK's streamable client takes 0 as
		// no bound at all (its SSE client takes it as the default).
		transport := lateCalls{next: answerWaits{next: boundedAnswers{http.DefaultTransport}, bound: g.answerBound(u.Name)}, closing: g.closing, conn: newLateAnswers()}
		return &mcp.StreamableClientTransport{Endpoint: u.URL, HTTPClient: &http.Client{Transport: transport}, MaxEventSize: MaxUpstreamAnswerBytes}
	}
	cmd := exec.Command(u.Command[0], u.Command[1:]...)
	cmd.Dir = u.Dir
	// Not the gateway's TETHER_ variables: they hold its credential and
	// the agent's token (`tether mcp serve` and `wrap` read them from
	// there), which a third-party server has no business reading.
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "TETHER_") })
	for _, k := range slices.Sorted(maps.Keys(u.Env)) {
		cmd.Env = append(cmd.Env, k+"="+u.Env[k])
	}
	cmd.Stderr = g.cfg.Stderr
	// A group of its own, killed once its connection has closed: what the
	// upstream's process started (a call's worker) went on after it, when
	// the gateway had recorded the call ended with the upstream gone.
	// On Linux what leaves the group is adopted by the gateway's process
	// from before the upstream starts, and killed likewise (orphans; the
	// error, if any, is logged as the upstream connects).
	ownGroup(cmd)
	// Killed with the gateway's process should that die unclosed (`tether
	// mcp wrap` killed): its group is out of reach of a kill of the
	// wrapper's.
	diesWithGateway(cmd)
	_ = orphans.Adopt()
	return stdioTransport{Transport: &mcp.CommandTransport{Command: cmd}, cmd: cmd, bound: g.answerBound(u.Name), exits: &g.exits, log: g.log, upstream: u.Name}
}

// answerBound bounds the gateway's writes of its answers to an upstream's
// own requests, on one connection to the upstream named upstream.
func (g *Gateway) answerBound(upstream string) answerBound {
	return answerBound{closing: g.closing, clock: g.cfg.Clock, wait: g.cfg.ConnectTimeout, held: &answersHeld{log: g.log, upstream: upstream}}
}

// Close disconnects from the upstreams (stopping stdio ones), and stops
// the gate and the verifier when Open started them.
func (g *Gateway) Close() {
	g.closeOnce.Do(func() {
		close(g.closed)
		g.endClosing()
	})
	g.abandonCalls(errGatewayClosing)
	g.mu.Lock()
	var sessions []*mcp.ClientSession
	for _, up := range g.upstreams {
		if up.session != nil {
			sessions = append(sessions, up.session)
			up.session = nil
		}
	}
	stop := g.stop
	g.stop = nil
	g.mu.Unlock()
	// Closed without g.mu: closing a connection waits for the upstream's
	// notification being handled, and the handler of list_changed takes
	// g.mu (refreshSession). Closing them under the lock had the two wait
	// on each other for ever.
	//
	// The reports owed are sent meanwhile: closing a stdio upstream's
	// connection waits for its process to exit (up to 15 s), and sent
	// after that wait they were held for as long as a rogue upstream
	// lingered, and lost to a supervisor that stopped the gateway within
	// it. The ends of the calls abandoned are recorded once their
	// upstreams are gone (call), not before: a stdio upstream's process
	// may go on with the call until then.
	upstreamsClosed := make(chan struct{})
	go func() {
		defer close(upstreamsClosed)
		closeUpstreams(sessions)
		g.watchers.Wait() // each waits for its connection's end
		g.exits.wait()    // every connection is closed, or being closed, by now
		g.goneOnce.Do(func() { close(g.upstreamsGone) })
	}()
	g.begins.Wait() // every call begun, or its begin's report owed
	g.closeRefusals()
	g.closeSeen()
	g.reports.Wait() // the ends of calls answered, or abandoned
	<-upstreamsClosed
	if stop != nil {
		stop()
	}
}

// closeUpstreamsAtOnce bounds the upstream connections Close closes at
// once.
const closeUpstreamsAtOnce = 64

// closeUpstreams closes sessions, closeUpstreamsAtOnce at once, and
// returns once all are closed. Closing a stdio upstream's connection ends
// its input and waits for its process to exit: the MCP SDK gives it 5 s,
// then 5 s more after SIGTERM, then SIGKILL. Closed one after the other,
// N upstreams that ignored both held the gateway's Close, and the reports
// it sends after them, for 10·N s.
func closeUpstreams(sessions []*mcp.ClientSession) {
	slots := make(chan struct{}, closeUpstreamsAtOnce)
	var wg sync.WaitGroup
	for _, session := range sessions {
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			_ = session.Close()
		}()
	}
	wg.Wait()
}

// Server is the MCP server agents talk to (to serve it on a transport of
// your own; Handler and ServeStdio do it for the two usual ones).
func (g *Gateway) Server() *mcp.Server { return g.server }

// refreshSession relists the tools of the upstream connected by cs, unless
// a relisting is in flight or waiting (then once more after it). A
// listing starts RelistInterval after the last one started at the
// earliest, and has ConnectTimeout to be answered: an upstream telling the
// gateway its tools changed without end (with each answer to tools/list,
// say) had it relist back to back, each listing a round trip to the
// upstream and a rebuild of the tool set under the gateway's lock, which
// every agent's call takes; one that never answered a listing held off
// every later one for ever.
func (g *Gateway) refreshSession(cs *mcp.ClientSession) {
	g.mu.RLock()
	var found *upstream
	for _, up := range g.upstreams {
		if up.session == cs {
			found = up
		}
	}
	g.mu.RUnlock()
	if found == nil {
		return
	}
	found.relistMu.Lock()
	defer found.relistMu.Unlock()
	found.again = true
	if found.relisting {
		return
	}
	found.relisting = true
	// Not on the connection's reader: listing waits for a reply.
	go func() {
		for {
			found.relistMu.Lock()
			at := found.listed.Add(RelistInterval)
			found.relistMu.Unlock()
			if clock.Until(g.cfg.Clock, at) > 0 {
				timer := clock.NewTimerAt(g.cfg.Clock, at)
				select {
				case <-g.closed:
					timer.Stop()
					found.relistMu.Lock()
					found.relisting = false
					found.relistMu.Unlock()
					return
				case <-timer.C():
				}
			}
			found.relistMu.Lock()
			found.again = false // what was told so far, this listing sees
			found.relistMu.Unlock()
			// Ended as the gateway closes, too: closing the upstream's
			// connection waits for the listing's answer, and an upstream
			// that said its tools changed and never answered the listing
			// held Close for ConnectTimeout (each upstream in turn).
			ctx, done := g.bounded(g.closing)
			if err := g.refresh(ctx, found); err != nil && g.closing.Err() == nil {
				g.log.Warn("mcpgate: relisting an upstream's tools failed", "upstream", found.cfg.Name, "error", g.explain(ctx, err, found, "tools/list"))
			}
			done()
			found.relistMu.Lock()
			if !found.again {
				found.relisting = false
				found.relistMu.Unlock()
				return
			}
			found.relistMu.Unlock()
		}
	}()
}

// refresh lists up's tools and makes the server's tool set match: the
// server tells agents' sessions that the list changed.
func (g *Gateway) refresh(ctx context.Context, up *upstream) error {
	// Page by page, within bounds: an upstream paging without end would
	// otherwise grow the gateway's memory, and every agent's tool list,
	// for ever.
	g.mu.RLock()
	session := up.session
	g.mu.RUnlock()
	if session == nil {
		return fmt.Errorf("mcpgate: upstream %s is not connected", up.cfg.Name)
	}
	up.relistMu.Lock()
	up.listed = g.cfg.Clock.Now()
	up.relistMu.Unlock()
	tools, err := g.listTools(ctx, up, session)
	if err != nil {
		// What the SDK kept of the listing's pages is forgotten: kept, it
		// stayed until the upstream next said its tools changed (never, if
		// it liked), up to MaxToolListBytes and the page that went past it
		// for a listing the gateway refused. (The tools the gateway keeps
		// are those of an earlier listing, which the SDK forgot as the
		// upstream said they changed.)
		g.forgetListing(ctx, session)
		return err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	var gone []string
	for name, r := range g.routes {
		if r.up == up {
			gone = append(gone, name)
			delete(g.routes, name)
		}
	}
	g.server.RemoveTools(gone...)
	for _, t := range tools {
		g.addTool(up, t)
	}
	return nil
}

// listingForgotten marks the gateway's own word to the SDK's client that
// an upstream's tools are to be forgotten (forgetListing): no upstream's
// notification carries this very value.
var listingForgotten = &mcp.ToolListChangedParams{}

// forgetListing has the SDK's client forget the pages of session's
// listings it keeps (at the 2026-07-28 revision of MCP, SEP-2549's cache,
// which the SDK clears only on an upstream's word that its tools
// changed): the SDK's own handling of that word, handed the gateway's,
// which the gateway's handler of it does not take as a change.
func (g *Gateway) forgetListing(ctx context.Context, session *mcp.ClientSession) {
	if _, err := g.received(context.WithoutCancel(ctx), "notifications/tools/list_changed", &mcp.ToolListChangedRequest{Session: session, Params: listingForgotten}); err != nil {
		g.log.Warn("mcpgate: forgetting an upstream's listing failed", "error", err)
	}
}

// listTools lists the tools of up, connected by session, page by page
// within the gateway's bounds.
func (g *Gateway) listTools(ctx context.Context, up *upstream, session *mcp.ClientSession) ([]*mcp.Tool, error) {
	var tools []*mcp.Tool
	size := 0 // the tools' bytes, as JSON
	params := &mcp.ListToolsParams{}
	for page := 1; ; page++ {
		res, err := session.ListTools(ctx, params)
		if err != nil {
			return nil, fmt.Errorf("mcpgate: list the tools of upstream %s: %w", up.cfg.Name, err)
		}
		// The SDK's client keeps each page it was answered (the 2026-07-28
		// revision of MCP, SEP-2549's cache), the whole result under the
		// cursor that asked for it, until the upstream says its tools
		// changed or the connection ends: of a page, only its tools (where
		// the SDK finds a tool's x-mcp-header parameters for its calls) and
		// its cursor are the gateway's to keep, and both count against
		// MaxToolListBytes. Bounded by its tools alone, a listing whose
		// pages carried up to 16 MiB of _meta, cacheScope, resultType or
		// cursor each had the gateway keep 256 of them, 4 GiB.
		res.Meta, res.CacheScope, res.ResultType = nil, "", ""
		if size += len(res.NextCursor); size > MaxToolListBytes {
			return nil, fmt.Errorf("mcpgate: upstream %s lists tools and cursors of more than %d bytes (as JSON), the most the gateway takes from one upstream", up.cfg.Name, MaxToolListBytes)
		}
		tools = append(tools, res.Tools...)
		if len(tools) > MaxToolsPerUpstream {
			return nil, fmt.Errorf("mcpgate: upstream %s lists more than %d tools, the most the gateway takes from one upstream", up.cfg.Name, MaxToolsPerUpstream)
		}
		for _, t := range res.Tools {
			b, err := json.Marshal(t)
			if err != nil {
				return nil, fmt.Errorf("mcpgate: upstream %s lists a tool the gateway cannot encode: %w", up.cfg.Name, err)
			}
			if size += len(b); size > MaxToolListBytes {
				return nil, fmt.Errorf("mcpgate: upstream %s lists tools of more than %d bytes (as JSON), the most the gateway takes from one upstream", up.cfg.Name, MaxToolListBytes)
			}
		}
		if res.NextCursor == "" {
			return tools, nil
		}
		if page == MaxToolPages {
			return nil, fmt.Errorf("mcpgate: upstream %s lists its tools in more than %d pages, the most the gateway reads", up.cfg.Name, MaxToolPages)
		}
		params.Cursor = res.NextCursor
	}
}

// addTool registers one upstream tool, unless it cannot be granted or its
// name is taken. Callers hold g.mu.
func (g *Gateway) addTool(up *upstream, t *mcp.Tool) {
	scope := Scope(up.cfg.Name, t.Name)
	if !toolName.MatchString(t.Name) || capability.ValidateScope(scope) != nil {
		g.log.Warn("mcpgate: hiding a tool whose name cannot be a scope (want A-Z a-z 0-9 . _ - /, scope at most 128 bytes)",
			"upstream", up.cfg.Name, "tool", t.Name)
		return
	}
	name := up.prefix + t.Name
	if other, taken := g.routes[name]; taken {
		g.log.Warn("mcpgate: hiding a tool whose name another upstream already uses; set tool_prefix",
			"upstream", up.cfg.Name, "tool", t.Name, "used_by", other.up.cfg.Name)
		return
	}
	if !objectSchema(t.InputSchema) {
		g.log.Warn("mcpgate: hiding a tool whose input schema is not an object", "upstream", up.cfg.Name, "tool", t.Name)
		return
	}
	seen := *t
	seen.Name = name
	r := &route{up: up, tool: t.Name, scope: scope, ledgerTool: up.cfg.Name + "/" + t.Name}
	g.routes[name] = r
	g.server.AddTool(&seen, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return g.call(ctx, r, req)
	})
}

func objectSchema(s any) bool {
	b, err := json.Marshal(s)
	if err != nil {
		return false
	}
	var m map[string]any
	return json.Unmarshal(b, &m) == nil && m["type"] == "object"
}

func (g *Gateway) route(name string) *route {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.routes[name]
}

// middleware filters tools/list by the caller's grant and refuses every
// method it does not pass (an allowlist: an SDK that learns a new method
// does not open it through the gateway).
func (g *Gateway) middleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		// A closed gateway serves nothing: its reports are over (Close sent
		// the last), and a request already past the handler's door as Close
		// began, its report not sent, was served — a rogue that held its
		// body back until the gateway was closing had its initialize
		// answered, unseen. (Its report, had it started before, was sent or
		// owed by Close.)
		select {
		case <-g.closed:
			return nil, rpcError(CodeUnavailable, "this gateway is closed; reach the one that replaces it")
		default:
		}
		if method == "initialize" {
			if err := g.sessions.admit(req); err != nil {
				return nil, err
			}
		}
		g.noteSession(req)
		// Over stdio every request, the session's own included (ping,
		// initialize, notifications), is the agent's token at work: one
		// whose grant is revoked is refused, reported and its session ended
		// (over HTTP the door does it).
		if st := g.stdioOf(req); st != nil {
			token, err := g.stdioRevoked(ctx)
			if err != nil {
				st.conn.mark(req).tell() // the refusal's report
				g.noteRefused(ctx, token, err)
				g.endStdio(st, err)
				return nil, verifierRefusal(err)
			}
			if method != "tools/call" {
				// The node served (reportSeen); over HTTP holdCalls does it.
				// (A call answered unbegun is reported as its answer is
				// written: stdioConn.)
				st.conn.mark(req).tell()
				g.noteSeen(ctx, token)
			}
		}
		switch method {
		case "initialize":
		case "tools/list":
			token, rerr := g.tokenOf(req)
			if rerr != nil {
				return nil, rerr
			}
			claims, err := g.cfg.Verifier.Verify(ctx, token)
			if err != nil {
				g.noteRefused(ctx, token, err)
				return nil, verifierRefusal(err)
			}
			res, err := next(ctx, method, req)
			if err != nil {
				return nil, err
			}
			list, ok := res.(*mcp.ListToolsResult)
			if !ok {
				return res, nil
			}
			allowed := make([]*mcp.Tool, 0, len(list.Tools))
			for _, t := range list.Tools {
				if r := g.route(t.Name); r != nil && capability.Allows(claims.Scopes, r.scope) {
					allowed = append(allowed, t)
				}
			}
			out := *list
			out.Tools = allowed
			return &out, nil
		case "tools/call", "ping", "logging/setLevel",
			"notifications/initialized", "notifications/cancelled", "notifications/progress", "notifications/roots/list_changed":
		default:
			// Only what the gateway passes, named above: resources and
			// prompts would bypass the ledger, and what else the SDK's server
			// answers is not the gateway's to serve. (subscriptions/listen,
			// which the SDK answers in any session, held its request open
			// until the agent left, uncounted: a rogue held as many as it
			// opened.)
			return nil, rpcError(CodeNotGated, "%s is refused: this gateway passes MCP tools only (resources and prompts would bypass the tool-call ledger)", method)
		}
		return next(ctx, method, req)
	}
}

// tokenOf finds the agent's capability token: the bearer of the HTTP
// request, or the stdio wrapper's token source.
func (g *Gateway) tokenOf(req mcp.Request) (string, *jsonrpc.Error) {
	if extra := req.GetExtra(); extra != nil && extra.TokenInfo != nil {
		if t, ok := extra.TokenInfo.Extra[tokenKey].(string); ok && t != "" {
			return t, nil
		}
	}
	if src := g.stdioToken.Load(); src != nil {
		t, err := (*src).Token()
		if err != nil {
			return "", rpcError(CodeUnauthenticated, "no capability token: %v", err)
		}
		return t, nil
	}
	return "", rpcError(CodeUnauthenticated, "no capability token: send it as the bearer (Authorization: Bearer <token>)")
}

// call is one tools/call: check the scope offline, have the control plane
// begin the call, forward it, and report how it ended.
func (g *Gateway) call(ctx context.Context, r *route, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	token, rerr := g.tokenOf(req)
	if rerr != nil {
		return nil, rerr
	}
	pt := req.Params.GetProgressToken()
	if problem := progressTokenProblem(pt); problem != "" {
		return nil, rpcError(jsonrpc.CodeInvalidParams, "the call's progress token is refused: %s; MCP's progress token is a string or an integer, and the gateway sends it back with every notification of the call's progress", problem)
	}
	// Offline first: a refused call costs no round trip and reaches
	// neither the ledger nor the upstream.
	mark := g.markOf(req)
	claims, err := g.cfg.Verifier.Authorize(ctx, token, r.scope)
	if err != nil {
		g.noteRefused(ctx, token, err)
		if errors.Is(err, capability.ErrGrantRevoked) {
			mark.tell() // the refusal's report
		} else if mark == nil {
			// Refused offline, never begun: the node served all the same
			// (a call with a mark is reported as it is answered).
			g.noteSeen(ctx, token)
		}
		return nil, verifierRefusal(err)
	}
	params := &mcp.CallToolParams{Name: r.tool}
	if len(req.Params.Arguments) > 0 {
		params.Arguments = req.Params.Arguments
	}
	if req.Params.Meta != nil {
		params.Meta = agentsMeta(req.Params.Meta)
	}
	var ours string
	if pt != nil {
		ours = progressToken()
		params.SetProgressToken(ours)
	}
	// Still offline: a call the upstream could not take is refused here.
	// Forwarded, it comes out re-encoded and with the gateway's longer
	// progress token, so a call that fit the gateway's body limit could
	// exceed the upstream's (the same in every MCP SDK), and the SDK's
	// client takes the upstream's 413 as the connection's end: one agent's
	// call cut every agent off the upstream.
	if n, err := forwardedSize(params, req.Params.Arguments); err != nil || n > MaxForwardedParamsBytes {
		return nil, rpcError(jsonrpc.CodeInvalidParams, "the call is too large to forward: its parameters come to %d bytes as the upstream would receive them, more than the %d an MCP server takes; send less", n, MaxForwardedParamsBytes)
	}
	// Still offline: a node at its maximum of calls in flight spends none
	// of the gateway's budget on the control plane. (Over HTTP, holdCalls
	// counted the call already, until its answer is written: the call holds
	// that count too, until it ends.)
	var hold *callHold
	var unpin func() // the HTTP request's hold on its node's seen-report place
	if extra := req.GetExtra(); extra != nil && extra.TokenInfo != nil {
		hold, _ = extra.TokenInfo.Extra[heldKey].(*callHold)
		unpin, _ = extra.TokenInfo.Extra[unpinKey].(func())
	}
	var release func()
	if hold != nil && hold.node == claims.HolderNodeID && hold.join() {
		release = hold.leave
	} else {
		if !g.calls.take(claims.HolderNodeID) {
			return nil, rpcError(CodeTooManyCalls, "node %s already has %d tool calls in flight through this gateway, the maximum; wait for one to end", claims.HolderNodeID, g.calls.max)
		}
		release = func() { g.calls.release(claims.HolderNodeID) }
	}
	// Released when the call returns, unless it stops waiting for the
	// upstream (its session ended): then when the upstream call has ended.
	detached := false
	defer func() {
		if !detached {
			release()
		}
	}()
	// The session's end (its grant revoked) stops the wait below; nil
	// (never) for a session the gateway does not hold (stdio).
	var gone <-chan struct{}
	var session *sessionState
	if req.Session != nil {
		session = g.sessions.state(req.Session)
	}
	var why func() error // why the session was ended, once gone is closed
	if session != nil && hold != nil {
		if !g.sessions.enter(session, hold) {
			return nil, rpcError(CodeDenied, "the gateway ended this session: %v", session.why)
		}
		defer g.sessions.leave(session, hold)
		gone, why = session.gone, func() error { return session.why }
	} else if st := g.stdioOf(req); st != nil {
		select {
		case <-st.gone:
			return nil, rpcError(CodeDenied, "the gateway ended this session: %v", st.why)
		default:
		}
		gone, why = st.gone, func() error { return st.why }
	}
	g.mu.RLock()
	upSession, ended := r.up.session, r.up.ended
	g.mu.RUnlock()
	if upSession == nil {
		return nil, rpcError(CodeUnavailable, "upstream %s is not connected", r.up.cfg.Name)
	}
	if ended {
		return nil, rpcError(CodeUnavailable, "upstream %s is not connected: its connection ended and the gateway is reconnecting to it; the call was not sent, retry later", r.up.cfg.Name)
	}
	if pt != nil {
		g.progress.Store(ours, &progressRoute{ctx: ctx, session: req.Session, token: pt, upstream: upSession})
		defer g.progress.Delete(ours)
	}

	// The call runs under the gate in its own goroutine: the agent gets
	// the upstream's answer as soon as it arrives, and the end is reported
	// to the ledger right after, so that the agent waits for one durable
	// commit (the begin), not two. Until the end lands the ledger shows the
	// call in flight; a gateway killed in between leaves it unresolved.
	//
	// The call runs under a context the agent cannot cancel (g.running):
	// only the control plane's cancel order, the upstream's answer or the
	// gateway's own shutdown (recorded as such) ends it. An
	// agent's own notifications/cancelled (or its stdio session's end) had
	// the gateway abandon the upstream call and report it failed ("context
	// canceled"): the agent being stopped chose what the record said of its
	// call in flight — failed, though the upstream may have done it — and
	// took it out of the drain's wait. The gateway now waits for the
	// upstream's word, as the drain does, and the agent's request is simply
	// left unanswered.
	answered := make(chan upstreamAnswer, 1)
	finished := make(chan error, 1)
	mark.tell() // the call's begin tells the control plane
	g.reports.Add(1)
	g.begins.Add(1)
	go func() {
		defer g.reports.Done()
		resolved := sync.OnceFunc(g.begins.Done)
		defer resolved()
		var herr error
		ran := false
		err := g.cfg.Gate.CallScoped(g.running, token, r.ledgerTool, r.scope, func(ctx context.Context) error {
			ran = true
			resolved()
			// Begun: the ledger sees the call, and nothing of it is reported
			// as the node seen, so its request lets go of its node's place
			// in the seen reports (holdSeen). Held for the call's life, a
			// lineage's long calls took its places as its streams did.
			if unpin != nil {
				unpin()
			}
			// When the control plane cancels ctx, the SDK abandons the call
			// and sends notifications/cancelled upstream; CallScoped
			// acknowledges the cancel only after this returns, and only if
			// the cancel stopped the call (the SDK returned ctx's error). An
			// upstream that answered first ran the call: its answer is
			// recorded (completed, or failed) and passed to the agent.
			a := upstreamAnswer{ran: true}
			late := &lateWatch{answer: make(chan *jsonrpc.Response, 1)}
			defer late.forget()
			a.result, a.err = upSession.CallTool(context.WithValue(ctx, lateKey{}, late), params)
			a.cancelled = a.err != nil && errors.Is(a.err, context.Canceled) && errors.Is(context.Cause(ctx), agentsdk.ErrCancelled)
			if a.cancelled {
				// The SDK stopped waiting, not necessarily the upstream:
				// one that answers with a result in the grace ran the call
				// on past its cancel, and is recorded as it answered.
				if res, rerr, ranOn := g.ranOnPastCancel(late); ranOn {
					a.result, a.err, a.cancelled = res, rerr, false
					g.log.Warn("mcpgate: an upstream ran a call on past the control plane's cancel of it; recorded as it answered", "upstream", r.up.cfg.Name, "tool", r.tool)
				}
			}
			switch {
			case a.err != nil && errors.Is(a.err, context.Canceled) && errors.Is(context.Cause(ctx), errGatewayClosing):
				herr = errGatewayClosing // recorded in the gateway's words
			case a.err != nil && (errors.Is(a.err, context.Canceled) || errors.Is(a.err, context.DeadlineExceeded)):
				herr = a.err // the cancel's or the caller's: the gate judges it
			case a.err != nil:
				// The ledger keeps what the agent is told, not the SDK's
				// words (failure).
				herr = failure(r, a.err)
			case a.result.NeedsInput():
				a.result, a.refused = nil, inputRequired(r, a.result)
				herr = a.refused
			case a.result.IsError:
				herr = errToolError
			}
			answered <- a
			if herr == errGatewayClosing {
				// Recorded once the upstream is gone: a stdio upstream's
				// process may go on with the call until then (ignoring its
				// input's end and SIGTERM, 10 s).
				select {
				case <-g.closed:
					<-g.upstreamsGone
				default:
				}
			}
			return herr
		})
		if !ran && err != nil && !seenLanded(err) {
			// Its begin did not land: the node served all the same, its
			// report owed (before Close sends the reports owed).
			g.oweSeenToken(claims.HolderNodeID, token)
		}
		if err != nil && err != herr && !errors.Is(err, agentsdk.ErrCancelled) {
			// The ledger did not hear how the call ended: the record will
			// show it unresolved, which is all the control plane knows.
			g.log.Warn("mcpgate: reporting the end of a call failed", "tool", r.ledgerTool, "error", err)
		}
		finished <- err
	}()
	// The agent's grant was revoked while its call was in flight: the
	// gateway ends its session, which closes once this returns. The call
	// goes on, under the gateway, until the upstream answers or the
	// control plane cancels it, and is recorded as it ends (the agent's
	// leaving never decides that); it counts against the node's calls in
	// flight until then. An answer that arrived as the session ended is
	// not handed over either: the gateway knew the grant revoked.
	denied := func(done bool) (*mcp.CallToolResult, error) {
		if !done {
			detached = true
			go func() {
				<-finished
				release()
			}()
		}
		return nil, rpcError(CodeDenied, "the gateway ended this session: %v. The call was in flight; it goes on at the upstream until it answers or the control plane cancels it, and the ledger records how it ended", why())
	}
	var a upstreamAnswer
	done := false // finished was received
	select {
	case a = <-answered:
		if a.cancelled {
			// Answer the agent once the cancel is acknowledged.
			<-finished
			done = true
		}
	case err := <-finished:
		done = true
		select {
		case a = <-answered:
		default:
			if !seenLanded(err) {
				// Its begin did not land (the control plane out of reach,
				// its answer late, the gateway's credential refused): the
				// node served all the same, its report owed until one
				// lands. (Marked told as the begin was sent, a rogue's call
				// after its claim, its begin lost, was answered unseen.)
				g.oweSeenToken(claims.HolderNodeID, token)
			}
			return nil, beginRefusal(err)
		}
	case <-gone:
		return denied(false)
	}
	if !a.cancelled { // (a cancel is the control plane's word, and says more)
		select {
		case <-gone:
			return denied(done)
		default:
		}
	}
	switch {
	case a.cancelled:
		return nil, rpcError(CodeCancelled, "the control plane cancelled this call: the agent's subtree is being stopped")
	case a.refused != nil:
		return nil, a.refused
	case a.err != nil:
		var je *jsonrpc.Error
		upstreams := errors.As(a.err, &je) && je.Code != codeRejectedByTransport
		if upstreams {
			_, refused := transportsRefusal(je)
			upstreams = !refused
		}
		if ctx.Err() != nil && !upstreams {
			return nil, ctx.Err()
		}
		if !upstreams {
			g.log.Warn("mcpgate: an upstream call failed", "upstream", r.up.cfg.Name, "tool", r.tool, "error", a.err)
		}
		return nil, failure(r, a.err)
	}
	return a.result, nil
}

// failure is how the gateway words a call the upstream did not answer
// with a result, to the agent and in the ledger alike: the upstream's own
// JSON-RPC error unchanged, unless its code is one of the gateway's; the
// gateway's transport's refusal of an answer (an HTTP error, an answer too
// large) in the gateway's words; and otherwise — the SDK's client failed
// in the transport — that the upstream could not be reached, by name
// only. The SDK's words name the gateway's session at the upstream and
// the upstream's URL, which may carry its key: the operator's to read in
// the gateway's log, neither the agent's nor the record's (a failed call's
// error is kept in the ledger, and every viewer of a record reads it).
func failure(r *route, err error) *jsonrpc.Error {
	var je *jsonrpc.Error
	if !errors.As(err, &je) || je.Code == codeRejectedByTransport {
		return rpcError(CodeUnavailable, "upstream %s could not be reached, or its connection to the gateway failed; the gateway's log says why", r.up.cfg.Name)
	}
	if msg, ok := transportsRefusal(je); ok {
		return rpcError(CodeUnavailable, "upstream %s did not answer the call as MCP asks (%s); the gateway's log says more", r.up.cfg.Name, strings.TrimPrefix(msg, "tether: "))
	}
	if je.Code >= codeAnswerRefused && je.Code <= CodeUnauthenticated {
		// The gateway's own codes say the gateway (or the control plane
		// behind it) refused or cancelled the call: an upstream's error
		// with one of them would tell the agent that its subtree is being
		// stopped, its call cancelled or its grant revoked, in the
		// gateway's name.
		return &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: fmt.Sprintf("upstream %s answered with error code %d, one of the gateway's own: %s", r.up.cfg.Name, je.Code, je.Message)}
	}
	return je // the upstream's own error, unchanged
}

// inputRequired is the gateway's refusal of an upstream's input_required
// answer to a call (the 2026-07-28 revision of MCP: the server asks its
// client for input in its answer, and the client is to send the call again
// with the answers). The gateway gives an upstream no input — it refuses
// sampling and elicitation, and its roots are none — and sends each call
// once: the Go SDK's client fulfilled every request of such an answer at
// once, a goroutine each with no bound but the answer's 16 MiB (the bound
// on an upstream's own requests, MaxAnswersInFlight, did not reach them),
// and sent the call again with all the answers, up to ten rounds for the
// one call the ledger records. The call fails (recorded failed, as the
// agent is told), and nothing of the upstream's requests is quoted.
func inputRequired(r *route, res *mcp.CallToolResult) *jsonrpc.Error {
	return rpcError(CodeUnavailable, "upstream %s answered the call by asking the gateway for input (MCP's input_required, %d requests), which the gateway does not give: the call was sent once and failed", r.up.cfg.Name, len(res.InputRequests))
}

// agentsMeta is the agent's _meta as the gateway forwards it: without the
// keys MCP reserves (a prefix with a label modelcontextprotocol or mcp:
// io.modelcontextprotocol/clientInfo, …). Those say who the calling client
// is, what it can do and which protocol it speaks, and on the gateway's
// hop the client is the gateway: the Go SDK's client keeps such keys when
// it finds them, and its server reads them before the session's, so an
// agent's had the upstream see another client than the gateway.
func agentsMeta(m mcp.Meta) mcp.Meta {
	out := make(mcp.Meta, len(m))
	for k, v := range m {
		if prefix, _, ok := strings.Cut(k, "/"); ok && slices.ContainsFunc(strings.Split(prefix, "."), func(label string) bool {
			return label == "modelcontextprotocol" || label == "mcp"
		}) {
			continue
		}
		out[k] = v
	}
	return out
}

// codeRejectedByTransport is the Go SDK client's own error for a request
// its transport could not deliver (the upstream unreachable), not an
// upstream's answer.
const codeRejectedByTransport = -32005

// MaxForwardedParamsBytes bounds a tools/call's parameters as the gateway
// forwards them: the MCP SDKs' default request body limit
// (mcp.DefaultMaxRequestBodyBytes, 4 MiB in Go, TypeScript and Python
// alike), less room for the JSON-RPC envelope around them.
const MaxForwardedParamsBytes = mcp.DefaultMaxRequestBodyBytes - 4<<10

// forwardedSize bounds the size of params as the SDK's client encodes
// them, from above, without encoding the arguments again: the SDK
// compacts them (never longer) and does not escape < > &; the envelope
// of the parameters is at most 64 bytes beside the tool's name.
func forwardedSize(params *mcp.CallToolParams, args json.RawMessage) (int, error) {
	n := len(args) + len(params.Name) + 64
	if params.Meta != nil {
		b, err := json.Marshal(params.Meta)
		if err != nil {
			return n, err
		}
		n += len(b)
	}
	return n, nil
}

// MaxProgressTokenBytes bounds an agent's progress token (a string): the
// gateway sends it back with every notification of the call's progress,
// so a token as large as the request (4 MiB) had the gateway encode and
// write that much again for each one, at the agent's word. Client SDKs use
// the request's id, or a short string.
const MaxProgressTokenBytes = 256

// maxExactInteger is the largest integer a progress token may be: the
// SDK reads a number as a float64, which holds every integer up to 2^53
// exactly, and sends back a larger one changed (the agent would not find
// its own call's progress under it).
const maxExactInteger = 1 << 53

// progressTokenProblem says why pt (nil: none) cannot be an agent's
// progress token, or "": MCP's progress token is a string or an integer
// (the Go SDK's own rule), here a string of at most MaxProgressTokenBytes
// or an integer the gateway can send back as it came. It never quotes pt.
func progressTokenProblem(pt any) string {
	switch v := pt.(type) {
	case nil:
	case string:
		if len(v) > MaxProgressTokenBytes {
			return fmt.Sprintf("it is %d bytes long, more than the %d the gateway takes", len(v), MaxProgressTokenBytes)
		}
	case float64:
		if v != math.Trunc(v) || math.Abs(v) > maxExactInteger {
			return "it is a number that is not an integer of at most 2^53, which the gateway could not send back as it came"
		}
	case int, int32, int64:
	default:
		return fmt.Sprintf("it is a JSON %s", jsonKind(v))
	}
	return ""
}

// jsonKind names the JSON type of a decoded value.
func jsonKind(v any) string {
	switch v.(type) {
	case map[string]any:
		return "object"
	case []any:
		return "array"
	case bool:
		return "boolean"
	}
	return fmt.Sprintf("value of Go type %T", v)
}

// DefaultMaxCallsPerNode is Config.MaxCallsPerNode's default: the control
// plane's own bound on a node's calls in flight through one gate, so that
// an honest agent loses nothing to it.
const DefaultMaxCallsPerNode = 256

// callCount counts each node's tools/call in flight through the gateway.
type callCount struct {
	mu     sync.Mutex
	max    int
	byNode map[string]int
}

// take counts one more call of node, or reports false when node is at the
// maximum.
func (c *callCount) take(node string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byNode[node] >= c.max {
		return false
	}
	if c.byNode == nil {
		c.byNode = map[string]int{}
	}
	c.byNode[node]++
	return true
}

func (c *callCount) release(node string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byNode[node]--; c.byNode[node] <= 0 {
		delete(c.byNode, node)
	}
}

// upstreamAnswer is how the upstream answered one call.
type upstreamAnswer struct {
	ran, cancelled bool
	result         *mcp.CallToolResult
	err            error
	refused        *jsonrpc.Error // the gateway's refusal of the upstream's answer (inputRequired)
}

// errToolError marks a call whose result had isError set: recorded as
// failed, passed to the agent unchanged.
var errToolError = errors.New("the tool returned an error result")

// relayProgress hands an upstream's progress to the agent whose call it
// belongs to, under the agent's own progress token. Progress under a token
// the gateway did not issue for a call to that very upstream connection is
// dropped: one upstream cannot speak to another's callers.
//
// It never waits for the agent. The SDK's client hands over an upstream's
// notifications one at a time, in order, on the connection every agent's
// calls to that upstream share: a write to an agent that does not read its
// stream held up every notification after it (other agents' progress, the
// upstream's word that its tools changed), queued in memory for as long as
// that agent kept its connection. Each call's progress is written by its
// own relay, which takes the latest notification not yet written: one that
// arrives while an earlier one is being written replaces any still
// waiting (progress only grows, and the latest says the most).
func (g *Gateway) relayProgress(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
	key, ok := req.Params.ProgressToken.(string)
	if !ok {
		return
	}
	v, ok := g.progress.Load(key)
	if !ok {
		return
	}
	pr := v.(*progressRoute)
	if req.Session != pr.upstream {
		g.log.Debug("mcpgate: dropped progress from an upstream the call did not go to")
		return
	}
	p := *req.Params
	p.ProgressToken = pr.token
	pr.mu.Lock()
	pr.next = &p
	start := !pr.relaying
	pr.relaying = true
	pr.mu.Unlock()
	if start {
		go g.relay(pr)
	}
}

// relay writes pr's waiting notifications to its agent until none waits,
// or the agent's request has ended.
func (g *Gateway) relay(pr *progressRoute) {
	for {
		pr.mu.Lock()
		p := pr.next
		pr.next = nil
		if p == nil || pr.ctx.Err() != nil {
			pr.relaying = false
			pr.mu.Unlock()
			return
		}
		pr.mu.Unlock()
		if err := pr.session.NotifyProgress(pr.ctx, p); err != nil {
			g.log.Debug("mcpgate: relaying progress failed", "error", err)
		}
	}
}

// ToolAccess is one upstream tool and whether a token may call it.
type ToolAccess struct {
	Name     string `json:"name"` // as agents see it
	Upstream string `json:"upstream"`
	Scope    string `json:"scope"`
	Allowed  bool   `json:"allowed"`
}

// Tools lists every tool behind the gateway and whether token may call it
// (checked offline, as tools/call would).
func (g *Gateway) Tools(ctx context.Context, token string) ([]ToolAccess, error) {
	claims, err := g.cfg.Verifier.Verify(ctx, token)
	if err != nil {
		return nil, verifierRefusal(err)
	}
	g.mu.RLock()
	defer g.mu.RUnlock()
	out := make([]ToolAccess, 0, len(g.routes))
	for _, name := range slices.Sorted(maps.Keys(g.routes)) {
		r := g.routes[name]
		out = append(out, ToolAccess{Name: name, Upstream: r.up.cfg.Name, Scope: r.scope, Allowed: capability.Allows(claims.Scopes, r.scope)})
	}
	return out, nil
}

// Verifier is the verifier the gateway checks tokens with.
func (g *Gateway) Verifier() *agentsdk.Verifier { return g.cfg.Verifier }

// Scopes lists the scopes of every tool behind the gateway.
func (g *Gateway) Scopes() []string {
	g.mu.RLock()
	defer g.mu.RUnlock()
	out := make([]string, 0, len(g.routes))
	for _, r := range g.routes {
		out = append(out, r.scope)
	}
	slices.Sort(out)
	return out
}

// Bounds on one listing of an upstream's tools: past either, the listing
// fails (a relisting leaves the tools the gateway had; at Start the
// gateway does not open).
const (
	MaxToolsPerUpstream = 4096
	MaxToolPages        = 256
	// MaxToolListBytes bounds the tools of one listing of an upstream, as
	// JSON (names, descriptions, schemas, annotations together): what one
	// answer may hold (MaxUpstreamAnswerBytes). Each page may be that
	// large, so bounded in tools and pages only, an upstream listing tools
	// of a few hundred KiB each had the gateway keep up to 4 GiB of them,
	// and encode them into every agent's tools/list. The listing's cursors
	// count too: the SDK's client keeps each page under the cursor that
	// asked for it (refresh).
	MaxToolListBytes = MaxUpstreamAnswerBytes
)
