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
		k := &s.kicks
		s.reconciler = reconcile.New(reconcile.Config{
			Name: "terminations", Store: s.Store, Clock: s.Clock, Log: s.Log,
			Watch: reconcilerWatches(),
			Scan: func(ctx context.Context) ([]string, error) {
				// The watches are established: from here on they carry
				// every change of a call (what was kept before may have
				// missed some).
				s.calls.reset()
				s.nodes.reset(s.Store)
				ts, err := s.unfinished(ctx)
				if err != nil {
					return nil, err
				}
				k.reset(ts)
				ids := make([]string, len(ts))
				for i, t := range ts {
					ids[i] = t.ID
				}
				return ids, nil
			},
			Changed: func(batch []store.Event, kick func(string)) {
				s.calls.apply(batch)
				s.nodes.apply(batch)
				k.changed(batch, kick, s.calls.drop)
			},
			// The trees take turns: a rogue's terminations that move at
			// once wait for another tree's between each of theirs.
			Group:     k.treeOf,
			Reconcile: s.Reconcile,
		})
	})
	return s.reconciler
}

// reconcilerWatches are the prefixes the reconcile loop watches: the
// ledger's keys that may move a termination (not every key of the ledger:
// an acknowledgement's open index, count, cancel order and note of its end
// were delivered and dropped), the tree's nodes, and the terminations.
func reconcilerWatches() [][]byte {
	return append(ledger.TerminationPrefixes(), []byte(tree.NodePrefix), []byte(prefixTermination))
}

// Kick asks the reconciler to look at a termination now.
func (s *Supervisor) Kick(terminationID string) { s.loop().Kick(terminationID) }

// KickRequested kicks a termination just requested (Terminate, TerminateIn,
// Decide, FileRuleProposal), once its transaction has committed, in its
// tree's turn: its stored value reaches the loop's watch later, and a kick
// before it would have it take the turn of the terminations not placed
// yet, which a rogue's finished ones share (their last passes).
func (s *Supervisor) KickRequested(t Termination) {
	s.kicks.noteGroup(t)
	s.Kick(t.ID)
}

// Run is the level-triggered reconciler (internal/reconcile): it resumes
// every unfinished termination from stored state, re-runs a termination
// whenever a change of the ledger, the tree or the termination may move it
// (terminationKicks), and at its deadlines. It runs until ctx ends; a watch that falls behind costs a
// rescan.
func (s *Supervisor) Run(ctx context.Context) error { return s.loop().Run(ctx) }

// terminationKicks knows which terminations are unfinished (from the scan
// and the termination puts since) and where their subtrees are, and kicks
// only the ones a committed change may move.
//
// What moves a waiting termination (Next, observe) is: its own stored
// state (a step, a take-over's HandOver); the calls it accounts for (each
// stamped with its id, listed under its id in the ledger's index); its
// members' nodes (each names it while it stops it: confirmations,
// sessions, contradictions); the nodes that confirmed a member's exit as
// its ancestors, whose being stopped turns the confirmation into a claim
// (workloadIn); its privileges' revocations (which kick it themselves,
// Privileges.Dispatch); and its deadlines (the loop's timers). So a change
// kicks:
//
//   - a termination's put: that termination;
//   - a call: the termination it is stamped with; the ledger's index of a
//     termination's calls or refusals: that termination;
//   - a node: the termination it names, the terminations rooted at it or
//     above it (it is in their subtree), and, when it is stopped or its
//     exit confirmed, those rooted below it (it may have confirmed a
//     member's exit; a node never runs again once stopped, so a running
//     node's change cannot turn a confirmation into a claim) — including
//     every termination whose roots' ancestors are not known yet. Being
//     stopped or confirmed is for good, so each termination rooted below
//     is kicked once for it (aboveKicked), not by each later write of the
//     node: a stopped rogue's heartbeat, every LastSeenEvery, kicked each
//     of the stops it kept unfinished below itself, however many, a
//     reconcile each (rogue39j test
//     TestRogue39JAStoppedRoguesHeartbeatsDoNotKickTheStopsBelowIt);
//   - anything it cannot read or place (a delete, a value it cannot
//     decode, a key it does not know): every unfinished termination, as
//     before.
//
// A scan kicks every termination. An agent that keeps many terminations
// of its own descendants unfinished (each waiting a day for confirmations
// its children never send) no longer costs a reconcile of each per change
// elsewhere in the cluster.
type terminationKicks struct {
	// trees: termination → its group (a string: its tree, or its tree's
	// operators' turn), the loop's group (treeOf); read without mu,
	// which changed holds while it kicks.
	trees  sync.Map
	mu     sync.Mutex
	active map[string]*kickPlace
	// byRoot: root node → the unfinished terminations rooted there;
	// byAbove: node → the placed terminations with a root below it.
	byRoot, byAbove map[string]map[string]bool
	// aboveKicked: node → the terminations of byAbove[node] kicked since
	// the node was seen stopped or its exit confirmed (each is kicked for
	// that once; one placed later, at the node's next write).
	aboveKicked map[string]map[string]bool
	unplaced    map[string]bool
}

