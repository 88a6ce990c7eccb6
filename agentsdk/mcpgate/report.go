package mcpgate

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/internal/clock"
)

// RefusalReportInterval is the least time, on the gateway's clock, between
// two reports to the control plane of one node's requests the gateway
// refused because their grant is revoked (reportRefused): a node's refused
// requests within it, any number, make one report, at its start, and
// those after that report one more, at its end.
const RefusalReportInterval = time.Second

// RefusalReportWait is the longest, on the gateway's clock, that a refused
// request waits for the report it started (reportRefused) before it is
// answered: answered at once, a rogue's refusal outran its report, and a
// claim of exit sent on reading it reached the control plane first.
const RefusalReportWait = 2 * time.Second

// RefusalReportTool and RefusalReportScope are the tool and the scope of
// the BeginCall with which the gateway reports a refused request. The
// control plane refuses it (the grant is revoked) and notes the node's
// credential at work; were it ever to begin it, the gateway ends it at
// once, failed, having run nothing.
const (
	RefusalReportTool  = "mcpgate/refused-request"
	RefusalReportScope = "mcp:mcpgate/refused-request"
)

// Bounds of the refusal reports: the nodes whose last report the gateway
// remembers (those older than RefusalReportInterval are forgotten first;
// past the bound, a node's refusal is not reported), and the reports in
// flight at once (past it, a refusal is not reported, and the node's next
// one is). A refusal not reported, or whose report did not land, is owed
// as the node seen (oweSeenToken) until a report of it lands.
const (
	maxRefusalReportNodes     = 4096
	maxRefusalReportsInFlight = 32
	// maxTrailingReports bounds the reports waiting for their interval's
	// end (each keeps the token it reports: up to the bearer's 64 KiB).
	maxTrailingReports = 256
)

// errRefusedAtDoor is what a report's call would be recorded failed with,
// had the control plane begun it.
var errRefusedAtDoor = errors.New("mcpgate: not a tool call: the gateway's report of a request it refused because the token's grant is revoked; nothing was run")

// refusalReports are the gateway's reports of refused requests.
type refusalReports struct {
	mu       sync.Mutex
	last     map[string]time.Time // node → when its last report started
	trailing map[string]*trailingReport
	// sending: the trailing reports in flight (node → token), owed on disk
	// until they land.
	sending  map[string]string
	inFlight int
	closed   bool
	wg       sync.WaitGroup
}

// trailingReport is the report, at the end of its node's interval, of the
// node's refusals within it.
type trailingReport struct {
	token string // the latest refused
	timer clock.Timer
}

// reportRefused tells the control plane that node's token was refused by
// the gateway because its grant is revoked (why is the verifier's error;
// other refusals are not reported): a BeginCall with that token, which the
// control plane refuses and keeps as the node's credential at work (after
// its session's end, life after that end; after its exit was confirmed, a
// contradiction). The gateway refused a revoked or terminated node's
// requests offline, from its verifier's tombstones, and the control plane
// never learned of them: a rogue that reached its tools only through the
// gateway claimed its exit, went on calling them, and the record read its
// exit confirmed by the control plane. One report per node per
// RefusalReportInterval: a rogue flooding the door costs the control
// plane no more (and the reports are charged to its own lineage's budget
// there).
//
// The refusal that starts a report waits for it (until ctx ends, or
// RefusalReportWait at the most) before it is answered: sent in the
// background, a rogue's first refused request was answered before its
// report landed, and a claim of exit sent on the answer outran it. The
// refusals within the interval do not wait, and reports are at most
// maxRefusalReportsInFlight at once, so a flood holds up that many
// requests at the most.
func (g *Gateway) reportRefused(ctx context.Context, token, node string, why error) {
	if token == "" || node == "" || !errors.Is(why, capability.ErrGrantRevoked) {
		return
	}
	r := &g.refusals
	r.mu.Lock()
	now := g.cfg.Clock.Now()
	if t, ok := r.last[node]; ok && now.Before(t.Add(RefusalReportInterval)) && !r.closed {
		// Within the interval: one report at its end. Unreported, a rogue's
		// refusals after its session's end within the interval of a report
		// made before that end were never seen.
		if tr := r.trailing[node]; tr != nil {
			tr.token = token
		} else if len(r.trailing) < maxTrailingReports {
			if r.trailing == nil {
				r.trailing = map[string]*trailingReport{}
			}
			tr := &trailingReport{token: token}
			r.trailing[node] = tr
			tr.timer = clock.AfterFuncAt(g.cfg.Clock, t.Add(RefusalReportInterval), func() { g.reportTrailing(node, tr) })
			r.mu.Unlock()
			// Answered once it is on disk: a gateway killed before the
			// interval's end lost it.
			g.persistOwed()
			return
		} else {
			r.mu.Unlock()
			g.oweSeenToken(node, token)
			return
		}
		r.mu.Unlock()
		return
	}
	if r.closed || r.inFlight >= maxRefusalReportsInFlight {
		closed := r.closed
		r.mu.Unlock()
		if !closed {
			g.oweSeenToken(node, token)
		}
		return
	}
	if r.last == nil {
		r.last = map[string]time.Time{}
	}
	if len(r.last) >= maxRefusalReportNodes {
		for n, t := range r.last {
			if !now.Before(t.Add(RefusalReportInterval)) {
				delete(r.last, n)
			}
		}
		if len(r.last) >= maxRefusalReportNodes {
			r.mu.Unlock()
			g.oweSeenToken(node, token)
			return
		}
	}
	r.last[node] = now
	r.inFlight++
	r.wg.Add(1)
	r.mu.Unlock()
	g.awaitReport(ctx, g.sendReport(token, node), RefusalReportWait)
}

