package mcpgate

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/internal/clock"
)

// SeenReportTool is the tool of the BeginCall with which the gateway
// reports that it served a node (reportSeen): the control plane's
// ledger.SeenTool, which it never begins. A control plane that predates
// it refuses the report for its scope (tool:tether:seen, which no grant
// carries), having noted nothing.
const SeenReportTool = "tether:seen"

// errSeenNotACall is what a seen report's call would be recorded failed
// with, had a control plane begun it.
var errSeenNotACall = errors.New("mcpgate: not a tool call: the gateway's report that it served the token's holder; nothing was run")

// SeenReportInterval and SeenReportBurst bound the reports to the control
// plane that the gateway served a node (reportSeen), on the gateway's
// clock: one per interval, after a burst (a session's opening is a few
// requests at once, and an agent's own may be several), so at most
// SeenReportBurst + t/SeenReportInterval over any time t. A node's requests past it wait for one report, as soon
// as the bound allows.
const (
	SeenReportInterval = 250 * time.Millisecond
	SeenReportBurst    = 16
)

// SeenReportWait is the longest, on the gateway's clock, that a request
// waits for the report that covers it (reportSeen) before it is served
// all the same, unreported.
const SeenReportWait = RefusalReportWait

// SeenReportRetry and SeenReportRetryMax pace, on the gateway's clock,
// the report of a node served unreported (its report did not land: not
// sent past the reports in flight, or failed — the control plane
// unreachable, a budget spent, its answer late): sent again SeenReportRetry
// after, the wait doubling to SeenReportRetryMax while it fails, until it
// lands. A node's requests after it are reported as any are, and the
// landing of one settles the debt.
const (
	SeenReportRetry    = time.Second
	SeenReportRetryMax = 30 * time.Second
)

// Bounds of the seen reports: the nodes the gateway keeps a report's
// state for at once, and those of one lineage (the nodes whose grants
// descend from one root grant), at most 1/seenLineageShare of them, and
// the reports in flight at once (past it, a report is not sent, and the
// requests waiting for it are served unreported for now, the report
// owed). A node's state is kept while a report of it is due, under way or
// owed, or a request of its is in the gateway (over HTTP; a GET stream
// until its opening is reported, a tools/call until it is begun): an HTTP
// request of a node the gateway has no room for is refused (holdSeen),
// never served unreported. (Variables for the package's tests.)
var (
	maxSeenNodes           = 4096
	maxSeenReportsInFlight = 64
)

// seenLineageShare: one lineage's nodes take at most 1/seenLineageShare
// of maxSeenNodes.
const seenLineageShare = 4

// seenReports are the gateway's reports that it served nodes.
type seenReports struct {
	mu        sync.Mutex
	nodes     map[string]*seenNode
	byLineage map[string]int // the nodes kept of each lineage
	inFlight  int
	closed    bool
	wg        sync.WaitGroup
}

// seenNode is one node's report state.
type seenNode struct {
	lineage string        // the root grant of the node's grants
	pins    int           // the node's HTTP requests in the gateway (holdSeen's)
	token   string        // the latest served token, the next report's
	next    chan struct{} // closed once the report the waiting requests need has landed (nil: none waits)
	sending bool          // a report is in flight
	timer   clock.Timer   // the next report's start, once the bound allows it
	// tat is when the node's reports will have used up their bound (the
	// burst refilled): a report may start at now while tat is at most
	// SeenReportBurst-1 intervals ahead of it.
	tat time.Time
	// owed: a request of the node was served and its report did not land;
	// retry sends it again (after backoff) unless a report lands first.
	owed    bool
	backoff time.Duration
	retry   clock.Timer
}

