package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/tetherhq/tether/internal/reconcile"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/internal/kv"
	"github.com/tetherhq/tether/supervisor/ledger"
	"github.com/tetherhq/tether/supervisor/privilege"
	"github.com/tetherhq/tether/supervisor/tree"
)

// loop is the termination reconciler's loop, built on first use (Kick may
// come before Run).
func (s *Supervisor) loop() *reconcile.Loop {
	s.loopOnce.Do(func() {
		k := &terminationKicks{active: map[string]bool{}}
		s.reconciler = reconcile.New(reconcile.Config{
			Name: "terminations", Store: s.Store, Clock: s.Clock, Log: s.Log,
			Watch: [][]byte{[]byte(ledger.Prefix), []byte(tree.NodePrefix), []byte(prefixTermination)},
			Scan: func(ctx context.Context) ([]string, error) {
				// The watches are established: from here on they carry
				// every change of a call (what was kept before may have
				// missed some).
				s.calls.reset()
				s.nodes.reset()
				ids, err := s.unfinished(ctx)
				if err == nil {
					k.reset(ids)
				}
				return ids, err
			},
			Changed: func(batch []store.Event, kick func(string)) {
				s.calls.apply(batch)
				s.nodes.apply(batch)
				k.changed(batch, kick, s.calls.drop)
			},
			Reconcile: s.Reconcile,
		})
	})
	return s.reconciler
}

// Kick asks the reconciler to look at a termination now.
func (s *Supervisor) Kick(terminationID string) { s.loop().Kick(terminationID) }

// Run is the level-triggered reconciler (internal/reconcile): it resumes
// every unfinished termination from stored state, re-runs a termination
// whenever the ledger, the tree or the termination changes, and at its
// deadlines. It runs until ctx ends; a watch that falls behind costs a
// rescan.
func (s *Supervisor) Run(ctx context.Context) error { return s.loop().Run(ctx) }

// terminationKicks knows which terminations are unfinished, from the scan
// and the termination puts since.
type terminationKicks struct {
	mu     sync.Mutex
	active map[string]bool
}

func (k *terminationKicks) reset(ids []string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	clear(k.active)
	for _, id := range ids {
		k.active[id] = true
	}
}

// changed kicks every unfinished termination: a change anywhere in the
// ledger or the tree may move any of them (the queue coalesces).
func (k *terminationKicks) changed(batch []store.Event, kick func(string), finished func(string)) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, ev := range batch {
		if key := string(ev.Key); strings.HasPrefix(key, prefixTermination) && ev.Type == store.EventPut {
			// Only the id and the phase: the members of a large
			// termination are not worth decoding here.
			var t terminationPhase
			if json.Unmarshal(ev.Value, &t) == nil {
				if t.Phase == PhaseTerminated {
					delete(k.active, t.ID)
					finished(t.ID)
				} else {
					k.active[t.ID] = true
				}
			}
		}
	}
	for id := range k.active {
		kick(id)
	}
}

func (s *Supervisor) unfinished(ctx context.Context) ([]string, error) {
	var out []string
	err := s.Store.View(ctx, func(tx store.ReadTxn) error {
		return tx.Scan([]byte(prefixTermination), nil, func(_, v []byte) error {
			var t terminationPhase
			if err := json.Unmarshal(v, &t); err != nil {
				return err
			}
			if t.Phase != PhaseTerminated {
				out = append(out, t.ID)
			}
			return nil
		})
	})
	return out, err
}

