package grantstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/internal/reconcile"
	"github.com/tetherhq/tether/internal/store"
)

// markJob is the persisted intent to mark the descendants of a revoked
// grant. Cursor is the last descendant id handled; marking resumes after
// it, so a restart repeats at most one batch, and repeating one is
// harmless (MarkRevokedVia refuses a grant already revoked). Depth is a
// hint only (see descendantsAfter): how many leading bytes of an id name
// the slice of the derived index one scan reads; a job without it starts
// from 0, the whole index.
type markJob struct {
	GrantID string `json:"grant_id"`
	Cursor  string `json:"cursor,omitempty"`
	Depth   int    `json:"depth,omitempty"`
}

func putMarkJob(tx store.Txn, seq uint64, job markJob) error {
	raw, err := json.Marshal(job)
	if err != nil {
		return err
	}
	return tx.Put(markKey(seq), raw)
}

// markerKey is the marker loop's one key: "the stored marking jobs".
const markerKey = "marks"

// newMarker is the marker's reconcile loop: a stored job (written by a
// revocation here or on another replica) kicks it, a failed batch is
// retried on the clock, and a pass after a lagged watch looks again.
func (s *Service) newMarker() *reconcile.Loop {
	return reconcile.New(reconcile.Config{
		Name: "grant marker", Store: s.cfg.Store, Clock: s.cfg.Clock, Log: s.cfg.Log,
		Watch: [][]byte{[]byte(prefixMark)},
		Scan:  func(context.Context) ([]string, error) { return []string{markerKey}, nil },
		Changed: func(batch []store.Event, kick func(string)) {
			for _, ev := range batch {
				if ev.Type == store.EventPut {
					kick(markerKey)
					return
				}
			}
		},
		Reconcile: func(ctx context.Context, _ string) (time.Time, error) {
			_, err := s.MarkPending(ctx)
			return time.Time{}, err
		},
		Retry: time.Second, MaxRetry: markerMaxRetry,
	})
}

// markerMaxRetry bounds the wait before a failed marking batch is retried.
const markerMaxRetry = 10 * time.Second

func (s *Service) wakeMarker() { s.marker.Kick(markerKey) }

// RunMarker marks the descendants of revoked grants, in the background,
// until ctx ends. Revocation does not depend on it — the tombstone already
// revokes the subtree for every verifier and every check here — it makes
// the stored state of each grant say so, for listings, records and
// HeldBy. It is bounded (one job at a time, MarkBatch grants per
// transaction, the decisions made outside the committer) and restartable
// (jobs and their cursors are stored; a restart resumes them).
func (s *Service) RunMarker(ctx context.Context) error {
	if err := s.marker.Run(ctx); ctx.Err() == nil {
		return err
	}
	return nil
}

// MarkPending runs every stored marking job to completion and returns how
// many grants it marked.
func (s *Service) MarkPending(ctx context.Context) (int, error) {
	marked := 0
	for {
		seq, job, ok, err := s.nextMarkJob(ctx)
		if err != nil || !ok {
			return marked, err
		}
		for {
			n, done, err := s.markBatch(ctx, seq, job)
			marked += n
			if err != nil {
				return marked, err
			}
			if done.GrantID == "" {
				break
			}
			job = done
		}
	}
}

func (s *Service) nextMarkJob(ctx context.Context) (uint64, markJob, bool, error) {
	var (
		seq   uint64
		job   markJob
		found bool
	)
	err := s.cfg.Store.View(ctx, func(tx store.ReadTxn) error {
		return tx.Scan([]byte(prefixMark), nil, func(k, v []byte) error {
			var err error
			if seq, err = sequenceOf(k, prefixMark); err != nil {
				return err
			}
			if err := json.Unmarshal(v, &job); err != nil {
				return fmt.Errorf("%w: mark job %d: %v", ErrCorrupt, seq, err)
			}
			found = true
			return store.ErrStopScan
		})
	})
	return seq, job, found, err
}