// reportSeen tells the control plane that the gateway is serving node a
// request of token's that is not a tool call (a call is begun in the
// ledger, which sees it): a BeginCall of ledger.SeenTool, which the
// control plane keeps as the node's credential at work (after its
// session's end, life after it; after its claim of exit, a
// contradiction) and begins nothing. The gateway learns revocations, not
// claims: a rogue that claimed its exit and went on with ping, initialize,
// tools/list or a GET stream on its live grant was served offline, and the
// record read its exit confirmed by the control plane.
//
// The request waits until a report started after it arrived has landed
// (SeenReportWait at the most): sent behind it, the report of an honest
// agent's last request landed after the session end or the claim that
// followed its answer, and the record read it alive after them. Requests
// arriving while a report is in flight, or within SeenReportInterval of
// the last report's start, share the next one: one report per node per
// interval, charged there to the node's own lineage.
func (g *Gateway) reportSeen(ctx context.Context, token, node string) {
	if token == "" || node == "" {
		return
	}
	r := &g.seen
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	n := r.nodes[node]
	if n == nil {
		r.mu.Unlock()
		lineage := g.lineageOf(ctx, token)
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			return
		}
		if n = r.nodes[node]; n == nil {
			n = g.trackSeen(node, lineage)
		}
		if n == nil {
			r.mu.Unlock()
			g.log.Warn("mcpgate: too many nodes (or of the node's lineage) to report seen at once; served unreported", "node", node)
			return
		}
	}
	n.token = token
	landed := n.next
	if landed == nil {
		landed = make(chan struct{})
		n.next = landed
		if !n.sending {
			g.scheduleSeen(node, n)
		}
	}
	r.mu.Unlock()
	g.awaitReport(ctx, landed, SeenReportWait)
}

// scheduleSeen starts n's next report now, or once the bound allows it
// (under g.seen.mu, n.next set, no report in flight).
func (g *Gateway) scheduleSeen(node string, n *seenNode) {
	if n.timer != nil {
		return
	}
	at := n.tat.Add(-(SeenReportBurst - 1) * SeenReportInterval)
	if clock.Until(g.cfg.Clock, at) <= 0 {
		g.startSeen(node, n)
		return
	}
	// Armed for the moment, not the time left as read: a clock moved in
	// between made the report, and the requests waiting for it, late.
	n.timer = clock.AfterFuncAt(g.cfg.Clock, at, func() {
		g.seen.mu.Lock()
		defer g.seen.mu.Unlock()
		n.timer = nil
		if g.seen.closed || g.seen.nodes[node] != n || n.next == nil || n.sending {
			return
		}
		g.startSeen(node, n)
	})
}

// startSeen sends n's report (under g.seen.mu): the requests waiting for
// n.next are released once it has landed, and those that came meanwhile
// wait for the next.
func (g *Gateway) startSeen(node string, n *seenNode) {
	r := &g.seen
	landed := n.next
	n.next = nil
	now := g.cfg.Clock.Now()
	if n.tat.Before(now) {
		n.tat = now
	}
	n.tat = n.tat.Add(SeenReportInterval)
	if r.inFlight >= maxSeenReportsInFlight {
		g.log.Warn("mcpgate: too many reports of nodes seen in flight; served unreported for now, the report owed", "node", node)
		wasOwed := n.owed
		g.oweSeen(node, n)
		if g.owed.path == "" || wasOwed { // none, or on disk already
			close(landed)
			return
		}
		// Served once its debt is on disk (persistOwed).
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			g.persistOwed()
			close(landed)
		}()
		return
	}
	n.sending = true
	r.inFlight++
	r.wg.Add(1)
	token := n.token
	go func() {
		defer r.wg.Done()
		ok, err := g.sendSeen(g.running, token)
		if ok {
			g.log.Debug("mcpgate: reported a node seen to the control plane", "node", node, "answer", err)
		} else {
			g.log.Warn("mcpgate: the report of a node seen did not land; its requests served unreported for now, the report owed", "node", node, "answer", err)
		}
		r.mu.Lock()
		r.inFlight--
		n.sending = false
		wasOwed := n.owed
		if ok {
			n.owed, n.backoff = false, 0
			if n.retry != nil {
				n.retry.Stop()
				n.retry = nil
			}
		} else {
			g.oweSeen(node, n)
		}
		switch {
		case n.next == nil:
		case r.closed:
			close(n.next)
			n.next = nil
		case r.nodes[node] == n:
			g.scheduleSeen(node, n)
		}
		r.mu.Unlock()
		// The requests waiting are served once a new debt, or a debt's
		// end, is on disk: served first, a gateway killed then lost the
		// debt. (A debt that stays is on disk already: a rogue whose
		// reports keep failing costs no writing.)
		if ok == wasOwed {
			g.persistOwed()
		}
		close(landed)
	}()
}

