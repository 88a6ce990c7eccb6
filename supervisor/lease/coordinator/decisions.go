package coordinator

import "github.com/tetherhq/tether/supervisor/lease"

// Bounds of the decision tally. A decision outside them (an outcome or an
// audit event added to the lease package later) is counted under the zero
// value of what overflows, never dropped.
const (
	tallyOutcomes = 4
	tallyEvents   = 32
)

// tally counts a batch's decisions by outcome and audit event; the batch
// adds it to the coordinator's totals only once it is durable.
type tally [tallyOutcomes * tallyEvents]uint32

func (t *tally) add(d lease.Decision) {
	o, e := int(d.Outcome), int(d.Event)
	if o < 0 || o >= tallyOutcomes {
		o = 0
	}
	if e < 0 || e >= tallyEvents {
		e = 0
	}
	t[o*tallyEvents+e]++
}

// DecisionCount is how many durable decisions had an outcome and an audit
// event.
type DecisionCount struct {
	Outcome lease.Outcome
	Event   lease.AuditEvent
	Count   uint64
}

// Decisions returns the durable decisions judged by this coordinator since
// it was created (every run, ticks and automatic reassignments included),
// by outcome and audit event; pairs never seen are left out.
func (c *Coordinator) Decisions() []DecisionCount {
	var out []DecisionCount
	for i := range c.decided {
		if n := c.decided[i].Load(); n > 0 {
			out = append(out, DecisionCount{Outcome: lease.Outcome(i / tallyEvents), Event: lease.AuditEvent(i % tallyEvents), Count: n})
		}
	}
	return out
}

func (c *Coordinator) countDecisions(t *tally) {
	for i, n := range t {
		if n > 0 {
			c.decided[i].Add(uint64(n))
		}
	}
}
