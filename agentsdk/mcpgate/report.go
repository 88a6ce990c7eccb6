package mcpgate

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/tetherhq/tether/capability"
)

// RefusalReportInterval is the least time, on the gateway's clock, between
// two reports to the control plane of one node's requests the gateway
// refused because their grant is revoked (reportRefused): a node's refused
// requests within it, any number, make one report.
const RefusalReportInterval = time.Second

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
// one is).
const (
	maxRefusalReportNodes     = 4096
	maxRefusalReportsInFlight = 32
)

// errRefusedAtDoor is what a report's call would be recorded failed with,
// had the control plane begun it.
var errRefusedAtDoor = errors.New("mcpgate: not a tool call: the gateway's report of a request it refused because the token's grant is revoked; nothing was run")

// refusalReports are the gateway's reports of refused requests.
type refusalReports struct {
	mu       sync.Mutex
	last     map[string]time.Time // node → when its last report started
	inFlight int
	closed   bool
	wg       sync.WaitGroup
}

// reportRefused tells the control plane, in the background, that node's
// token was refused by the gateway because its grant is revoked (why is
// the verifier's error; other refusals are not reported): a BeginCall
// with that token, which the control plane refuses and keeps as the
// node's credential at work (after its session's end, life after that
// end; after its exit was confirmed, a contradiction). The gateway refused
// a revoked or terminated node's requests offline, from its verifier's
// tombstones, and the control plane never learned of them: a rogue that
// reached its tools only through the gateway claimed its exit, went on
// calling them, and the record read its exit confirmed by the control
// plane. One report per node per RefusalReportInterval: a rogue flooding
// the door costs the control plane no more (and the reports are charged
// to its own lineage's budget there). The refusal never waits for it.
func (g *Gateway) reportRefused(token, node string, why error) {
	if token == "" || node == "" || !errors.Is(why, capability.ErrGrantRevoked) {
		return
	}
	r := &g.refusals
	r.mu.Lock()
	now := g.cfg.Clock.Now()
	if t, ok := r.last[node]; r.closed || r.inFlight >= maxRefusalReportsInFlight || (ok && now.Before(t.Add(RefusalReportInterval))) {
		r.mu.Unlock()
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
			return
		}
	}
	r.last[node] = now
	r.inFlight++
	r.wg.Add(1)
	r.mu.Unlock()
	go func() {
		defer r.wg.Done()
		defer func() {
			r.mu.Lock()
			r.inFlight--
			r.mu.Unlock()
		}()
		err := g.cfg.Gate.CallScoped(g.running, token, RefusalReportTool, RefusalReportScope, func(context.Context) error {
			return errRefusedAtDoor
		})
		if err != nil && !errors.Is(err, errRefusedAtDoor) {
			g.log.Debug("mcpgate: reported a refused request to the control plane", "node", node, "answer", err)
		} else {
			g.log.Warn("mcpgate: the control plane began the report of a refused request (ended failed at once)", "node", node)
		}
	}()
}

// closeRefusals stops the reports and waits for those started.
func (g *Gateway) closeRefusals() {
	g.refusals.mu.Lock()
	g.refusals.closed = true
	g.refusals.mu.Unlock()
	g.refusals.wg.Wait()
}

// noteRefused is reportRefused for a refusal whose token's holder is not
// at hand (a tools/list or tools/call refused past the door, or on stdio).
func (g *Gateway) noteRefused(ctx context.Context, token string, why error) {
	if !errors.Is(why, capability.ErrGrantRevoked) {
		return
	}
	claims, err := g.cfg.Verifier.Identify(ctx, token)
	if err != nil {
		return
	}
	g.reportRefused(token, claims.HolderNodeID, why)
}