// kickPlace is where an unfinished termination's subtree is: its roots
// and, once placed (Reconcile reads the roots' nodes), their ancestors.
type kickPlace struct {
	roots  []string
	above  []string
	placed bool
}

func (k *terminationKicks) reset(ts []terminationPlace) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.active, k.byRoot, k.byAbove, k.unplaced = map[string]*kickPlace{}, map[string]map[string]bool{}, map[string]map[string]bool{}, map[string]bool{}
	k.aboveKicked = map[string]map[string]bool{}
	k.trees.Clear()
	for _, t := range ts {
		k.addLocked(t)
	}
}

func addTo(m map[string]map[string]bool, key, id string) {
	if m[key] == nil {
		m[key] = map[string]bool{}
	}
	m[key][id] = true
}

func removeFrom(m map[string]map[string]bool, key, id string) {
	delete(m[key], id)
	if len(m[key]) == 0 {
		delete(m, key)
	}
}

// addLocked notes an unfinished termination (no-op if known).
func (k *terminationKicks) addLocked(t terminationPlace) {
	if k.active == nil {
		k.reset(nil)
	}
	if _, ok := k.active[t.ID]; ok {
		return
	}
	p := &kickPlace{roots: t.rootIDs()}
	k.active[t.ID] = p
	if g := t.group(); g != "" {
		k.trees.Store(t.ID, g)
	}
	for _, r := range p.roots {
		addTo(k.byRoot, r, t.ID)
	}
	k.unplaced[t.ID] = true
}

func (k *terminationKicks) removeLocked(id string) {
	p := k.active[id]
	if p == nil {
		return
	}
	for _, r := range p.roots {
		removeFrom(k.byRoot, r, id)
	}
	for _, a := range p.above {
		removeFrom(k.byAbove, a, id)
		removeFrom(k.aboveKicked, a, id)
	}
	delete(k.unplaced, id)
	delete(k.active, id)
	k.trees.Delete(id)
}

// noteGroup notes a termination's group before its first kick (its stored
// value reaches changed later).
func (k *terminationKicks) noteGroup(t Termination) {
	if g := treeGroup(t.Tree, t.RequesterLineage, t.RequestedBy); g != "" {
		k.trees.Store(t.ID, g)
	}
}

// treeOf is the reconcile loop's group of a termination: its tree (its
// operators' stops a turn of their own, beside its agents'), or, for one
// stored before the tree was kept, the top of its roots' ancestors once
// placed (until then every such termination shares one group).
func (k *terminationKicks) treeOf(id string) string {
	if t, ok := k.trees.Load(id); ok {
		return t.(string)
	}
	return ""
}

// needsPlace says whether the termination's roots' ancestors are wanted.
func (k *terminationKicks) needsPlace(id string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.unplaced[id]
}

// place notes the ancestors of an unfinished termination's roots (a
// node's ancestors never change).
func (k *terminationKicks) place(id string, above []string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	p := k.active[id]
	if p == nil || p.placed {
		return
	}
	p.above, p.placed = above, true
	if _, known := k.trees.Load(id); !known {
		if len(above) > 0 {
			k.trees.Store(id, above[0])
		} else if len(p.roots) > 0 {
			k.trees.Store(id, p.roots[0])
		}
	}
	for _, a := range above {
		addTo(k.byAbove, a, id)
	}
	delete(k.unplaced, id)
}