// markBatch marks up to MarkBatch descendants after the job's cursor. It
// returns the job to continue with, or a zero job when this one is done.
//
// Each descendant is marked by covered — the earliest revocation among its
// ancestors — not necessarily by this job's grant: then the stored outcome
// does not depend on the order in which jobs run, nor on whether a restart
// repeated a batch, and it is what effective showed before the marking.
func (s *Service) markBatch(ctx context.Context, seq uint64, job markJob) (int, markJob, error) {
	type change struct {
		grantID  string
		was, now []byte
	}
	var (
		changes []change
		next    string
		more    bool
	)
	depth := job.Depth
	err := s.cfg.Store.View(ctx, func(tx store.ReadTxn) error {
		changes, next, more = changes[:0], job.Cursor, false
		var ids []string
		var err error
		ids, more, depth, err = descendantsAfter(tx, job.GrantID, job.Cursor, job.Depth, s.cfg.MarkBatch)
		if err != nil {
			return err
		}
		// One request per few hundred grants, not a round trip each: the
		// batch's grants, then the ancestors their chains name.
		keys := store.KeysOf(ids, grantKey)
		if err := store.Prefetch(tx, keys, nil); err != nil {
			return err
		}
		reads := newReader(tx)
		keys, asked := keys[:0], map[string]bool{}
		for _, grantID := range ids {
			g, ok := reads.grant(grantID)
			if !ok {
				continue // reported below
			}
			for _, ancestorID := range g.Chain {
				if _, cached := reads.cache[ancestorID]; !cached && !asked[ancestorID] {
					asked[ancestorID] = true
					keys = append(keys, grantKey(ancestorID))
				}
			}
		}
		if err := store.Prefetch(tx, keys, nil); err != nil {
			return err
		}
		for _, grantID := range ids {
			next = grantID
			g, ok := reads.grant(grantID)
			if !ok {
				if err := reads.failed(); err != nil {
					return err
				}
				return fmt.Errorf("%w: derived index of %s names missing grant %s", ErrCorrupt, job.GrantID, grantID)
			}
			marked, ok, err := covered(g, reads.grant)
			if err := reads.failed(); err != nil {
				return err
			}
			if err != nil {
				// A broken chain must not stall every later job: leave the
				// grant as it is (the tombstone still revokes it) and say so.
				s.cfg.Log.Error("grant marker: leaving a grant unmarked", "grant_id", grantID, "revoked_ancestor", job.GrantID, "error", err)
				continue
			}
			if !ok {
				continue // already revoked on its own, or expired first
			}
			encoded, err := encodeGrant(marked)
			if err != nil {
				return err
			}
			changes = append(changes, change{grantID: grantID, was: reads.seen[grantID], now: encoded})
		}
		return nil
	})
	if err != nil {
		return 0, markJob{}, err
	}
	written := 0
	err = s.cfg.Store.Update(ctx, func(tx store.Txn) error {
		written = 0
		keys := make([][]byte, len(changes))
		for i, c := range changes {
			keys[i] = grantKey(c.grantID)
		}
		if err := store.Prefetch(tx, keys, nil); err != nil {
			return err
		}
		for _, c := range changes {
			current, err := tx.Get(grantKey(c.grantID))
			if errors.Is(err, store.ErrNotFound) {
				continue // dropped since the snapshot (makeRoom): dead, and no grant derives from it
			}
			if err != nil {
				return err
			}
			encoded := c.now
			if !bytes.Equal(current, c.was) {
				// Changed since the snapshot (revoked on its own, most
				// likely): decide again on what is stored now.
				reads := newReader(tx)
				g, ok := reads.grant(c.grantID)
				if !ok {
					if err := reads.failed(); err != nil {
						return err
					}
					return fmt.Errorf("%w: grant %s vanished", ErrCorrupt, c.grantID)
				}
				marked, ok, err := covered(g, reads.grant)
				if err := reads.failed(); err != nil {
					return err
				}
				if err != nil || !ok {
					continue
				}
				if encoded, err = encodeGrant(marked); err != nil {
					return err
				}
			}
			if err := tx.Put(grantKey(c.grantID), encoded); err != nil {
				return err
			}
			written++
		}
		if !more {
			return tx.Delete(markKey(seq))
		}
		return putMarkJob(tx, seq, markJob{GrantID: job.GrantID, Cursor: next, Depth: depth})
	})
	if err != nil {
		return 0, markJob{}, err
	}
	if !more {
		return written, markJob{}, nil
	}
	return written, markJob{GrantID: job.GrantID, Cursor: next, Depth: depth}, nil
}

// maxMarkDepth bounds the depth hint of a marking job: past the bytes an
// id's randomness spreads keys over, a deeper slice holds one key or none.
const maxMarkDepth = 16

