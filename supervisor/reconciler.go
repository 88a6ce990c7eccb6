package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/internal/store"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/ledger"
	"github.com/tetherhq/tether/supervisor/privilege"
	"github.com/tetherhq/tether/supervisor/tree"
)

var queueOnce sync.Mutex

func (s *Supervisor) workQueue() *workQueue {
	queueOnce.Lock()
	defer queueOnce.Unlock()
	if s.queue == nil {
		s.queue = newWorkQueue()
	}
	return s.queue
}

// Kick asks the reconciler to look at a termination now.
func (s *Supervisor) Kick(terminationID string) { s.workQueue().add(terminationID) }

// Run is the level-triggered reconciler: it resumes every unfinished
// termination from stored state, re-runs a termination whenever the ledger,
// the tree or the termination changes, and at its deadlines. It runs until
// ctx ends. A watch that ends early (it fell behind) loses events, not
// state: Run re-establishes the watches and rescans.
func (s *Supervisor) Run(ctx context.Context) error {
	q := s.workQueue()
	for {
		err := s.run(ctx, q)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !errors.Is(err, store.ErrWatchLagged) {
			return err
		}
		s.Log.Warn("termination watches lagged; rescanning", "error", err)
	}
}

// run is one pass of Run: it returns when ctx ends, or with an error
// wrapping store.ErrWatchLagged when one of its watches ended.
func (s *Supervisor) run(ctx context.Context, q *workQueue) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ended := make(chan error, 3)
	watches := make([]store.Watcher, 0, 3)
	for _, prefix := range []string{"calls/", prefixNode, prefixTermination} {
		w, err := s.Store.Watch(ctx, []byte(prefix))
		if err != nil {
			return err
		}
		watches = append(watches, w)
	}
	active, err := s.unfinished(ctx)
	if err != nil {
		return err
	}
	var activeMu sync.Mutex
	for _, id := range active {
		q.add(id)
	}
	activeSet := map[string]bool{}
	for _, id := range active {
		activeSet[id] = true
	}
	// A change anywhere in the ledger or the tree may move any unfinished
	// termination: kick them all (the queue coalesces).
	for _, w := range watches {
		go func() {
			for batch := range w.Events() {
				activeMu.Lock()
				for _, ev := range batch {
					if key := string(ev.Key); strings.HasPrefix(key, prefixTermination) && ev.Type == store.EventPut {
						// Only the id and the phase: the members of a
						// large termination are not worth decoding here.
						var t terminationPhase
						if json.Unmarshal(ev.Value, &t) == nil {
							activeSet[t.ID] = t.Phase != PhaseTerminated
						}
					}
				}
				for id, on := range activeSet {
					if on {
						q.add(id)
					}
				}
				activeMu.Unlock()
			}
			ended <- w.Err()
		}()
	}
	for {
		next := q.promote(s.Clock.Now())
		for id := q.take(); id != ""; id = q.take() {
			wake, err := s.Reconcile(ctx, id)
			switch {
			case err != nil && ctx.Err() != nil:
				q.done(id)
				return ctx.Err()
			case err != nil:
				s.Log.Warn("reconcile failed; retrying", "termination_id", id, "error", err)
				q.addAt(id, s.Clock.Now().Add(time.Second))
			case !wake.IsZero():
				q.addAt(id, wake)
			}
			q.done(id)
		}
		// One timer per wait, stopped when the wait ends: a deferred stop
		// here would keep every timer of a leader term alive until Run
		// returns.
		var timerC <-chan time.Time
		var tm *time.Timer
		if !next.IsZero() {
			tm = time.NewTimer(max(next.Sub(s.Clock.Now()), time.Millisecond))
			timerC = tm.C
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-ended:
			return errors.Join(store.ErrWatchLagged, err)
		case <-q.signal:
		case <-timerC:
		}
		if tm != nil {
			tm.Stop()
		}
	}
}