// Reconcile moves one termination as far as it can go now and returns when
// to look again (zero: when something changes). It is idempotent: every
// step re-reads stored state and persists before the next.
func (s *Supervisor) Reconcile(ctx context.Context, terminationID string) (time.Time, error) {
	for range 16 {
		var t Termination
		if err := s.Store.View(ctx, func(tx store.ReadTxn) error { return getTermination(tx, terminationID, &t) }); err != nil {
			return time.Time{}, err
		}
		if !t.Indexed && t.Phase != PhaseRequested && t.Phase != PhaseTerminated {
			// Stored before the subtree index: list it there first.
			if err := s.index(ctx, t.ID); err != nil {
				return time.Time{}, err
			}
			continue
		}
		progress, err := s.observe(ctx, t)
		if err != nil {
			return time.Time{}, err
		}
		now := s.Clock.Now()
		action, wake := Next(t, progress, now)
		switch action {
		case ActNone:
			return time.Time{}, nil
		case ActWait:
			if progress.HooksPending > 0 && s.Privileges != nil {
				// After a restart the revocations still undecided are
				// started again (a no-op for those already running):
				// those the held index lists, or else every member's.
				kick := func() { s.Kick(t.ID) }
				if t.HeldIndexed {
					pending, err := store.Read(ctx, s.Store, func(tx store.ReadTxn) ([]privilege.Privilege, error) { return pendingHeld(tx, t, now) })
					if err == nil {
						err = s.Privileges.DispatchRead(ctx, pending, t.HookDeadline, kick)
					}
					if err != nil {
						return time.Time{}, err
					}
				} else {
					members, err := s.Members(ctx, t)
					if err != nil {
						return time.Time{}, err
					}
					if err := s.Privileges.Dispatch(ctx, members, t.HookDeadline, kick); err != nil {
						return time.Time{}, err
					}
				}
			}
			if progress != t.Progress {
				if err := s.save(ctx, t.ID, t.Phase, func(t *Termination) error { t.Progress = progress; t.UpdatedAt = now; return nil }); err != nil {
					return time.Time{}, err
				}
			}
			return wake, nil
		case ActMark:
			err = s.mark(ctx, t.ID, now)
		case ActEndDrain:
			err = s.advance(ctx, t, action, progress, now)
		case ActEscalate, ActCancelCalls:
			err = s.cancelCalls(ctx, t, action, progress, now)
		case ActRevoke:
			err = s.revoke(ctx, t, progress, now)
		case ActWriteRecord:
			err = s.writeRecord(ctx, t, progress, now)
		}
		if err != nil {
			return time.Time{}, err
		}
		// A step starts a new wait, and what was kept for the old one may
		// be behind the step's own writes (the escalation's cancel
		// orders: a drain's kept "in flight" would read as no
		// acknowledgement pending, and the abort would revoke at once).
		// The next wait reads its calls again.
		s.calls.drop(t.ID)
		s.chunkDone(action)
	}
	return s.Clock.Now(), nil // more to do: come back at once
}

// observe reads the subtree's progress from the ledger and the tree. The
// calls it counts are the ones the termination accounts for (stamped when
// the subtree was marked; no call can begin after that), so the cost is
// O(calls), not O(subtree). Confirmations are counted only when they decide
// something — while the reconciler waits for them — because that costs a
// read per node; before then the count from the mark is kept for display.
func (s *Supervisor) observe(ctx context.Context, t Termination) (Progress, error) {
	if t.MemberCount() == 0 && t.Phase != PhaseRequested {
		return Progress{}, nil
	}
	if t.Phase == PhaseRequested || t.Phase == PhaseTerminated || t.Cursor.Step != ActWait {
		// Nothing observed decides a step in progress (Next), and a pass
		// per chunk must not read the whole subtree.
		return t.Progress, nil
	}
	p := t.Progress
	p.CallsInFlight, p.CancelsPending, p.HooksPending = 0, 0, 0
	now := s.Clock.Now()
	countConfirmations := t.Phase == PhaseReconciling && t.Revoked && now.Before(t.ConfirmDeadline)
	countHooks := t.Phase == PhaseReconciling && t.Revoked && now.Before(t.HookDeadline)
	var ended []string
	// The open calls as kept since an earlier pass of this wait (the
	// watch moves them forward), else read here and kept (callcache.go).
	kept, cached := s.calls.get(t.ID)
	keeping := !cached && s.calls.reading()
	var open map[string]ledger.CallState
	var rev uint64
	err := s.Store.View(ctx, func(tx store.ReadTxn) error {
		ended = ended[:0]
		p.CancelsPending, p.CallsInFlight = 0, 0
		if cached {
			for _, st := range kept {
				switch st {
				case ledger.CallStateCancelRequested:
					p.CancelsPending++
				case ledger.CallStateInFlight:
					p.CallsInFlight++
				}
			}
		} else {
			ids, err := kv.AppendIDs(tx, nil, ledger.TermCallPrefix(t.ID))
			if err != nil {
				return err
			}
			// A call ended stays ended: those seen ended on an earlier
			// pass count for nothing and are not read again (a pass per
			// batch of acknowledgements would re-read them all).
			ids = s.ended.open(ids)
			if err := store.Prefetch(tx, store.KeysOf(ids, ledger.CallKey), nil); err != nil {
				return err
			}
			open, rev = map[string]ledger.CallState{}, tx.Revision()
			for _, cid := range ids {
				c, err := ledger.GetCallIn(tx, cid)
				if err != nil {
					return err
				}
				switch c.State {
				case ledger.CallStateCancelRequested:
					p.CancelsPending++
				case ledger.CallStateInFlight:
					p.CallsInFlight++
				case ledger.CallStateEnded:
					ended = append(ended, cid)
				}
				if c.State != ledger.CallStateEnded {
					open[cid] = c.State
				}
			}
		}
		if countHooks && t.HeldIndexed {
			pending, err := pendingHeld(tx, t, now)
			if err != nil {
				return err
			}
			p.HooksPending, countHooks = len(pending), false
		}
		if !countHooks && !countConfirmations {
			return nil
		}
		members, err := membersIn(tx, t)
		if err != nil {
			return err
		}
		if countHooks {
			if p.HooksPending, err = privilege.PendingIn(tx, members, now); err != nil {
				return err
			}
		}
		if !countConfirmations {
			return nil
		}
		p.Unconfirmed = 0
		if err := store.Prefetch(tx, store.KeysOf(members, tree.NodeKey), nil); err != nil {
			return err
		}
		inWorkload := t.workloadIn(tx)
		for _, m := range members {
			n, err := tree.GetNodeIn(tx, m)
			if err != nil {
				return err
			}
			// Wait for a node until its verdict is settled: a claim may
			// still be corroborated (its session's end observed).
			if !tree.JudgeExit(n, inWorkload, nil).Settled {
				p.Unconfirmed++
			}
		}
		return nil
	})
	if keeping {
		s.calls.done(t.ID, rev, open, err == nil)
	}
	if err == nil {
		s.ended.remember(ended)
	}
	return p, err
}

