package coordinator

import (
	"context"
	"fmt"
	"sync"

	"github.com/tetherhq/tether/internal/fault"
	"github.com/tetherhq/tether/supervisor/lease"
)

// ErrLimit: an offer or reassignment would give its holder, or the
// holder's account (its lineage), more open leases than
// Config.MaxOpenPerHolder or Config.MaxOpenPerAccount allow; nothing was
// judged.
var ErrLimit = fault.New(fault.Exhausted, "coordinator: too many open leases")

// open reports whether l is an open lease: one that exists and has no
// terminal result yet (offered, active or expired). Open leases are what
// the bounds count; a terminal one costs its job's record and evidence,
// kept for the record, but no upkeep.
func open(l lease.Lease) bool { return l.Exists() && l.State != lease.StateTerminal }

// openCounts counts the open judged leases of every shard by holder and
// by account (the holder's lineage, as the caller names it), for the
// bounds on offers. Shards change the counts as their entries' judged
// leases open, close or change holder (setPending), and reserve a place
// before judging a bounded message, so that offers judged at once on
// several shards never pass a bound together.
//
// Each holder keeps a share of its own (Config.OpenReservePerHolder): an
// account counts only the leases each of its holders holds past it, so
// one holder that fills its account (with its children, say) cannot keep
// a sibling from the leases it is offered.
type openCounts struct {
	mu sync.Mutex
	// own is Config.OpenReservePerHolder.
	own      int
	byHolder map[string]int
	// inAccount counts each holder's open leases counted under an account
	// (not ""), of which the account counts those past own.
	inAccount map[string]int
	byAccount map[string]int
	// accounts is each holder's account as callers named it (a holder's
	// lineage never changes) or as the run's load found it, kept while the
	// holder holds an open lease (or a place for one): a holder is
	// forgotten with its last, so that holders long gone (a rogue's
	// short-lived children, each offered a lease) cost no memory until a
	// restart. A holder offered again is named again by its offer.
	accounts map[string]string
}

func newOpenCounts(reserve int) *openCounts {
	return &openCounts{own: max(0, reserve), byHolder: map[string]int{}, inAccount: map[string]int{}, byAccount: map[string]int{}, accounts: map[string]string{}}
}

// reset forgets the counts (not the accounts) before a run counts its
// entries again.
func (o *openCounts) reset() {
	o.mu.Lock()
	defer o.mu.Unlock()
	clear(o.byHolder)
	clear(o.inAccount)
	clear(o.byAccount)
}

func (o *openCounts) add(holder, account string, n int) {
	if holder != "" {
		if o.byHolder[holder] += n; o.byHolder[holder] <= 0 {
			delete(o.byHolder, holder)
			delete(o.accounts, holder)
		}
	}
	if holder != "" && account != "" {
		before := o.inAccount[holder]
		after := before + n
		if after <= 0 {
			delete(o.inAccount, holder)
		} else {
			o.inAccount[holder] = after
		}
		// The account counts the holder's leases past its own share.
		n = max(0, after-o.own) - max(0, before-o.own)
	}
	if account != "" && n != 0 {
		if o.byAccount[account] += n; o.byAccount[account] <= 0 {
			delete(o.byAccount, account)
		}
	}
}

// move counts e's judged lease becoming l: the holder and account it was
// counted under lose it, l's holder and its account gain it.
func (o *openCounts) move(e *entry, l lease.Lease) {
	wasOpen, isOpen := open(e.pending), open(l)
	if wasOpen == isOpen && (!isOpen || e.pending.HolderIdentity == l.HolderIdentity) {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if wasOpen {
		o.add(e.pending.HolderIdentity, e.account, -1)
	}
	e.account = ""
	if isOpen {
		e.account = o.accounts[l.HolderIdentity]
		o.add(l.HolderIdentity, e.account, 1)
	}
}

// reserve takes a place for one more open lease of holder (and its
// account) within the bounds, or says which bound is reached. The caller
// releases the place once it has judged the message: the judgement counts
// the lease itself if it opened it.
func (o *openCounts) reserve(holder, account string, perHolder, perAccount int) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if perHolder > 0 && o.byHolder[holder] >= perHolder {
		return fmt.Errorf("%w: agent %s already holds %d open leases, the most one agent may hold; it must complete some, or its coordinator cancel or resolve them, before it is offered more",
			ErrLimit, holder, o.byHolder[holder])
	}
	if perAccount > 0 && account != "" && o.inAccount[holder] >= o.own && o.byAccount[account] >= perAccount {
		kept := ""
		if o.own > 0 {
			kept = fmt.Sprintf(" beside the %d each keeps for itself (agent %s holds its own %d)", o.own, holder, o.own)
		}
		return fmt.Errorf("%w: the agents of lineage %s already hold %d open leases%s, the most one lineage may hold; complete, cancel or resolve some before offering more",
			ErrLimit, account, o.byAccount[account], kept)
	}
	// Remembered once the place is taken: a refusal remembers nothing.
	if account != "" {
		o.accounts[holder] = account
	}
	o.add(holder, account, 1)
	return nil
}