// Poke makes the reconciler re-evaluate its timers now (tests that move a
// manual clock call it).
func (s *Supervisor) Poke() { s.workQueue().notify() }

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
				// started again (a no-op for those already running).
				if err := s.Privileges.Dispatch(ctx, t.Members, t.HookDeadline, func() { s.Kick(t.ID) }); err != nil {
					return time.Time{}, err
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
	if len(t.Members) == 0 {
		return Progress{}, nil
	}
	p := t.Progress
	p.CallsInFlight, p.CancelsPending, p.HooksPending = 0, 0, 0
	now := s.Clock.Now()
	countConfirmations := t.Phase == PhaseReconciling && t.Revoked && now.Before(t.ConfirmDeadline)
	countHooks := t.Phase == PhaseReconciling && t.Revoked && now.Before(t.HookDeadline)
	err := s.Store.View(ctx, func(tx store.ReadTxn) error {
		prefix := termCallPrefix(t.ID)
		var ids []string
		if err := tx.Scan(prefix, nil, func(k, _ []byte) error {
			ids = append(ids, string(k[len(prefix):]))
			return nil
		}); err != nil {
			return err
		}
		if err := store.Prefetch(tx, keysOf(ids, callKey), nil); err != nil {
			return err
		}
		for _, cid := range ids {
			c, err := getCall(tx, cid)
			if err != nil {
				return err
			}
			switch c.State {
			case tetherv1.CallState_CALL_STATE_CANCEL_REQUESTED:
				p.CancelsPending++
			case tetherv1.CallState_CALL_STATE_IN_FLIGHT:
				p.CallsInFlight++
			}
		}
		if countHooks {
			var err error
			if p.HooksPending, err = privilege.PendingIn(tx, t.Members, now); err != nil {
				return err
			}
		}
		if !countConfirmations {
			return nil
		}
		p.Unconfirmed = 0
		if err := store.Prefetch(tx, keysOf(t.Members, nodeKey), nil); err != nil {
			return err
		}
		inWorkload := t.workloadIn(tx)
		for _, m := range t.Members {
			n, err := getNode(tx, m)
			if err != nil {
				return err
			}
			// Wait for a node until its verdict is settled: a claim may
			// still be corroborated (its session's end observed).
			if !judgeExit(n, inWorkload, nil).Settled {
				p.Unconfirmed++
			}
		}
		return nil
	})
	return p, err
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
		return putJSON(tx, terminationKey(id), t)
	})
}

func (s *Supervisor) advance(ctx context.Context, t Termination, action Action, p Progress, now time.Time) error {
	return s.save(ctx, t.ID, t.Phase, func(stored *Termination) error {
		next, err := Advance(*stored, action, p, now)
		*stored = next
		return err
	})
}