// oweSeenToken owes a report of node seen with token (a refusal that was
// not reported, or whose report did not land): the seen report names a
// revoked grant's holder as the refusal's would. Past maxSeenNodes, or
// once the reports are closed, it is logged only.
func (g *Gateway) oweSeenToken(node, token string) {
	if g.oweSeenTokenMem(node, token) {
		g.persistOwed()
	}
}

// oweSeenTokenMem is oweSeenToken without the writing of the owed reports
// file: true when the report is owed anew (not owed already).
func (g *Gateway) oweSeenTokenMem(node, token string) bool {
	if token == "" || node == "" {
		return false
	}
	r := &g.seen
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	n := r.nodes[node]
	if n == nil {
		r.mu.Unlock()
		lineage := g.lineageOf(context.Background(), token)
		r.mu.Lock()
		if r.closed {
			return false
		}
		if n = r.nodes[node]; n == nil {
			n = g.trackSeen(node, lineage)
		}
		if n == nil {
			g.log.Warn("mcpgate: too many nodes (or of the node's lineage) to report seen at once; a refused request left unreported", "node", node)
			return false
		}
	}
	n.token = token
	was := n.owed
	g.oweSeen(node, n)
	return !was
}

// owePastSeen owes node's report with token, as a gateway before this one
// left it owed (loadOwed), and starts it now.
func (g *Gateway) owePastSeen(node, token string) {
	lineage := g.lineageOf(context.Background(), token)
	r := &g.seen
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	n := r.nodes[node]
	if n == nil {
		n = g.trackSeen(node, lineage)
	}
	if n == nil {
		g.log.Warn("mcpgate: too many nodes (or of the node's lineage) to report seen at once; a report a gateway before this one owed is dropped", "node", node)
		return
	}
	n.token, n.owed = token, true
	if n.next == nil && !n.sending {
		n.next = make(chan struct{})
		g.scheduleSeen(node, n)
	}
}

// lineageOf is the lineage of token's holder: the root grant its grants
// descend from (Verifier.Holder's claims: a token past its expiry still
// names it), or "" when it names none.
func (g *Gateway) lineageOf(ctx context.Context, token string) string {
	claims, _ := g.cfg.Verifier.Holder(ctx, token)
	return lineageOfClaims(claims)
}

// lineageOfClaims is the root grant of claims' chain (its own grant for
// a root grant's token).
func lineageOfClaims(claims capability.Claims) string {
	if len(claims.Chain) > 0 {
		return claims.Chain[0]
	}
	return claims.GrantID
}

// trackSeen keeps a report state for node, of lineage, and returns it, or
// nil when there is no room: the gateway's nodes, or the lineage's, at
// their bound, none of them idle (no report due, under way or owed, no
// request in the gateway, the bound's interval over). Idle nodes are
// forgotten to make room (their lineage's first, for a lineage at its
// bound). Under g.seen.mu, node not kept.
//
// A node is never forgotten while its report is owed: a rogue would have
// its own request after its claim unreported by flooding the gateway
// with nodes. Past the bound a node is refused instead (holdSeen), and a
// lineage's nodes take at most 1/seenLineageShare of the bound: a rogue
// that spawned children and kept their reports owed (its lineage's budget
// spent, each refused) filled the gateway's 4096 places, after which its
// own requests, and every other lineage's new node's, were served
// unreported for good.
func (g *Gateway) trackSeen(node, lineage string) *seenNode {
	r := &g.seen
	share := max(1, maxSeenNodes/seenLineageShare)
	if r.byLineage[lineage] >= share {
		g.forgetIdleSeen(lineage)
		if r.byLineage[lineage] >= share {
			return nil
		}
	}
	if len(r.nodes) >= maxSeenNodes {
		g.forgetIdleSeen("")
		if len(r.nodes) >= maxSeenNodes {
			return nil
		}
	}
	if r.nodes == nil {
		r.nodes = map[string]*seenNode{}
		r.byLineage = map[string]int{}
	}
	n := &seenNode{lineage: lineage}
	r.nodes[node] = n
	r.byLineage[lineage]++
	return n
}