// changed kicks the unfinished terminations a batch of changes may move
// (the queue coalesces).
func (k *terminationKicks) changed(batch []store.Event, kick func(string), finished func(string)) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.active == nil {
		k.reset(nil)
	}
	all := false
	kickSet := func(ids map[string]bool) {
		for id := range ids {
			kick(id)
		}
	}
	kickOne := func(id string) {
		if id != "" && k.active[id] != nil {
			kick(id)
		}
	}
	for _, ev := range batch {
		key := string(ev.Key)
		if len(k.active) == 0 && !strings.HasPrefix(key, prefixTermination) {
			continue // nothing to kick: no call or node is decoded
		}
		switch {
		case strings.HasPrefix(key, prefixTermination):
			if ev.Type != store.EventPut {
				all = true
				continue
			}
			// Only the id, the phase and the roots: the members of a
			// large termination are not worth decoding here.
			var t terminationPlace
			if json.Unmarshal(ev.Value, &t) != nil {
				all = true
				continue
			}
			if t.Phase == PhaseTerminated {
				k.removeLocked(t.ID)
				finished(t.ID)
				continue
			}
			k.addLocked(t)
			kick(t.ID)
		case strings.HasPrefix(key, nodeKeyPrefix):
			var n tree.Node
			if ev.Type != store.EventPut || tree.UnmarshalNode(ev.Value, &n) != nil {
				all = true
				continue
			}
			id := key[len(nodeKeyPrefix):]
			kickOne(n.TerminationID)
			kickSet(k.byRoot[id])
			for _, a := range n.Ancestors {
				kickSet(k.byRoot[a])
			}
			if n.State != tree.NodeStateRunning || tree.ExitConfirmed(&n) {
				for below := range k.byAbove[id] {
					if !k.aboveKicked[id][below] {
						addTo(k.aboveKicked, id, below)
						kick(below)
					}
				}
				kickSet(k.unplaced)
			} else {
				// (Not for good after all: its next stop or
				// confirmation kicks them again.)
				delete(k.aboveKicked, id)
			}
		case strings.HasPrefix(key, callKeyPrefix):
			var c ledger.ToolCall
			if ev.Type != store.EventPut || ledger.UnmarshalCall(ev.Value, &c) != nil {
				all = true
				continue
			}
			kickOne(c.TerminationID)
		case strings.HasPrefix(key, termCallKeyPrefix):
			kickOne(firstSegment(key[len(termCallKeyPrefix):]))
		case strings.HasPrefix(key, refusedKeyPrefix):
			kickOne(firstSegment(key[len(refusedKeyPrefix):]))
		case strings.HasPrefix(key, openCallKeyPrefix), strings.HasPrefix(key, openCountKeyPrefix), strings.HasPrefix(key, cancelKeyPrefix), strings.HasPrefix(key, endedOnKeyPrefix):
			// Written only beside the call's own key, in its
			// transaction (not watched: ledger.TerminationPrefixes).
		case strings.HasPrefix(key, refusedMoreKeyPrefix):
			// A count the record reads; it moves no termination.
		default:
			all = true
		}
	}
	if all {
		for id := range k.active {
			kick(id)
		}
	}
}

// firstSegment is s up to its first '/'.
func firstSegment(s string) string {
	if i := strings.IndexByte(s, '/'); i >= 0 {
		return s[:i]
	}
	return s
}

var (
	openCallKeyPrefix    = strings.TrimSuffix(string(ledger.OpenCallPrefix("x")), "x/")
	openCountKeyPrefix   = strings.TrimSuffix(string(ledger.OpenCountKey("x")), "x")
	cancelKeyPrefix      = strings.TrimSuffix(string(ledger.CancelKey("x", "y")), "x/y")
	refusedKeyPrefix     = strings.TrimSuffix(string(ledger.RefusedPrefix("x", "y")), "x/y/")
	endedOnKeyPrefix     = strings.TrimSuffix(string(ledger.EndedOnPrefix("x")), "x/")
	refusedMoreKeyPrefix = strings.TrimSuffix(string(ledger.RefusedMoreKey("x", "y")), "x/y")
)