// descendantsAfter returns up to limit ids from the derived index of
// grantID after cursor (from its first id when cursor is empty), in key
// order, whether more follow, and the depth hint for the next call.
//
// It does not scan the index from cursor to its end: on etcd a range
// request costs as much as the keys in its range, however few it returns,
// so a page read from a far end makes marking a large subtree quadratic.
// It reads the index in slices instead — the ids sharing their first depth
// bytes with the position reached — which tile the index in key order, so
// the ids returned are exactly those a scan to the end would have
// returned. depth adapts to the index: a batch that fits in one slice
// narrows the next ones by a byte at least, or to the bytes its first and
// last ids share; a batch that needed more than 8 slices widens them by a
// byte (so a slice holds from a few dozen ids to a few batches, whatever
// the subtree's size); and a slice found empty widens the next to the rest of its parent slice,
// so the gaps between the bytes ids use cost a request each, not one per
// byte value.
func descendantsAfter(tx store.ReadTxn, grantID, cursor string, depth, limit int) (ids []string, more bool, nextDepth int, err error) {
	base := derivedPrefix(grantID)
	pos := ""
	if cursor != "" {
		pos = cursor + "\x00"
	}
	depth = min(max(depth, 0), maxMarkDepth)
	d, parts := depth, 0
	for {
		slice := pos[:min(d, len(pos))]
		var start []byte
		if pos != "" {
			start = append(bytes.Clone(base), pos...)
		}
		found := 0
		err := tx.Scan(append(bytes.Clone(base), slice...), start, func(k, _ []byte) error {
			if len(ids) == limit {
				more = true
				return store.ErrStopScan
			}
			ids = append(ids, idAfter(k, base))
			found++
			return nil
		})
		if err != nil {
			return nil, false, depth, err
		}
		parts++
		if more {
			break
		}
		end := prefixEnd(slice)
		if end == nil {
			break // the slice reached the end of the index
		}
		pos = string(end)
		if found == 0 && d > 0 {
			d = min(d, len(slice)) - 1
		} else {
			d = depth
		}
	}
	if more && parts == 1 {
		// The batch fitted in one slice: narrow, at least to what the
		// batch spans.
		depth = min(max(depth+1, commonPrefix(ids[0], ids[len(ids)-1])), maxMarkDepth)
	} else if parts > 8 && depth > 0 {
		depth--
	}
	return ids, more, depth, nil
}

// prefixEnd is the first string after every string starting with prefix,
// or nil when there is none (prefix empty or all 0xff).
func prefixEnd(prefix string) []byte {
	end := []byte(prefix)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}

// commonPrefix is the length of the longest common prefix of a and b.
func commonPrefix(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// covered decides how a stored grant is revoked through its chain: an
// active grant with a revoked ancestor is revoked by the earliest such
// revocation, unless the grant had already expired by then. It returns
// the marked grant and true, or g and false when nothing covers it: no
// revoked ancestor, g is not active, or g expired first. An error means
// the chain contradicts the stored grants.
//
// The earliest revocation is the truthful one — the grant stopped being
// usable then — and choosing it by time rather than by which marking job
// ran first makes the marker's outcome independent of job order. Ties
// (one clock reading for two revocations) go to the ancestor farthest from
// the root: an ancestor revoked first makes a later revocation of its
// descendants a no-op, so of two direct revocations at one instant the
// deeper one came first, and the marker may already have applied it. An
// ancestor that was itself marked carries its cause's time and names it as
// revoked_via, so choosing it names the same revocation.
func covered(g capability.Grant, lookup capability.GrantLookup) (capability.Grant, bool, error) {
	if g.State != capability.StateActive {
		return g, false, nil
	}
	var (
		earliest capability.Grant
		found    bool
	)
	for _, ancestorID := range g.Chain {
		a, ok := lookup(ancestorID)
		if !ok || a.State != capability.StateRevoked {
			continue
		}
		if !found || !a.RevokedAt.After(earliest.RevokedAt) {
			earliest, found = a, true
		}
	}
	if !found {
		return g, false, nil
	}
	marked, err := capability.MarkRevokedVia(g, earliest)
	switch {
	case errors.Is(err, capability.ErrGrantExpired):
		return g, false, nil
	case err != nil:
		return g, false, err
	}
	return marked, true, nil
}

// PendingMarks is how many marking jobs are stored: revoked subtrees whose
// stored states the marker has not finished rewriting. Revocation does not
// wait for them; operators and benchmarks watch the backlog drain.
func (s *Service) PendingMarks(ctx context.Context) (int, error) {
	n := 0
	err := s.cfg.Store.View(ctx, func(tx store.ReadTxn) error {
		n = 0
		return tx.Scan([]byte(prefixMark), nil, func(_, _ []byte) error { n++; return nil })
	})
	return n, err
}
