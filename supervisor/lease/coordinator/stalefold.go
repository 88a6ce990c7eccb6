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
// lengthen the evidence of a job it no longer holds without bound. A
// message whose judgement changes the lease (the clock forced an expiry
// as it was judged) is always a row; the current holder's never fold.
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
// lease.MaxFormerHolders holders.
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

// pruneStale returns the counts of tally whose holder is still among
// formers, and whether any was dropped (a holder the job passed eight
// holders ago is a stranger again; one that holds the job again is no
// former holder). tally is never changed (it may be a durable snapshot),
// and is returned as it is when nothing was dropped.
func pruneStale(tally []StaleCount, formers [lease.MaxFormerHolders]string) ([]StaleCount, bool) {
	if !slices.ContainsFunc(tally, func(c StaleCount) bool { return !slices.Contains(formers[:], c.Holder) }) {
		return tally, false
	}
	var kept []StaleCount
	for _, c := range tally {
		if slices.Contains(formers[:], c.Holder) {
			kept = append(kept, c)
		}
	}
	return kept, len(kept) != len(tally)
}

// countStale counts a message of the former holder holder in the tally
// (pruned to next's former holders), and reports whether it is folded:
// the holder already has StaleRowsPerFormerHolder rows and the judgement
// changed nothing (next == current). It returns a new slice.
func countStale(tally []StaleCount, holder string, current, next lease.Lease) ([]StaleCount, bool) {
	tally, _ = pruneStale(tally, next.FormerHolders)
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