// forgetIdleSeen forgets the idle nodes (trackSeen's), of lineage when it
// is not "" (under g.seen.mu).
func (g *Gateway) forgetIdleSeen(lineage string) {
	r := &g.seen
	now := g.cfg.Clock.Now()
	for id, o := range r.nodes {
		if lineage != "" && o.lineage != lineage {
			continue
		}
		if o.next == nil && !o.sending && !o.owed && o.pins == 0 && o.timer == nil && o.retry == nil && !now.Before(o.tat) {
			delete(r.nodes, id)
			if r.byLineage[o.lineage]--; r.byLineage[o.lineage] <= 0 {
				delete(r.byLineage, o.lineage)
			}
		}
	}
}

// holdSeen keeps node's report state while an HTTP request of its is in
// the gateway (the reports of what it is served find it), and refuses
// the request when there is no room for it (trackSeen): 503, CodeUnavailable,
// its connection closed. It runs past the door (refuseRevoked): a revoked
// grant's request is refused 403 for what it is, not 503 for want of
// room. Served unreported past the bound, a rogue that
// filled it with its children's owed reports was answered after its
// claim of exit unseen.
func (g *Gateway) holdSeen(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info := auth.TokenInfoFromContext(r.Context())
		var claims capability.Claims
		if info != nil {
			claims, _ = info.Extra[claimsKey].(capability.Claims)
		}
		if claims.HolderNodeID == "" {
			next.ServeHTTP(w, r)
			return
		}
		node := claims.HolderNodeID
		s := &g.seen
		s.mu.Lock()
		n := s.nodes[node]
		if n == nil && !s.closed {
			n = g.trackSeen(node, lineageOfClaims(claims))
			if n == nil {
				s.mu.Unlock()
				g.log.Warn("mcpgate: too many nodes (or of the node's lineage) to report seen at once; the node's request refused", "node", node)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = w.Write(errorAnswer(requestID(r), rpcError(CodeUnavailable, "the gateway cannot report node %s's requests to the control plane now (too many nodes' reports are pending, %d of its lineage's at the most); retry later", node, max(1, maxSeenNodes/seenLineageShare))))
				return
			}
		}
		if n != nil {
			n.pins++
		}
		s.mu.Unlock()
		if n != nil {
			var once sync.Once
			unpin := func() {
				once.Do(func() {
					s.mu.Lock()
					n.pins--
					s.mu.Unlock()
				})
			}
			defer unpin()
			info.Extra[unpinKey] = unpin
		}
		next.ServeHTTP(w, r)
	})
}

// unpinKey holds, in a request's auth.TokenInfo.Extra, the func that lets
// go of its node's report state (holdSeen's pin) before the request ends:
// a GET stream's, once its opening is reported (holdCalls), and a
// tools/call's, once it is begun (call), as nothing of them is reported
// after. Pinned for the stream's life, a lineage's agents
// each holding the GET stream an MCP client opens took its places: its
// node past a quarter of maxSeenNodes (1024) was refused 503 for as long
// as they kept their sessions, and a rogue's children holding streams had
// its whole lineage's new nodes refused.
const unpinKey = "tether_seen_unpin"

