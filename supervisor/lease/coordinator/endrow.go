package coordinator

import (
	"context"
	"errors"
	"fmt"

	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/lease"
)

// EndOfEach calls fn, for each of leases (leases with a terminal result,
// as Get or a finalisation returned them), with the evidence row at which
// the job's lease took that result: the first of the job's rows whose
// lease carries it (a final result never changes, and UNRESOLVED gives way
// only to a final one, so the rows before it do not carry it and every row
// after does). found is false when no stored row does.
//
// It reads no more of a job's history than that: a search over the job's
// anchor rows (every anchorEvery-th, written whole) decodes a few of them
// and then at most the anchorEvery−1 rows after one, however long the
// history. A holder spends its lineage's rate budget on evidence rows of
// its own jobs (repeated renewals, thousands a second), kept for ever; a
// termination's record that decoded every row of its jobs to see how each
// ended held all of them in memory. Rows stored before anchors existed
// are scanned from the first, one at a time, none kept.
//
// The evidence log is read once per evidenceEachJobs jobs, not once per
// job.
func (c *Coordinator) EndOfEach(ctx context.Context, leases []lease.Lease, fn func(l lease.Lease, end Row, found bool) error) error {
	return c.firstRowOfEach(ctx, leases, func(l lease.Lease) (func(Row) bool, func(Row) bool) {
		// Monotone whatever happened since l was read: a terminal result
		// never goes back to none, and a final one never goes back to
		// UNRESOLVED. "carries l's result" is not, when an UNRESOLVED l
		// was made final since.
		carries := func(r Row) bool { return r.TerminalResult != lease.ResultUnspecified }
		if l.TerminalResult != lease.ResultUnresolved {
			carries = func(r Row) bool {
				return r.TerminalResult != lease.ResultUnspecified && r.TerminalResult != lease.ResultUnresolved
			}
		}
		return carries, func(r Row) bool { return r.TerminalResult == l.TerminalResult }
	}, fn)
}

// firstRowOfEach calls fn, for each of leases, with the first of its job's
// rows for which holds (firstRowWhere), found only when is holds for it
// too; search gives both for a lease, holds nil to find none. The evidence
// log is read once per evidenceEachJobs jobs, not once per job.
func (c *Coordinator) firstRowOfEach(ctx context.Context, leases []lease.Lease, search func(l lease.Lease) (holds, is func(Row) bool), fn func(l lease.Lease, row Row, found bool) error) error {
	type first struct {
		row   Row
		found bool
	}
	for start := 0; start < len(leases); start += evidenceEachJobs {
		part := leases[start:min(start+evidenceEachJobs, len(leases))]
		rows := make([]first, len(part))
		err := c.cfg.Store.View(ctx, func(tx store.ReadTxn) error {
			want := make(map[string]bool, len(part))
			for _, l := range part {
				want[l.JobID] = true
			}
			read, err := readLogOf(tx, func(job string) bool { return want[job] })
			if err != nil {
				return err
			}
			logs := map[string][]logRow{}
			for _, r := range read {
				logs[r.job] = append(logs[r.job], r)
			}
			for i, l := range part {
				holds, is := search(l)
				if holds == nil || jobKeyIsReserved(l.JobID) {
					continue
				}
				if rows[i].row, rows[i].found, err = firstRowWhere(tx, l.JobID, logs[l.JobID], holds); err != nil {
					return fmt.Errorf("evidence of job %q: %w", l.JobID, err)
				}
				rows[i].found = rows[i].found && is(rows[i].row)
			}
			return nil
		})
		if err != nil {
			return err
		}
		for i, l := range part {
			if err := fn(l, rows[i].row, rows[i].found); err != nil {
				return err
			}
		}
	}
	return nil
}

// CancelRequestOfEach calls fn, for each of leases, with the row of its
// job at which the cancel request the lease carries was accepted: the
// first of the job's rows whose lease carries a cancel request (a request
// is never withdrawn, and a generation with one is never replaced, so the
// rows before it carry none and every row after does). found is false when
// the lease carries no request or no stored row is that acceptance (a
// RequestCancel accepted for the lease's generation).
//
// Like EndOfEach it reads a few of a job's rows however long its history
// (firstRowWhere), and the evidence log once per evidenceEachJobs jobs: a
// termination's record asks it of the jobs whose holder acknowledged a
// cancel before the stop, to name who asked (controlplane). A whole read
// of each such job's evidence, the log's included, held every row the
// holder made it keep in memory (thirty-ninth pass, rogue39c tests).
func (c *Coordinator) CancelRequestOfEach(ctx context.Context, leases []lease.Lease, fn func(l lease.Lease, request Row, found bool) error) error {
	return c.firstRowOfEach(ctx, leases, func(l lease.Lease) (func(Row) bool, func(Row) bool) {
		if !l.CancelRequested {
			return nil, nil
		}
		return func(r Row) bool { return r.CancelRequested }, func(r Row) bool {
			return r.Message == lease.KindRequestCancel && r.Decision.Outcome == lease.OutcomeAccepted && r.Generation == l.Generation
		}
	}, fn)
}