func (o *openCounts) release(holder, account string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.add(holder, account, -1)
}

// OpenLeases is how many open leases (offered, active or expired, not
// terminal) holder holds and its account holds, as judged.
func (c *Coordinator) OpenLeases(holder, account string) (byHolder, byAccount int) {
	c.open.mu.Lock()
	defer c.open.mu.Unlock()
	return c.open.byHolder[holder], c.open.byAccount[account]
}

// HolderRoom is how many more open leases holder may be given within
// Config.MaxOpenPerHolder, as judged (bounded false: no bound).
func (c *Coordinator) HolderRoom(holder string) (room int, bounded bool) {
	if c.cfg.MaxOpenPerHolder <= 0 {
		return 0, false
	}
	c.open.mu.Lock()
	defer c.open.mu.Unlock()
	return max(0, c.cfg.MaxOpenPerHolder-c.open.byHolder[holder]), true
}

// countOpen counts every entry's open lease again, after a load, with the
// accounts of their holders (Config.Accounts, asked once per holder).
func (c *Coordinator) countOpen(ctx context.Context) error {
	c.open.reset()
	holders := map[string]bool{}
	for _, s := range c.shards {
		for _, e := range s.leases {
			if open(e.pending) {
				holders[e.pending.HolderIdentity] = true
			}
		}
	}
	if c.cfg.Accounts != nil && len(holders) > 0 {
		var unknown []string
		c.open.mu.Lock()
		for h := range holders {
			if _, ok := c.open.accounts[h]; !ok {
				unknown = append(unknown, h)
			}
		}
		c.open.mu.Unlock()
		if len(unknown) > 0 {
			found, err := c.cfg.Accounts(ctx, unknown)
			if err != nil {
				return fmt.Errorf("coordinator: the accounts of the holders of open leases: %w", err)
			}
			c.open.mu.Lock()
			for h, a := range found {
				if a != "" {
					c.open.accounts[h] = a
				}
			}
			c.open.mu.Unlock()
		}
	}
	c.open.mu.Lock()
	defer c.open.mu.Unlock()
	for _, s := range c.shards {
		for _, e := range s.leases {
			e.account = ""
			if open(e.pending) {
				e.account = c.open.accounts[e.pending.HolderIdentity]
				c.open.add(e.pending.HolderIdentity, e.account, 1)
			}
		}
	}
	// A holder an earlier run remembered, whose leases ended since, is
	// forgotten as it would have been with its last.
	for h := range c.open.accounts {
		if c.open.byHolder[h] == 0 {
			delete(c.open.accounts, h)
		}
	}
	return nil
}

// boundedHolder is the holder a bounded message would give a new open
// lease, or "" when it gives none: an offer or reassignment to a holder
// that does not already hold the job's open lease.
func boundedHolder(m lease.Message, current lease.Lease) string {
	var holder string
	switch v := m.(type) {
	case lease.Offer:
		holder = v.HolderIdentity
	case lease.Reassign:
		holder = v.HolderIdentity
	default:
		return ""
	}
	if open(current) && current.HolderIdentity == holder {
		return ""
	}
	return holder
}

// ApplyBounded is ApplyIf for an offer or a reassignment, bounded: it is
// refused with ErrLimit, unjudged (no evidence row, nothing changed), when
// its holder already holds Config.MaxOpenPerHolder open leases or the
// holder's account (account, the holder's lineage; "" for none) holds
// Config.MaxOpenPerAccount.
func (c *Coordinator) ApplyBounded(ctx context.Context, m lease.Message, guard func(lease.Lease) error, account string) (Result, error) {
	return c.applyBounded(ctx, m, guard, account, false)
}

// ApplyHolderBounded is ApplyBounded held to Config.MaxOpenPerHolder
// only: the lease it opens counts under account all the same, so that
// the account's own offers see it, but a full account does not refuse
// it. It is for the principals a full account must not lock out (the
// control plane's operators): an account's bound is one tenant's share,
// and a tenant that filled it must not stop those who can empty it.
func (c *Coordinator) ApplyHolderBounded(ctx context.Context, m lease.Message, guard func(lease.Lease) error, account string) (Result, error) {
	return c.applyBounded(ctx, m, guard, account, true)
}

func (c *Coordinator) applyBounded(ctx context.Context, m lease.Message, guard func(lease.Lease) error, account string, holderOnly bool) (Result, error) {
	if m == nil || jobKeyIsReserved(m.Job()) {
		return c.ApplyIf(ctx, m, guard)
	}
	ch := make(chan answer, 1)
	c.send(c.shardOf(m.Job()), op{kind: opJudge, msg: m, guard: guard, bounded: true, account: account, holderOnly: holderOnly,
		done: func(r Result, err error) { ch <- answer{r, err} }})
	return wait(ctx, ch)
}
