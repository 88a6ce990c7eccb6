package bench

import (
	"sync"
	"time"

	"github.com/tetherhq/tether/controlplane"
)

// terminationPhases times the steps of the one termination a fresh server
// runs, from the supervisor's hooks (controlplane.Config's
// TerminationReconciled, called as each reconciler pass begins, and
// TerminationFault, called after each chunk commits): the mark (from the
// request to its last chunk), the wait for the cancel acknowledgements
// (to the start of the pass that revokes), the revocation (to its last
// chunk) and the record (to its last chunk). On etcd (requests set) it
// counts each phase's read and commit requests too, and (acked set) the
// gate's cancel acknowledgements answered in it: each is a commit and a
// read of its own, made by the gate and not by the termination, so a
// phase's requests less its acks are the termination's.
type terminationPhases struct {
	mu     sync.Mutex
	start  phasePoint
	passes []phasePoint // the starts of the reconciler's passes
	chunks []phaseChunk
	// requests, when set, reads the store's read and commit requests so
	// far (etcd's counters).
	requests func() phaseCounts
	// acked, when set, reads how many cancel acknowledgements the gate
	// has had answered so far.
	acked func() uint64
}

// phasePoint is when something happened, and the requests made by then.
type phasePoint struct {
	at time.Time
	phaseCounts
	acks uint64
}

// phaseCounts are etcd's counters a phase reads: its round trips (read
// and commit requests) and their volume (ranges read, comparisons and
// writes committed).
type phaseCounts struct {
	reads, commits, ranges, compares, writes uint64
}

type phaseChunk struct {
	step string
	phasePoint
}

// phaseCost is what one phase took: its time, and its requests on etcd.
type phaseCost struct {
	d time.Duration
	phaseCounts
	acks uint64
}

// now is a point at the present (p.mu held).
func (p *terminationPhases) now() phasePoint {
	pt := phasePoint{at: time.Now()}
	if p.requests != nil {
		pt.phaseCounts = p.requests()
	}
	if p.acked != nil {
		pt.acks = p.acked()
	}
	return pt
}

// hook sets the server's hooks to note the passes and chunks.
func (p *terminationPhases) hook(cfg *controlplane.Config) {
	cfg.TerminationReconciled = func(string) {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.passes = append(p.passes, p.now())
	}
	cfg.TerminationFault = func(step string, _ int) {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.chunks = append(p.chunks, phaseChunk{step, p.now()})
	}
}

// count sets the request counters the phases read (etcd's).
func (p *terminationPhases) count(requests func() phaseCounts) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.requests = requests
}

// countAcks sets the gate's counter of answered acknowledgements.
func (p *terminationPhases) countAcks(acked func() uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.acked = acked
}

// begin forgets what was noted and starts the clock (at the request).
func (p *terminationPhases) begin() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.start, p.passes, p.chunks = p.now(), nil, nil
}

// phaseNames are the phases split returns, in order.
var phaseNames = []string{"mark", "wait-acks", "revoke", "record"}

// split returns what each phase took (nothing where its chunks were not
// seen).
func (p *terminationPhases) split() map[string]phaseCost {
	p.mu.Lock()
	defer p.mu.Unlock()
	last := map[string]phasePoint{}
	var firstRevoke time.Time
	for _, c := range p.chunks {
		last[c.step] = c.phasePoint
		if c.step == "revoke" && firstRevoke.IsZero() {
			firstRevoke = c.at
		}
	}
	out := map[string]phaseCost{}
	markEnd, ok := last["mark"]
	if !ok || firstRevoke.IsZero() {
		return out
	}
	between := func(from, to phasePoint) phaseCost {
		return phaseCost{d: to.at.Sub(from.at), acks: to.acks - from.acks, phaseCounts: phaseCounts{
			reads:    to.reads - from.reads,
			commits:  to.commits - from.commits,
			ranges:   to.ranges - from.ranges,
			compares: to.compares - from.compares,
			writes:   to.writes - from.writes,
		}}
	}
	out["mark"] = between(p.start, markEnd)
	// The revocation begins with the pass that revokes: the last pass
	// begun before its first chunk.
	revokeStart := markEnd
	for _, pt := range p.passes {
		if pt.at.After(revokeStart.at) && pt.at.Before(firstRevoke) {
			revokeStart = pt
		}
	}
	out["wait-acks"] = between(markEnd, revokeStart)
	out["revoke"] = between(revokeStart, last["revoke"])
	if rec, ok := last["record"]; ok {
		out["record"] = between(last["revoke"], rec)
	}
	return out
}