// sendSeen sends one report that the gateway served token's holder (a
// BeginCall of SeenReportTool that begins nothing) and says whether it
// landed (seenLanded), with the answer.
func (g *Gateway) sendSeen(ctx context.Context, token string) (bool, error) {
	err := g.cfg.Gate.CallScoped(ctx, token, SeenReportTool, "", func(context.Context) error {
		return errSeenNotACall
	})
	return seenLanded(err), err
}

// seenLanded reports whether the control plane answered a seen report
// (noted, or refused for the token: a report sent again would be answered
// the same). Unreachable, late, refused for a budget or for the gateway's
// own credential, or failed inside, it noted nothing, and is owed.
func seenLanded(err error) bool {
	if errors.Is(err, errSeenNotACall) {
		return true // begun (a control plane that predates it) and ended
	}
	switch connect.CodeOf(err) {
	case connect.CodeFailedPrecondition, connect.CodePermissionDenied, connect.CodeInvalidArgument, connect.CodeNotFound:
		return true
	}
	return false
}

// oweSeen records that a request of node was served unreported (under
// g.seen.mu): its report is sent again after n's backoff, unless one
// lands first. A gateway that must not forget it keeps the node (no
// eviction while owed). Unreported and forgotten, a report refused for a
// spent budget, or lost to an unreachable control plane, left a rogue's
// request after its claim of exit unseen for good.
func (g *Gateway) oweSeen(node string, n *seenNode) {
	r := &g.seen
	n.owed = true
	if r.closed || r.nodes[node] != n || n.retry != nil {
		return
	}
	n.backoff = min(max(2*n.backoff, SeenReportRetry), SeenReportRetryMax)
	n.retry = clock.AfterFuncAt(g.cfg.Clock, g.cfg.Clock.Now().Add(n.backoff), func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		n.retry = nil
		if r.closed || r.nodes[node] != n || !n.owed || n.sending || n.next != nil {
			return // a report is due or under way: it settles the debt
		}
		n.next = make(chan struct{})
		g.scheduleSeen(node, n)
	})
}

// closeSeen stops the reports, releases the requests waiting for them,
// waits for those in flight, and then sends each report still owed or
// due once more (flushSeen) before it returns. Only logged, the report of
// a rogue's request after its claim, owed for a control plane out of
// reach a moment (or a budget spent) and waiting for its retry, was lost
// to a gateway shut down (restarted, drained) meanwhile, the control
// plane back: the record read the rogue's exit confirmed.
func (g *Gateway) closeSeen() {
	r := &g.seen
	r.mu.Lock()
	r.closed = true
	for _, n := range r.nodes {
		if n.timer != nil {
			n.timer.Stop()
			n.timer = nil
		}
		if n.retry != nil {
			n.retry.Stop()
			n.retry = nil
		}
		if n.next != nil && !n.sending {
			// Due: its waiting requests are released, and it is sent below.
			close(n.next)
			n.next = nil
			n.owed = true
		}
	}
	r.mu.Unlock()
	r.wg.Wait() // a report in flight that fails is owed (oweSeen)
	r.mu.Lock()
	var owed []seenDebt
	for node, n := range r.nodes {
		if n.owed && n.token != "" {
			owed = append(owed, seenDebt{node: node, token: n.token})
		}
	}
	r.mu.Unlock()
	left := g.flushSeen(owed)
	if len(left) > 0 {
		if g.owed.path != "" {
			g.log.Warn("mcpgate: shutting down with nodes served whose reports never landed; kept in the owed reports file for the next gateway to send", "nodes", len(left), "file", g.owed.path)
		} else {
			g.log.Warn("mcpgate: shutting down with nodes served whose reports never landed: the control plane did not see them at work", "nodes", len(left))
		}
	}
	g.finishOwed(left)
}

// seenDebt is a node's report owed at the gateway's close.
type seenDebt struct{ node, token string }