// firstRowWhere is the first of job's rows for which holds, a predicate
// that, once true, stays true for every later row. It searches the anchor
// rows (row 1, then anchorEvery, 2·anchorEvery, …): doubling, then
// halving, to the last anchor where it does not hold, and scans on from
// there. Without anchors (rows stored before them) it scans from row 1.
func firstRowWhere(tx store.ReadTxn, job string, log []logRow, holds func(Row) bool) (Row, bool, error) {
	// Most jobs are short: the rows before the first anchor in one read,
	// as a whole read of them would take.
	first, ok, past, err := scanUpTo(tx, job, log, holds, anchorEvery-1)
	if err != nil || ok || !past {
		return first, ok && err == nil, err
	}
	// Anchor k is row k·anchorEvery. lo: an anchor where holds is false
	// (0: row 1); hi: one where it is true or that does not exist.
	lo, hi := uint64(0), uint64(0)
	probe := func(k uint64) (bool, error) {
		r, ok, err := anchorRow(tx, job, k*anchorEvery, log)
		return !ok || holds(r), err
	}
	// Doubling k until an anchor holds (or is past the end), then halving
	// between the last that does not and the first that does.
	for k := uint64(1); hi == 0 || hi-lo > 1; {
		past, err := probe(k)
		if errors.Is(err, errNoAnchor) {
			return scanFor(tx, job, 1, log, holds)
		}
		if err != nil {
			return Row{}, false, err
		}
		if past {
			hi = k
		} else {
			lo = k
		}
		if hi == 0 {
			k *= 2
		} else {
			k = lo + (hi-lo)/2
		}
	}
	return scanFor(tx, job, max(1, lo*anchorEvery), log, holds)
}

// anchorRow decodes row n of job, an anchor (or row 1), alone; ok is false
// when the job has no row n, errNoAnchor when the row is not written whole.
func anchorRow(tx store.ReadTxn, job string, n uint64, log []logRow) (Row, bool, error) {
	var out Row
	ok := false
	err := jobRows(tx, job, n, log, func(number uint64, key, value []byte) error {
		if number != n {
			return fmt.Errorf("%w: %s: evidence row %d where row %d was expected", ErrCorrupt, key, number, n)
		}
		if n > 1 && !isAnchorRow(value) {
			return errNoAnchor
		}
		var rr rowReader
		stored, err := rr.next(value)
		if err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
		out, ok = stored.row(lease.Lease{}), true
		return store.ErrStopScan
	})
	return out, ok, err
}

// scanFor decodes job's rows from row from (an anchor, or row 1), one at a
// time and none kept, up to the first for which holds.
func scanFor(tx store.ReadTxn, job string, from uint64, log []logRow, holds func(Row) bool) (Row, bool, error) {
	out, ok, _, err := scanRows(tx, job, from, 0, log, holds)
	if errors.Is(err, errNoAnchor) {
		return scanFor(tx, job, 1, log, holds)
	}
	return out, ok, err
}

// scanUpTo is scanFor from row 1 that stops after row to; past says the
// job has rows after it.
func scanUpTo(tx store.ReadTxn, job string, log []logRow, holds func(Row) bool, to uint64) (out Row, ok, past bool, err error) {
	return scanRows(tx, job, 1, to, log, holds)
}

// scanRows decodes job's rows from row from up to row to (0: the last),
// one at a time and none kept, until one for which holds; past says the job
// has rows after to. A scan from past row 1 must begin at an anchor
// (errNoAnchor otherwise).
func scanRows(tx store.ReadTxn, job string, from, to uint64, log []logRow, holds func(Row) bool) (out Row, ok, past bool, err error) {
	var rr rowReader
	first := true
	err = jobRows(tx, job, from, log, func(number uint64, key, value []byte) error {
		if first && from > 1 && !isAnchorRow(value) {
			return errNoAnchor
		}
		first = false
		if to > 0 && number > to {
			past = true
			return store.ErrStopScan
		}
		before := rr.prev
		stored, err := rr.next(value)
		if err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
		if r := stored.row(before); holds(r) {
			out, ok = r, true
			return store.ErrStopScan
		}
		return nil
	})
	return out, ok, past, err
}