// awaitReport waits for a report to land (landed closed), at most wait on
// the gateway's clock, or until ctx ends: the request it reports is
// answered then.
func (g *Gateway) awaitReport(ctx context.Context, landed <-chan struct{}, wait time.Duration) {
	timer := g.cfg.Clock.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-landed:
	case <-timer.C():
	case <-ctx.Done():
	}
}

// reportTrailing sends tr, the report of node's refusals within its
// interval, as the interval ends (none once the reports are closed, or
// past those in flight: the node's next refusal is reported).
func (g *Gateway) reportTrailing(node string, tr *trailingReport) {
	r := &g.refusals
	r.mu.Lock()
	if r.trailing[node] != tr {
		r.mu.Unlock()
		return
	}
	delete(r.trailing, node)
	if r.closed || r.inFlight >= maxRefusalReportsInFlight {
		closed := r.closed
		r.mu.Unlock()
		if !closed {
			g.oweSeenToken(node, tr.token)
		}
		return
	}
	if r.last == nil {
		r.last = map[string]time.Time{}
	}
	r.last[node] = g.cfg.Clock.Now()
	r.inFlight++
	r.wg.Add(1)
	token := tr.token
	if r.sending == nil {
		r.sending = map[string]string{}
	}
	r.sending[node] = token // owed on disk until it lands
	r.mu.Unlock()
	g.sendReport(token, node)
}

// sendReport sends a report, counted in flight and in r.wg already, and
// returns a channel closed once it has landed.
func (g *Gateway) sendReport(token, node string) <-chan struct{} {
	r := &g.refusals
	landed := make(chan struct{})
	go func() {
		defer r.wg.Done()
		defer close(landed)
		wasOwed, failed := false, false
		defer func() {
			r.mu.Lock()
			r.inFlight--
			if t, ok := r.sending[node]; ok && t == token {
				delete(r.sending, node)
				wasOwed = true
			}
			r.mu.Unlock()
			if wasOwed && !failed {
				g.persistOwed() // landed: off the disk (failed, oweSeenToken wrote it)
			}
		}()
		err := g.cfg.Gate.CallScoped(g.running, token, RefusalReportTool, RefusalReportScope, func(context.Context) error {
			return errRefusedAtDoor
		})
		switch {
		case errors.Is(err, errRefusedAtDoor) || err == nil:
			g.log.Warn("mcpgate: the control plane began the report of a refused request (ended failed at once)", "node", node)
		case seenLanded(err):
			g.log.Debug("mcpgate: reported a refused request to the control plane", "node", node, "answer", err)
		default:
			// Not landed: owed as the node seen (the control plane keeps a
			// revoked grant's holder so), until one lands.
			g.log.Warn("mcpgate: the report of a refused request did not land; owed as the node seen", "node", node, "answer", err)
			failed = true
			g.oweSeenToken(node, token)
		}
	}()
	return landed
}

// closeRefusals stops the reports and waits for those started. The
// reports waiting for their interval's end are owed as their nodes seen
// (oweSeenToken), which the seen reports' close sends once more
// (closeSeen): stopped and dropped, the refusals of a rogue after its
// claim within its last interval went unreported for good.
func (g *Gateway) closeRefusals() {
	g.refusals.mu.Lock()
	g.refusals.closed = true
	var owed []struct{ node, token string }
	for node, tr := range g.refusals.trailing {
		tr.timer.Stop()
		delete(g.refusals.trailing, node)
		owed = append(owed, struct{ node, token string }{node, tr.token})
	}
	g.refusals.mu.Unlock()
	g.refusals.wg.Wait()
	for _, o := range owed {
		// On disk already (owedNow): the seen reports' close writes the
		// file once more, with the debts that do not land.
		g.oweSeenTokenMem(o.node, o.token)
	}
}

// noteRefused is reportRefused for a refusal whose token's holder is not
// at hand (a tools/list or tools/call refused past the door, or on stdio).
//
// A token past its expiry is reported as its holder seen (reportSeen):
// the control plane names the holder of an expired token only for that
// report, and would refuse the refusal's report noting nothing.
func (g *Gateway) noteRefused(ctx context.Context, token string, why error) {
	if !errors.Is(why, capability.ErrGrantRevoked) {
		return
	}
	claims, err := g.cfg.Verifier.Holder(ctx, token)
	switch {
	case claims.HolderNodeID == "":
	case err != nil:
		g.reportSeen(ctx, token, claims.HolderNodeID)
	default:
		g.reportRefused(ctx, token, claims.HolderNodeID, why)
	}
}