// flushSeen sends the reports owed once each, maxSeenReportsInFlight at
// once, and returns those that did not land. A report that fails for
// another reason than a budget spent (the control plane out of reach, the
// gateway's credential refused) stops the rest from being sent: each
// would wait as long (the gate's BeginCall timeout, 10 s), and a gateway
// shutting down waits for them. (A rogue's report refused for its own
// lineage's spent budget stops no other node's.)
func (g *Gateway) flushSeen(owed []seenDebt) (left []seenDebt) {
	var (
		mu      sync.Mutex
		stopped bool
		wg      sync.WaitGroup
	)
	sem := make(chan struct{}, maxSeenReportsInFlight)
	for _, d := range owed {
		sem <- struct{}{}
		mu.Lock()
		if stopped {
			left = append(left, d)
			mu.Unlock()
			<-sem
			continue
		}
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			landed, err := g.sendSeen(context.Background(), d.token)
			if landed {
				g.log.Debug("mcpgate: reported a node seen to the control plane as the gateway shut down", "node", d.node, "answer", err)
				return
			}
			g.log.Warn("mcpgate: the report of a node seen did not land as the gateway shut down", "node", d.node, "answer", err)
			mu.Lock()
			defer mu.Unlock()
			left = append(left, d)
			if connect.CodeOf(err) != connect.CodeResourceExhausted {
				stopped = true
			}
		}()
	}
	wg.Wait()
	return left
}

// noteSeen is reportSeen for a request whose token's holder is not at hand
// (over stdio, or a call refused offline): a token that names no holder
// (Verifier.Holder: one past its expiry still does) is not reported.
func (g *Gateway) noteSeen(ctx context.Context, token string) {
	if token == "" {
		return
	}
	claims, _ := g.cfg.Verifier.Holder(ctx, token)
	if claims.HolderNodeID == "" {
		return
	}
	g.reportSeen(ctx, token, claims.HolderNodeID)
}

// callMark is one tools/call request's word on whether the control plane
// has been told of it: its call begun in the ledger, its refusal reported,
// or the node seen. A tools/call was left unreported on the ledger's
// account, yet the gateway answers many without beginning them (a tool
// it does not have, a progress token or parameters it refuses, the MCP
// SDK's own refusals before the gateway's handler): a rogue that claimed
// its exit and went on calling a tool named nothing was served as often
// as it liked, unseen. Whoever answers such a call unbegun reports the
// node seen first (over HTTP the first write of the answer, over stdio
// the connection as the answer is written).
type callMark struct{ told atomic.Bool }

// tell marks the control plane told and reports whether it was not yet
// (the caller tells it); false for no mark.
func (m *callMark) tell() bool { return m != nil && m.told.CompareAndSwap(false, true) }

// markKey holds, in an HTTP request's auth.TokenInfo.Extra, the
// *callMark of its tools/call (holdCalls').
const markKey = "tether_call_mark"

// markOf is req's mark (an HTTP tools/call's, or a stdio request's), or
// nil.
func (g *Gateway) markOf(req mcp.Request) *callMark {
	if extra := req.GetExtra(); extra != nil && extra.TokenInfo != nil {
		m, _ := extra.TokenInfo.Extra[markKey].(*callMark)
		return m
	}
	if st := g.stdio.Load(); st != nil {
		return st.conn.mark(req)
	}
	return nil
}

// reportFirst runs before once, ahead of the first byte (or header, or
// flush) of an answer.
type reportFirst struct {
	http.ResponseWriter
	once   sync.Once
	before func()
}

func (w *reportFirst) WriteHeader(code int) {
	w.once.Do(w.before)
	w.ResponseWriter.WriteHeader(code)
}

func (w *reportFirst) Write(p []byte) (int, error) {
	w.once.Do(w.before)
	return w.ResponseWriter.Write(p)
}

func (w *reportFirst) FlushError() error {
	w.once.Do(w.before)
	return http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *reportFirst) Flush() { _ = w.FlushError() }

// Unwrap lets an http.ResponseController reach the connection.
func (w *reportFirst) Unwrap() http.ResponseWriter { return w.ResponseWriter }
