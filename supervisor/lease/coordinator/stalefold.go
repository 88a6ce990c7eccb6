package coordinator

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/lease"
)

// StaleRowsPerFormerHolder is how many of a former holder's messages about
// a job are kept as rows of the job's evidence while it is among the job's
// last lease.MaxFormerHolders holders. Each later one is judged and
// answered like the first (an explicit decision, the same outcome and
// event), but changes nothing and is folded into its count on the job's
// record (StaleTally) instead of adding a row: a former holder cannot
// lengthen the evidence of a job it no longer holds without bound. The
// holder of a generation that has ended (EXPIRED, or TERMINAL) is held to
// the same while the job stays so: its messages after the end can change
// nothing either, and the holder of a finished job kept every repeat as a
// row for ever (thirty-seventh pass, rogue37j test). A message whose
// judgement changes the lease (the clock forced an expiry as it was
// judged, a cancel acknowledgement recorded after the holder's FAILED) is
// always a row; a live generation's holder's never fold.
const StaleRowsPerFormerHolder = 32

// StaleCount is what one former holder sent about a job: Kept messages
// are rows of the job's evidence, Folded ones were judged and answered but
// only counted.
type StaleCount struct {
	Holder       string
	Kept, Folded uint64
}

// StaleTally returns the job's former holders' counts as durable in the
// store (every change to them is written with the decision that made it),
// for the former holders that sent anything while among the job's last
// lease.MaxFormerHolders holders, and the holder's once its generation
// ended (while the job stays so).
func (c *Coordinator) StaleTally(ctx context.Context, job string) ([]StaleCount, error) {
	if jobKeyIsReserved(job) {
		return nil, fmt.Errorf("%w: job %q", ErrNotFound, job)
	}
	var r record
	err := c.cfg.Store.View(ctx, func(tx store.ReadTxn) error {
		b, err := tx.Get(jobKey(job))
		if errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("%w: job %q", ErrNotFound, job)
		}
		if err != nil {
			return err
		}
		r, err = decodeRecord(b)
		return err
	})
	if err != nil {
		return nil, err
	}
	return append([]StaleCount(nil), r.Stale...), nil
}

// formerHolder returns the identity of the former holder m comes from,
// judged against current: a worker message of one of the job's last
// lease.MaxFormerHolders holders (not the current one) about an earlier
// generation (lease.Lease.Party).
func formerHolder(current lease.Lease, m lease.Message) (string, bool) {
	c, ok := lease.ClaimOf(m)
	if !ok || c.HolderIdentity == current.HolderIdentity || !current.Party(c.HolderIdentity, c.Generation) {
		return "", false
	}
	return c.HolderIdentity, true
}

// staleSender returns whose count a worker message m judged against
// current goes to: a former holder's (formerHolder), or the current
// holder's once its generation has ended (endedHolder).
func staleSender(current lease.Lease, m lease.Message) (string, bool) {
	if holder, ok := formerHolder(current, m); ok {
		return holder, true
	}
	c, ok := lease.ClaimOf(m)
	if !ok || c.HolderIdentity == "" || c.HolderIdentity != endedHolder(current) {
		return "", false
	}
	return c.HolderIdentity, true
}

// endedHolder is the holder of l's generation when that generation has
// ended (EXPIRED, or TERMINAL), and "" while it is offered or active.
func endedHolder(l lease.Lease) string {
	if l.State == lease.StateExpired || l.State == lease.StateTerminal {
		return l.HolderIdentity
	}
	return ""
}

// pruneStale returns the counts of tally whose holder is still among l's
// former holders or is the holder of its ended generation (endedHolder),
// and whether any was dropped (a holder the job passed eight holders ago
// is a stranger again; one that holds a live generation of the job again
// starts afresh). tally is never changed (it may be a durable snapshot),
// and is returned as it is when nothing was dropped.
func pruneStale(tally []StaleCount, l lease.Lease) ([]StaleCount, bool) {
	ended := endedHolder(l)
	counted := func(c StaleCount) bool {
		return (ended != "" && c.Holder == ended) || slices.Contains(l.FormerHolders[:], c.Holder)
	}
	if !slices.ContainsFunc(tally, func(c StaleCount) bool { return !counted(c) }) {
		return tally, false
	}
	var kept []StaleCount
	for _, c := range tally {
		if counted(c) {
			kept = append(kept, c)
		}
	}
	return kept, len(kept) != len(tally)
}

// countStale counts a message of holder, a former holder or the holder of
// the ended generation (staleSender), in the tally (pruned as pruneStale
// prunes it for next), and reports whether it is folded:
// the holder already has StaleRowsPerFormerHolder rows and the judgement
// changed nothing (next == current). It returns a new slice.
func countStale(tally []StaleCount, holder string, current, next lease.Lease) ([]StaleCount, bool) {
	tally, _ = pruneStale(tally, next)
	tally = slices.Clone(tally)
	i := slices.IndexFunc(tally, func(c StaleCount) bool { return c.Holder == holder })
	if i < 0 {
		tally = append(tally, StaleCount{Holder: holder})
		i = len(tally) - 1
	}
	fold := next == current && tally[i].Kept >= StaleRowsPerFormerHolder
	if fold {
		tally[i].Folded++
	} else {
		tally[i].Kept++
	}
	return tally, fold
}

// staleCost is what a record's former holders' counts add to its size
// (recordCost): at most lease.MaxFormerHolders holders, each with two
// numbers.
func staleCost(tally []StaleCount) int {
	n := 0
	for _, c := range tally {
		n += len(c.Holder) + 24
	}
	return n
}