// mark marks the whole subtree draining or aborting in one transaction:
// spawns under it and new tool calls stop at the same instant, and a spawn
// that serialized first is in Members. A node another termination is
// stopping is taken over (with its open calls) when this one supersedes
// that one, or left to it; a node already terminated is listed with the
// termination that did it (ReachNode). Every node of the subtree ends in
// exactly one of Members, HandedOver and Prior.
func (s *Supervisor) mark(ctx context.Context, id string, now time.Time) error {
	var members, handedOver []string
	var mode Mode
	err := s.Store.Update(ctx, func(tx store.Txn) error {
		members, handedOver = nil, nil
		inFlight := 0
		var t Termination
		if err := getTermination(tx, id, &t); err != nil {
			return err
		}
		if t.Phase != PhaseRequested {
			return nil
		}
		mode = t.Mode
		var nodes []*tetherv1.Node
		for _, root := range t.RootIDs() {
			subtree, err := tree.SubtreeIn(tx, root)
			if err != nil {
				return err
			}
			nodes = append(nodes, subtree...)
		}
		ids := make([]string, len(nodes))
		for i, n := range nodes {
			ids[i] = n.NodeId
		}
		if err := store.Prefetch(tx, nil, keysOf(ids, openCallPrefix)); err != nil {
			return err
		}
		seen := make(map[string]bool, len(nodes))
		others := map[string]*Termination{}   // the other terminations met, by id
		taken := map[string]map[string]bool{} // other termination → nodes taken from it
		for _, n := range nodes {
			// With several roots, one may lie in another's subtree.
			if seen[n.NodeId] || n.TerminationId == t.ID {
				continue
			}
			seen[n.NodeId] = true
			var owner Termination
			if n.State != tetherv1.NodeState_NODE_STATE_RUNNING && n.TerminationId != "" {
				o, ok := others[n.TerminationId]
				if !ok {
					o = &Termination{}
					if err := getTermination(tx, n.TerminationId, o); err != nil {
						return err
					}
					others[n.TerminationId] = o
				}
				owner = *o
			}
			reach := ReachNode(t, n.State, owner)
			switch reach {
			case ReachPrior:
				rid, err := recordIDOf(tx, owner.ID)
				if err != nil {
					return err
				}
				t.Prior = append(t.Prior, Handoff{NodeID: n.NodeId, TerminationID: owner.ID, RecordID: rid})
				continue
			case ReachLeave:
				t.HandedOver = append(t.HandedOver, Handoff{NodeID: n.NodeId, TerminationID: owner.ID})
				continue
			case ReachTakeOver:
				t.TakenOver = append(t.TakenOver, Handoff{NodeID: n.NodeId, TerminationID: owner.ID, State: tree.StateName(n.State)})
				if taken[owner.ID] == nil {
					taken[owner.ID] = map[string]bool{}
				}
				taken[owner.ID][n.NodeId] = true
			}
			// An exited node keeps its state (it may not act, and the
			// record weighs its exit); every other node stops.
			if n.State != tetherv1.NodeState_NODE_STATE_EXITED {
				n.State = MarkedState(t, n.State)
			}
			n.TerminationId = t.ID
			if err := putNode(tx, n); err != nil {
				return err
			}
			members = append(members, n.NodeId)
			calls, err := ledger.OpenCallsIn(tx, n.NodeId)
			if err != nil {
				return err
			}
			for _, c := range calls {
				if c.State == tetherv1.CallState_CALL_STATE_IN_FLIGHT {
					inFlight++
				}
				if reach == ReachTakeOver && c.TerminationId != "" {
					// The call moves to this termination's account (a
					// cancel order already sent stands): each call is
					// accounted for by exactly one termination.
					if err := tx.Delete(termCallKey(c.TerminationId, c.CallId)); err != nil {
						return err
					}
				}
				c.TerminationId = t.ID
				if err := putCall(tx, c); err != nil {
					return err
				}
				if err := tx.Put(termCallKey(t.ID, c.CallId), nil); err != nil {
					return err
				}
			}
		}
		// The terminations superseded here hand their nodes over.
		for oid, nodes := range taken {
			other := HandOver(*others[oid], nodes, t.ID, now)
			if err := putJSON(tx, terminationKey(oid), other); err != nil {
				return err
			}
			handedOver = append(handedOver, oid)
		}
		t.Members = members
		next, err := Advance(t, ActMark, Progress{CallsInFlight: inFlight, Unconfirmed: len(members)}, now)
		if err != nil {
			return err
		}
		return putJSON(tx, terminationKey(id), next)
	})
	if err == nil && len(members) > 0 {
		s.Log.Info("termination marked the subtree", "termination_id", id, "mode", mode.String(), "nodes", len(members))
	}
	for _, oid := range handedOver {
		s.Log.Info("termination took over nodes from another", "termination_id", id, "superseded_termination_id", oid)
		s.Kick(oid)
	}
	return err
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

// cancelCalls writes a cancel order for every in-flight call of the subtree
// (gates watching their orders get them at once) and advances.
func (s *Supervisor) cancelCalls(ctx context.Context, t Termination, action Action, p Progress, now time.Time) error {
	ts := timestamppb.New(now)
	return s.Store.Update(ctx, func(tx store.Txn) error {
		var stored Termination
		if err := getTermination(tx, t.ID, &stored); err != nil {
			return err
		}
		if stored.Phase != t.Phase {
			return nil
		}
		var nodes [][]byte
		if action == ActEscalate {
			nodes = keysOf(stored.Members, nodeKey)
		}
		if err := store.Prefetch(tx, nodes, keysOf(stored.Members, openCallPrefix)); err != nil {
			return err
		}
		for _, m := range stored.Members {
			if action == ActEscalate {
				// The nodes' state says what the sessions must do: abort now.
				n, err := getNode(tx, m)
				if err != nil {
					return err
				}
				if n.State == tetherv1.NodeState_NODE_STATE_DRAINING {
					n.State = tetherv1.NodeState_NODE_STATE_ABORTING
					if err := putNode(tx, n); err != nil {
						return err
					}
				}
			}
			calls, err := ledger.OpenCallsIn(tx, m)
			if err != nil {
				return err
			}
			for _, c := range calls {
				if err := requestCancelIn(tx, c, t.ID, ts); err != nil {
					return err
				}
				if err := tx.Put(termCallKey(t.ID, c.CallId), nil); err != nil {
					return err
				}
			}
		}
		next, err := Advance(stored, action, p, now)
		if err != nil {
			return err
		}
		return putJSON(tx, terminationKey(t.ID), next)
	})
}

// revoke revokes the subtree's grants, starts revoking its privileges and
// cancels its leases,
// then records that it did. Each part is idempotent, so a crash between them
// repeats only what was not finished.
func (s *Supervisor) revoke(ctx context.Context, t Termination, p Progress, now time.Time) error {
	if !t.Revoked {
		by := "termination:" + t.ID
		reason := "terminated: " + t.Reason
		if s.Grants != nil {
			if err := s.Grants.RevokeHeldBy(ctx, t.Members, by, reason); err != nil {
				return fmt.Errorf("revoke grants: %w", err)
			}
		}
		// Privileges are revoked off this path, in parallel and within
		// the termination's hook deadline (the one Advance sets now).
		if s.Privileges != nil {
			if err := s.Privileges.Dispatch(ctx, t.Members, now.Add(t.HookTimeout), func() { s.Kick(t.ID) }); err != nil {
				return fmt.Errorf("revoke privileges: %w", err)
			}
		}
		// A rollout batch leaves its leases to the rollout, which hands
		// them over to the replacements with generation + 1.
		if s.Leases != nil && !t.LeaseHandover {
			if err := s.Leases.CancelHeldBy(ctx, t.Members, reason); err != nil {
				return fmt.Errorf("cancel leases: %w", err)
			}
		}
	}
	return s.advance(ctx, t, ActRevoke, p, now)
}

// writeRecord writes the reconciliation record and terminates the subtree
// in one transaction guarded by the termination's phase, so exactly one
// record exists however often this runs.
func (s *Supervisor) writeRecord(ctx context.Context, t Termination, p Progress, now time.Time) error {
	var leases []*tetherv1.RecordLease
	var grants []HeldGrant
	var err error
	switch {
	case t.LeaseHandover && s.Handover != nil:
		if leases, err = s.Handover.HeldBy(ctx, t.Members); err != nil {
			return fmt.Errorf("list leases: %w", err)
		}
	case s.Leases != nil && !t.LeaseHandover:
		if leases, err = s.Leases.FinalizeHeldBy(ctx, t.Members, "terminated: "+t.Reason); err != nil {
			return fmt.Errorf("finalize leases: %w", err)
		}
	}
	if s.Grants != nil {
		if grants, err = s.Grants.HeldBy(ctx, t.Members); err != nil {
			return fmt.Errorf("list grants: %w", err)
		}
	}
	var written *tetherv1.ReconciliationRecord
	err = s.Store.Update(ctx, func(tx store.Txn) error {
		written = nil
		var stored Termination
		if err := getTermination(tx, t.ID, &stored); err != nil {
			return err
		}
		if stored.Phase != PhaseReconciling && !stored.Superseded() {
			return nil
		}
		if _, err := tx.Get(recordByTermKey(t.ID)); err == nil {
			return fmt.Errorf("supervisor: termination %s already has a record", t.ID)
		} else if !errors.Is(err, store.ErrNotFound) {
			return err
		}
		next, err := Advance(stored, ActWriteRecord, p, now)
		if err != nil {
			return err
		}
		// Grants and leases were listed before this transaction: keep
		// those of the members still this termination's (another may have
		// taken some over since), so each is in exactly one record.
		grants, leases := membersOnly(next, grants, leases)
		if err := decideUnansweredPrivileges(tx, next, now); err != nil {
			return err
		}
		rec, err := buildRecord(tx, next, grants, leases, now)
		if err != nil {
			return err
		}
		next.RecordID = rec.RecordId
		// The final progress is the record's: every node counted once.
		next.Progress.Unconfirmed = 0
		next.Progress.HooksPending = 0
		for _, n := range rec.Nodes {
			// Nodes an earlier record accounts for are not this one's.
			if n.Outcome == tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED && n.InnerOutcome != tetherv1.InnerOutcome_INNER_OUTCOME_TERMINATED {
				next.Progress.Unconfirmed++
			}
		}
		if err := putRecord(tx, rec); err != nil {
			return err
		}
		if err := tx.Put(outboxKey(rec.RecordId), nil); err != nil {
			return err
		}
		for _, m := range next.Members {
			n, err := getNode(tx, m)
			if err != nil {
				return err
			}
			n.State = tetherv1.NodeState_NODE_STATE_TERMINATED
			if err := putNode(tx, n); err != nil {
				return err
			}
		}
		written = rec
		return putJSON(tx, terminationKey(t.ID), next)
	})
	if err == nil && written != nil {
		unaccounted := 0
		for _, n := range written.Nodes {
			if n.Outcome == tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED {
				unaccounted++
			}
		}
		s.Log.Info("termination complete", "termination_id", t.ID, "record_id", written.RecordId, "nodes", len(written.Nodes), "unaccounted", unaccounted)
	}
	return err
}

// terminationPhase is the part of a stored Termination that says whether
// it is finished.
type terminationPhase struct {
	ID    string `json:"termination_id"`
	Phase Phase  `json:"phase"`
}

// membersOnly keeps the grants and leases held by t's members.
func membersOnly(t Termination, grants []HeldGrant, leases []*tetherv1.RecordLease) ([]HeldGrant, []*tetherv1.RecordLease) {
	if len(t.HandedOver) == 0 {
		return grants, leases
	}
	member := make(map[string]bool, len(t.Members))
	for _, m := range t.Members {
		member[m] = true
	}
	var g []HeldGrant
	for _, x := range grants {
		if member[x.NodeID] {
			g = append(g, x)
		}
	}
	var l []*tetherv1.RecordLease
	for _, x := range leases {
		if member[x.HolderIdentity] {
			l = append(l, x)
		}
	}
	return g, l
}
