package controlplane

import (
	"context"
	"sync"
	"time"

	"github.com/tetherhq/tether/controlplane/auth"
	"github.com/tetherhq/tether/controlplane/wire"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/lease"
)

// The upkeep of a held lease, once the lineage's budget is spent.
//
// A lineage's members share one rate budget, and each node has a small
// reserve of its own for its upkeep (UpkeepReserveRate). The reserve is
// per node; the leases a node holds are many. A rogue member spending the
// shared budget would leave a sibling holding a hundred leases (30 s each,
// renewed every 10 s: 10 renewals a second) able to keep only about twenty
// alive, the rest expiring although their holder renewed them in time.
// So the upkeep of a lease is admitted from that lease's own allowance:
// an ACK, renewal, progress report, cancel acknowledgement or completion
// naming a job the caller holds — its holder is the caller's node, its
// generation the one claimed, and it is offered or active — is admitted,
// once the lineage's budget refused it, while that lease has had fewer
// than LeaseUpkeepAllowance such messages in the last lease duration
// (auth.Interceptor.Held). A message naming anything else falls back on
// the node's reserve, as before.
//
// This gives a rogue no new budget to spend as it likes: it holds only the
// leases its lineage offered it (each offer paid from the lineage's
// budget), and each gives it LeaseUpkeepAllowance messages about that
// lease per lease duration — what the lease's upkeep needs. Leases pile
// up, though (a lineage that offers one a second holds thousands within
// the hour), so a node's messages admitted this way are bounded too:
// LeaseUpkeepNodeRate a second in bursts of LeaseUpkeepNodeBurst, the
// upkeep of some five hundred leases renewed every 10 s — each node a
// spawn its lineage paid for, as with the reserve. Memory is one entry per
// lease upkept this way, forgotten a lease duration after its last message
// (its allowance is full again by then), and one per node.

// minAllowancePeriod floors the period a lease's allowance refills over: a
// lease of a few milliseconds does not buy thousands of messages a second.
const minAllowancePeriod = time.Second

// leaseAllowance is each held lease's upkeep allowance: a token bucket per
// job, for its current generation, of LeaseUpkeepAllowance tokens refilled
// over the lease's duration.
type leaseAllowance struct {
	now func() time.Time
	// node bounds each node's messages admitted from its leases'
	// allowances (by node id).
	node *auth.RateLimiter

	mu      sync.Mutex
	buckets map[string]*allowanceBucket
	swept   time.Time
}

type allowanceBucket struct {
	generation uint64
	period     time.Duration
	tokens     float64
	last       time.Time
}

// take takes one message from the allowance of the job's lease at
// generation, whose duration is period, held by holder, and reports
// whether there was one (and the holder's node had one left).
func (a *leaseAllowance) take(job string, generation uint64, period time.Duration, holder string) bool {
	period = max(period, minAllowancePeriod)
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.sweep(now)
	if a.buckets == nil {
		a.buckets = map[string]*allowanceBucket{}
	}
	b, ok := a.buckets[job]
	if !ok || b.generation != generation {
		b = &allowanceBucket{generation: generation, tokens: LeaseUpkeepAllowance, last: now}
		a.buckets[job] = b
	}
	b.period = period
	if elapsed := now.Sub(b.last); elapsed > 0 {
		b.tokens = min(LeaseUpkeepAllowance, b.tokens+LeaseUpkeepAllowance*elapsed.Seconds()/period.Seconds())
		b.last = now
	}
	if b.tokens < 1 {
		return false
	}
	if ok, _ := a.node.Allow(holder); !ok {
		return false
	}
	b.tokens--
	return true
}

// sweep forgets, at most once a minute, the buckets a lease duration
// without a message has filled again: they are as good as absent.
func (a *leaseAllowance) sweep(now time.Time) {
	if now.Sub(a.swept) < time.Minute {
		return
	}
	a.swept = now
	for job, b := range a.buckets {
		if now.Sub(b.last) >= b.period {
			delete(a.buckets, job)
		}
	}
}

// holds is auth.Interceptor.Holds: whether msg, a worker message an agent
// sent once its lineage's budget was spent, is upkeep of a lease the agent
// holds that the lease's allowance admits. The replica whose coordinator
// serves the leases knows the holder from memory; a follower, which
// forwards the message to that leader (where it is charged and judged
// again), reads the lease from the store, and admits it from an
// allowance of its own — a lineage's budget is each replica's, and so is
// a lease's allowance. Until the forty-seventh pass a follower admitted
// nothing this way: a rogue that spent its lineage's budget on a follower
// left a sibling reaching the control plane through it (a load balancer's
// choice) its node's reserve alone, and most of its leases expired
// although it renewed each in time (rogue47f test). The read costs a
// follower a store read per message past the budget: a message over the
// budget that is not upkeep ends its stream, and a call is admitted
// owing at most at the node's reserve's rate, so a rogue makes a
// follower read no more than its reserves and its own leases' upkeep
// allow. A stored lease whose deadline the clock has passed (a follower's
// read is the store's, which no run may have settled yet) is not upkeep.
func (h *leaseService) holds(ctx context.Context, p auth.Principal, msg any) bool {
	job, generation, ok := upkeepClaim(msg)
	if !ok || !p.IsAgent() || wire.CheckID("job_id", job) != nil {
		return false
	}
	l, settled, err := h.leases().GetSettled(ctx, job)
	if err != nil || l.HolderIdentity != p.NodeID() || l.Generation != generation ||
		(l.State != lease.StateOffered && l.State != lease.StateActive) ||
		(!settled && lease.Due(l, h.s.cfg.Clock.Now())) {
		return false
	}
	return h.s.allowance.take(job, generation, l.LeaseDuration, l.HolderIdentity)
}

// upkeepClaim returns the job and generation a worker message (unary, or
// the message a Channel request carries, not its batch) names.
func upkeepClaim(msg any) (job string, generation uint64, ok bool) {
	type claim interface {
		GetJobId() string
		GetLeaseGeneration() uint64
	}
	var c claim
	switch m := msg.(type) {
	case *tetherv1.ChannelRequest:
		switch v := m.GetMessage().(type) {
		case *tetherv1.ChannelRequest_Ack:
			c = v.Ack
		case *tetherv1.ChannelRequest_Renew:
			c = v.Renew
		case *tetherv1.ChannelRequest_Progress:
			c = v.Progress
		case *tetherv1.ChannelRequest_CancelAck:
			c = v.CancelAck
		case *tetherv1.ChannelRequest_Complete:
			c = v.Complete
		}
	case *tetherv1.AckRequest, *tetherv1.RenewRequest, *tetherv1.ProgressRequest,
		*tetherv1.LeaseServiceCancelAckRequest, *tetherv1.CompleteRequest:
		c = m.(claim)
	}
	if c == nil {
		return "", 0, false
	}
	return c.GetJobId(), c.GetLeaseGeneration(), true
}