func (s *Supervisor) unfinished(ctx context.Context) ([]terminationPlace, error) {
	var out []terminationPlace
	err := s.Store.View(ctx, func(tx store.ReadTxn) error {
		out = out[:0]
		return tx.Scan([]byte(prefixTermination), nil, func(_, v []byte) error {
			var t terminationPlace
			if err := json.Unmarshal(v, &t); err != nil {
				return err
			}
			if t.Phase != PhaseTerminated {
				out = append(out, t)
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
	if s.Reconciled != nil {
		s.Reconciled(terminationID)
	}
	if s.kicks.needsPlace(terminationID) {
		// Where its subtree is, for the kicks (once per scan; a read that
		// fails leaves it kicked by more changes than it needs).
		var above []string
		if err := s.Store.View(ctx, func(tx store.ReadTxn) error {
			var t terminationPlace
			if err := kv.GetJSON(tx, terminationKey(terminationID), &t); err != nil {
				return err
			}
			var err error
			above, err = rootsAncestors(tx, t.rootIDs())
			return err
		}); err == nil {
			s.kicks.place(terminationID, above)
		}
	}
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
				// Their revocation began (t.Revoked) while they were
				// live, so none is decided expired now (Resume).
				kick := func() { s.Kick(t.ID) }
				if t.HeldIndexed {
					pending, err := store.Read(ctx, s.Store, func(tx store.ReadTxn) ([]privilege.Privilege, error) { return pendingHeld(tx, t) })
					if err == nil {
						err = s.Privileges.Resume(ctx, pending, t.HookDeadline, kick)
					}
					if err != nil {
						return time.Time{}, err
					}
				} else {
					members, err := s.Members(ctx, t)
					if err != nil {
						return time.Time{}, err
					}
					if err := s.Privileges.ResumeNodes(ctx, members, t.HookDeadline, kick); err != nil {
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
			err = s.markWith(ctx, t.ID, &t, now)
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

// rootsAncestors is the ancestors of the roots, once each.
func rootsAncestors(tx store.ReadTxn, roots []string) ([]string, error) {
	if err := store.Prefetch(tx, store.KeysOf(roots, tree.NodeKey), nil); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []string
	for _, r := range roots {
		n, err := tree.GetNodeIn(tx, r)
		if err != nil {
			return nil, err
		}
		for _, a := range n.Ancestors {
			if !seen[a] {
				seen[a] = true
				out = append(out, a)
			}
		}
	}
	return out, nil
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
		// The two lists read first, together (one request on etcd where
		// two went in turn): the calls the termination accounts for, and
		// the privileges its held index lists.
		var scans []store.ScanFrom
		if !cached {
			scans = append(scans, store.ScanFrom{Prefix: ledger.TermCallPrefix(t.ID)})
		}
		if countHooks && t.HeldIndexed {
			scans = append(scans, heldScanFrom(t.ID, heldPrivilege, 0))
		}
		if len(scans) > 1 {
			if err := store.PrefetchReads(tx, nil, scans); err != nil {
				return err
			}
		}
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
			pending, err := pendingHeld(tx, t)
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
			if p.HooksPending, err = privilege.PendingIn(tx, members); err != nil {
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

// terminationPlace is the part of a stored Termination that says whether
// it is finished and where its subtree is.
type terminationPlace struct {
	ID     string   `json:"termination_id"`
	Phase  Phase    `json:"phase"`
	NodeID string   `json:"node_id"`
	Roots  []string `json:"roots,omitempty"`
	Tree   string   `json:"tree,omitempty"`
	// RequesterLineage: empty for an operator's (or an operator's
	// rule's, a rollout's) termination.
	RequesterLineage []string `json:"requester_lineage,omitempty"`
	// RequestedBy: PolicyDecider's for a stop the policy approved.
	RequestedBy string `json:"requested_by,omitempty"`
}

// group is the termination's turn in the reconcile loop: its tree's, and
// for a stop no agent requested its tree's operators' turn, so that an
// operator's stop of a rogue's tree does not wait behind the rogue's own
// terminations there ("" when the tree is not stored).
func (t terminationPlace) group() string {
	return treeGroup(t.Tree, t.RequesterLineage, t.RequestedBy)
}

// treeGroup is the turn of a termination of tree requested by requestedBy
// for the agent of requesterLineage: its tree's agents' turn for an
// agent's (or an agent's approved proposal, or an agent's rule's); a turn
// of their own for the stops an operator's policy approved (its stop
// rules' actions: a rogue that makes a rule true on each of its nodes
// queues as many stops there); and its operators' turn for the rest (an
// operator's stop, its decision on a proposal, a rollout's batch). The
// agents' turn is each requesting agent's own (its node's): until the
// forty-third pass a tree's agents shared one, so an honest planner's stop
// of its rogue child's worker waited behind each of the rogue's own
// terminations that moved at once (49 passes of 50, rogue43p test).
func treeGroup(tree string, requesterLineage []string, requestedBy string) string {
	switch {
	case tree == "":
		return tree
	case len(requesterLineage) > 0:
		return tree + " (agent " + requesterLineage[len(requesterLineage)-1] + ")"
	case strings.HasPrefix(requestedBy, PolicyDecider):
		return tree + " (operators' policy)"
	}
	return tree + " (operators)"
}

func (t terminationPlace) rootIDs() []string {
	if len(t.Roots) > 0 {
		return t.Roots
	}
	return []string{t.NodeID}
}

// pendingHeld is the undecided privileges of t's members (privilege.Pending), from
// the held index: the privileges its revocation listed, less those of nodes
// another termination has taken over since (only the nodes of privileges
// still pending are read).
func pendingHeld(tx store.ReadTxn, t Termination) ([]privilege.Privilege, error) {
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
		if privilege.Pending([]privilege.Privilege{p}) > 0 {
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