// endedCalls is a set of calls seen ended. It is bounded: when full it
// starts afresh (a call it forgot costs a read again, no more).
type endedCalls struct {
	mu  sync.Mutex
	ids map[string]struct{}
}

const maxEndedCalls = 1 << 16

// open returns the ids not known to be ended, in order.
func (e *endedCalls) open(ids []string) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := ids[:0:0]
	for _, id := range ids {
		if _, done := e.ids[id]; !done {
			out = append(out, id)
		}
	}
	return out
}

func (e *endedCalls) remember(ids []string) {
	if len(ids) == 0 {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ids == nil || len(e.ids)+len(ids) > maxEndedCalls {
		e.ids = make(map[string]struct{}, len(ids))
	}
	for _, id := range ids {
		e.ids[id] = struct{}{}
	}
}

// save applies fn to the stored termination if it is still in phase.
func (s *Supervisor) save(ctx context.Context, id string, phase Phase, fn func(*Termination) error) error {
	return s.Store.Update(ctx, func(tx store.Txn) error {
		var t Termination
		if err := getTermination(tx, id, &t); err != nil {
			return err
		}
		if t.Phase != phase {
			return nil // someone else moved it; the next pass re-reads
		}
		if err := fn(&t); err != nil {
			return err
		}
		return kv.PutJSON(tx, terminationKey(id), t)
	})
}

func (s *Supervisor) advance(ctx context.Context, t Termination, action Action, p Progress, now time.Time) error {
	return s.save(ctx, t.ID, t.Phase, func(stored *Termination) error {
		next, err := Advance(*stored, action, p, now)
		*stored = next
		return err
	})
}

// recordIDOf is the record of a finished termination ("" if none).
func recordIDOf(tx store.ReadTxn, terminationID string) (string, error) {
	if terminationID == "" {
		return "", nil
	}
	v, err := tx.Get(recordByTermKey(terminationID))
	if errors.Is(err, store.ErrNotFound) {
		return "", nil
	}
	return string(v), err
}

// terminationPhase is the part of a stored Termination that says whether
// it is finished.
type terminationPhase struct {
	ID    string `json:"termination_id"`
	Phase Phase  `json:"phase"`
}

// pendingHeld is the undecided, unexpired privileges of t's members, from
// the held index: the privileges its revocation listed, less those of nodes
// another termination has taken over since (only the nodes of privileges
// still pending are read).
func pendingHeld(tx store.ReadTxn, t Termination, now time.Time) ([]privilege.Privilege, error) {
	items, err := readHeld(tx, t.ID, heldPrivilege, 0, -1)
	if err != nil || len(items) == 0 {
		return nil, err
	}
	ids := make([]string, len(items))
	for i, it := range items {
		ids[i] = it.id
	}
	privs, err := privilege.ByID(tx, ids)
	if err != nil {
		return nil, err
	}
	var pending []privilege.Privilege
	var nodes []string
	for _, p := range privs {
		if privilege.Pending([]privilege.Privilege{p}, now) > 0 {
			pending = append(pending, p)
			nodes = append(nodes, p.NodeID)
		}
	}
	if err := store.Prefetch(tx, store.KeysOf(nodes, tree.NodeKey), nil); err != nil {
		return nil, err
	}
	out := pending[:0]
	for _, p := range pending {
		node, err := tree.GetNodeIn(tx, p.NodeID)
		if err != nil {
			return nil, err
		}
		if node.TerminationID == t.ID {
			out = append(out, p)
		}
	}
	return out, nil
}
