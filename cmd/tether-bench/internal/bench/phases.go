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
// chunk) and the record (to its last chunk).
type terminationPhases struct {
	mu     sync.Mutex
	start  time.Time
	passes []time.Time // the starts of the reconciler's passes
	chunks []phaseChunk
}

type phaseChunk struct {
	step string
	at   time.Time
}

// hook sets the server's hooks to note the passes and chunks.
func (p *terminationPhases) hook(cfg *controlplane.Config) {
	cfg.TerminationReconciled = func(string) {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.passes = append(p.passes, time.Now())
	}
	cfg.TerminationFault = func(step string, _ int) {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.chunks = append(p.chunks, phaseChunk{step, time.Now()})
	}
}

// begin forgets what was noted and starts the clock (at the request).
func (p *terminationPhases) begin() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.start, p.passes, p.chunks = time.Now(), nil, nil
}

// phaseNames are the phases split returns, in order.
var phaseNames = []string{"mark", "wait-acks", "revoke", "record"}

// split returns the time each phase took (zero where its chunks were not
// seen).
func (p *terminationPhases) split() map[string]time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	last := map[string]time.Time{}
	var firstRevoke time.Time
	for _, c := range p.chunks {
		last[c.step] = c.at
		if c.step == "revoke" && firstRevoke.IsZero() {
			firstRevoke = c.at
		}
	}
	out := map[string]time.Duration{}
	markEnd, ok := last["mark"]
	if !ok || firstRevoke.IsZero() {
		return out
	}
	out["mark"] = markEnd.Sub(p.start)
	// The revocation begins with the pass that revokes: the last pass
	// begun before its first chunk.
	revokeStart := markEnd
	for _, at := range p.passes {
		if at.After(revokeStart) && at.Before(firstRevoke) {
			revokeStart = at
		}
	}
	out["wait-acks"] = revokeStart.Sub(markEnd)
	out["revoke"] = last["revoke"].Sub(revokeStart)
	if rec, ok := last["record"]; ok {
		out["record"] = rec.Sub(last["revoke"])
	}
	return out
}
