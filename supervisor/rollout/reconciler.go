package rollout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/reconcile"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor"
	"github.com/tetherhq/tether/supervisor/internal/kv"
	"github.com/tetherhq/tether/supervisor/tree"
)

// Rollouts replaces the agents matching a selector in batches through the
// supervisor's terminations. A rollout is a persisted desired state;
// Run is its level-triggered reconciler (see NextRollout for the rules).
type Rollouts struct {
	Store      store.Store
	Clock      clock.Clock
	Supervisor *supervisor.Supervisor
	// Handover reassigns the leases of drained agents; nil: leases stay
	// where they are (and expire).
	Handover supervisor.LeaseHandover
	Log      *slog.Logger
	// Fault, when set, is called at "before-start-batch": after the
	// reconciler chose a batch's agents from what it observed, before the
	// transaction that starts the batch; and at "before-reassign": in a
	// handover pass, before each lease it reassigns; and at "observe": as
	// each observation of an unfinished rollout's facts begins (a read of
	// every node). Tests only: it lets a test act (an agent claiming its
	// exit, a job's coordinator moving a lease) between the two, or count
	// what a change cost.
	Fault func(point string)

	loopOnce   sync.Once
	reconciler *reconcile.Loop

	activeMu sync.Mutex
	active   map[string]selectors // unfinished rollouts' selectors
	// batches: the termination of each unfinished batch of an unfinished
	// rollout, and that rollout (the only termination changes that move
	// one); seen: what kickFor last read of each node one of their
	// selectors matches (nodeFacts), rebuilt from the next write of each
	// after a rescan.
	batches map[string]string
	seen    map[string]nodeFacts
}

type selectors struct{ from, to map[string]string }

// nodeFacts is what a rollout reads of a node that can change: its state,
// the termination stopping it, and when it reported ready. A write that
// changes none of them (a session's heartbeat) moves no rollout.
type nodeFacts struct {
	state       tree.NodeState
	termination string
	ready       bool
	readyAt     int64 // Unix nanoseconds: compared as a number, whatever the location decoded
}

func factsOf(n *tree.Node) nodeFacts {
	f := nodeFacts{state: n.State, termination: n.TerminationID, ready: !n.ReadyAt.IsZero()}
	if f.ready {
		f.readyAt = n.ReadyAt.UnixNano()
	}
	return f
}

// movesRollout reports whether a change to node n, whose facts changed,
// may move a rollout with selectors sel: a node it may drain (matching
// from, not to), or a replacement that reported ready (matching to). A
// node labelled like a replacement that never reported ready is counted
// by no rollout, whatever it does: any agent may label its children so.
func movesRollout(n *tree.Node, sel selectors) bool {
	if tree.MatchLabels(n.Labels, sel.to) {
		return !n.ReadyAt.IsZero()
	}
	return tree.MatchLabels(n.Labels, sel.from)
}

// loop is the rollout reconciler's loop, built on first use (Kick may
// come before Run).
func (rs *Rollouts) loop() *reconcile.Loop {
	rs.loopOnce.Do(func() {
		rs.reconciler = reconcile.New(reconcile.Config{
			Name: "rollouts", Store: rs.Store, Clock: rs.Clock, Log: rs.Log,
			Watch: [][]byte{[]byte(prefixRollout), []byte(supervisor.TerminationPrefix), []byte(tree.NodePrefix)},
			Scan:  rs.unfinished, Changed: rs.kickFor, Reconcile: rs.Reconcile,
		})
	})
	return rs.reconciler
}

// Kick asks the reconciler to look at a rollout now.
func (rs *Rollouts) Kick(rolloutID string) { rs.loop().Kick(rolloutID) }

// Start validates and persists a rollout; the reconciler does the rest.
func (rs *Rollouts) Start(ctx context.Context, req RolloutRequest) (Rollout, error) {
	target, err := tree.ParseSelector(req.TargetSelector)
	if err != nil {
		return Rollout{}, err
	}
	var r Rollout
	err = rs.Store.Update(ctx, func(tx store.Txn) error {
		// The baseline: the replacements that were ready already. Only
		// vouched ones count at all until the rollout drains a node of
		// their tree (credited), and those must report ready afterwards.
		// One a stop covers is not counted, as the observations do not
		// count it (coveredByStop).
		var readyNodes []*tree.Node
		vouched := map[string]bool{}
		stopping := map[string]tree.LineageStop{}
		if err := scanNodes(tx, func(n *tree.Node) {
			if len(n.Ancestors) == 0 && tree.MatchLabels(n.Labels, target) {
				vouched[n.NodeID] = true
			}
			if stopsBelow(n) {
				stopping[n.NodeID] = tree.LineageStop{NodeID: n.NodeID, State: n.State, TerminationID: n.TerminationID}
			}
			if isReady(n) && tree.MatchLabels(n.Labels, target) {
				readyNodes = append(readyNodes, n)
			}
		}); err != nil {
			return err
		}
		if err := stopRequests(tx, stopping); err != nil {
			return err
		}
		ready := 0
		var readyBy time.Time
		for _, n := range readyNodes {
			if vouched[tree.Root(n)] && !coveredByStop(n.NodeID, n.Ancestors, stopping) {
				ready++
				if n.ReadyAt.After(readyBy) {
					readyBy = n.ReadyAt
				}
			}
		}
		r, err = NewRollout(id.New(id.Rollout), req, ready, rs.Clock.Now())
		if err != nil {
			return err
		}
		// Another replica's clock may be ahead of this one's.
		if readyBy.After(r.CreatedAt) {
			r.BaselineReadyBy = readyBy
		}
		return kv.PutJSON(tx, rolloutKey(r.ID), r)
	})
	if err != nil {
		return Rollout{}, err
	}
	rs.track(r)
	rs.Kick(r.ID)
	rs.Log.Info("rollout started", "rollout_id", r.ID, "selector", r.Selector, "target_selector", r.TargetSelector, "batch", r.Batch, "max_unavailable", r.MaxUnavailable)
	return r, nil
}

// Get returns a rollout.
func (rs *Rollouts) Get(ctx context.Context, rolloutID string) (Rollout, error) {
	if err := id.Check(id.Rollout, "rollout_id", rolloutID); err != nil {
		return Rollout{}, fmt.Errorf("%w: %v", tree.ErrInvalidArgument, err)
	}
	var r Rollout
	err := rs.Store.View(ctx, func(tx store.ReadTxn) error { return getRollout(tx, rolloutID, &r) })
	return r, err
}

// List returns every rollout, newest first.
func (rs *Rollouts) List(ctx context.Context) ([]Rollout, error) {
	var out []Rollout
	err := rs.Store.View(ctx, func(tx store.ReadTxn) error {
		out = nil
		return tx.Scan([]byte(prefixRollout), nil, func(_, v []byte) error {
			var r Rollout
			if err := json.Unmarshal(v, &r); err != nil {
				return err
			}
			out = append(out, r)
			return nil
		})
	})
	sort.SliceStable(out, func(i, j int) bool { return out[i].CreatedAt.After(out[j].CreatedAt) })
	return out, err
}

// Decide applies an operator's pause, resume or abort.
func (rs *Rollouts) Decide(ctx context.Context, rolloutID string, d RolloutDecision, reason, by string) (Rollout, error) {
	if err := id.Check(id.Rollout, "rollout_id", rolloutID); err != nil {
		return Rollout{}, fmt.Errorf("%w: %v", tree.ErrInvalidArgument, err)
	}
	var r Rollout
	changed := false
	err := rs.Store.Update(ctx, func(tx store.Txn) error {
		var stored Rollout
		if err := getRollout(tx, rolloutID, &stored); err != nil {
			return err
		}
		var err error
		r, changed, err = DecideRollout(stored, d, reason, by, rs.Clock.Now())
		if err != nil || !changed {
			return err
		}
		return kv.PutJSON(tx, rolloutKey(r.ID), r)
	})
	if err != nil {
		return Rollout{}, err
	}
	if changed {
		rs.Log.Info("rollout decision", "rollout_id", r.ID, "decision", d.String(), "by", by, "state", r.State.String())
		rs.Kick(r.ID)
	}
	return r, nil
}

// Watch sends the rollout now and each time it changes, until it is
// finished or ctx ends.
func (rs *Rollouts) Watch(ctx context.Context, rolloutID string, send func(Rollout) error) error {
	if err := id.Check(id.Rollout, "rollout_id", rolloutID); err != nil {
		return fmt.Errorf("%w: %v", tree.ErrInvalidArgument, err)
	}
	key := string(rolloutKey(rolloutID))
	w, err := rs.Store.Watch(ctx, []byte(key))
	if err != nil {
		return err
	}
	r, err := rs.Get(ctx, rolloutID)
	if err != nil {
		return err
	}
	if err := send(r); err != nil || r.Finished() {
		return err
	}
	for batch := range w.Events() {
		for _, ev := range batch {
			if ev.Type != store.EventPut || string(ev.Key) != key {
				continue
			}
			var next Rollout
			if err := json.Unmarshal(ev.Value, &next); err != nil {
				return err
			}
			if err := send(next); err != nil {
				return err
			}
			if next.Finished() {
				return nil
			}
		}
	}
	if err := w.Err(); err != nil && ctx.Err() == nil {
		return err
	}
	return ctx.Err()
}

func getRollout(tx store.ReadTxn, rolloutID string, r *Rollout) error {
	err := kv.GetJSON(tx, rolloutKey(rolloutID), r)
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("%w: rollout_id %s", ErrRolloutNotFound, rolloutID)
	}
	return err
}

func (rs *Rollouts) track(r Rollout) {
	rs.activeMu.Lock()
	defer rs.activeMu.Unlock()
	if rs.active == nil {
		rs.active, rs.batches = map[string]selectors{}, map[string]string{}
	}
	for term, rid := range rs.batches {
		if rid == r.ID {
			delete(rs.batches, term)
		}
	}
	if r.Finished() {
		delete(rs.active, r.ID)
		if len(rs.active) == 0 {
			rs.seen = nil
		}
		return
	}
	from, _ := tree.ParseSelector(r.Selector)
	to, _ := tree.ParseSelector(r.TargetSelector)
	rs.active[r.ID] = selectors{from, to}
	for _, b := range r.Batches {
		if !b.finished() {
			rs.batches[b.TerminationID] = r.ID
		}
	}
}

// Run is the level-triggered reconciler (internal/reconcile): it resumes
// every unfinished rollout from stored state and re-runs one whenever the
// rollout, a termination, or a node its selectors match changes, and at
// its batch deadlines. It runs until ctx ends; a watch that falls behind
// costs a rescan.
func (rs *Rollouts) Run(ctx context.Context) error { return rs.loop().Run(ctx) }

// unfinished lists the unfinished rollouts, and remembers their selectors
// for kickFor.
func (rs *Rollouts) unfinished(ctx context.Context) ([]string, error) {
	all, err := rs.List(ctx)
	if err != nil {
		return nil, err
	}
	// Every unfinished rollout is reconciled after the scan: what was
	// seen of the nodes before it is read again from their next writes.
	rs.activeMu.Lock()
	rs.seen = nil
	rs.activeMu.Unlock()
	var ids []string
	for _, r := range all {
		rs.track(r)
		if !r.Finished() {
			ids = append(ids, r.ID)
		}
	}
	return ids, nil
}

// kickFor kicks the unfinished rollouts a batch of changes may move: a
// rollout itself, the termination of one of its unfinished batches, or a
// node one of their selectors matches whose state, stop or readiness
// changed (a candidate drained or exiting, a replacement ready or
// stopped; movesRollout). Until the forty-fifth hostile pass any
// termination's write kicked every unfinished rollout, and so did any
// write of a node either selector matched, a heartbeat or the spawn of a
// look-alike that never reported ready: each a reconcile that reads every
// node of the cluster, for as long as a rollout stayed unfinished, at a
// rogue's request in any tree (rogue45e test
// TestRogue45EAnotherTreesStopsAndLookAlikesDoNotMakeARolloutReadTheCluster).
func (rs *Rollouts) kickFor(batch []store.Event, kickKey func(string)) {
	kick := map[string]bool{}
	for _, ev := range batch {
		if !strings.HasPrefix(string(ev.Key), prefixRollout) || ev.Type != store.EventPut {
			continue
		}
		var r Rollout
		if json.Unmarshal(ev.Value, &r) == nil {
			rs.track(r)
			kick[r.ID] = !r.Finished()
		}
	}
	rs.activeMu.Lock()
	for _, ev := range batch {
		key := string(ev.Key)
		switch {
		case strings.HasPrefix(key, supervisor.TerminationPrefix):
			if rid, ok := rs.batches[strings.TrimPrefix(key, supervisor.TerminationPrefix)]; ok {
				kick[rid] = true
			}
		case strings.HasPrefix(key, tree.NodePrefix) && ev.Type == store.EventPut && len(rs.active) > 0:
			// Without an active rollout there is nobody to kick: marking
			// or recording a large subtree puts every node, and decoding
			// each was a tenth of a termination's CPU.
			n := &tree.Node{}
			if tree.UnmarshalNode(ev.Value, n) != nil {
				continue
			}
			rs.nodeChanged(n, kick)
		}
	}
	rs.activeMu.Unlock()
	for rid, on := range kick {
		if on {
			kickKey(rid)
		}
	}
}

// nodeChanged adds to kick the unfinished rollouts a write of n may move,
// and remembers what it read of n (rs.activeMu held).
func (rs *Rollouts) nodeChanged(n *tree.Node, kick map[string]bool) {
	matched := false
	for _, sel := range rs.active {
		matched = matched || tree.MatchLabels(n.Labels, sel.from) || tree.MatchLabels(n.Labels, sel.to)
	}
	if !matched {
		return
	}
	facts := factsOf(n)
	if was, ok := rs.seen[n.NodeID]; ok && was == facts {
		return
	}
	if rs.seen == nil {
		rs.seen = map[string]nodeFacts{}
	}
	rs.seen[n.NodeID] = facts
	for rid, sel := range rs.active {
		if movesRollout(n, sel) {
			kick[rid] = true
		}
	}
}

// Reconcile moves one rollout as far as it can go now and returns when to
// look again (zero: when something changes). Every step re-reads stored
// state and persists before the next.
func (rs *Rollouts) Reconcile(ctx context.Context, rolloutID string) (time.Time, error) {
	for range 32 {
		r, err := rs.Get(ctx, rolloutID)
		if err != nil {
			return time.Time{}, err
		}
		// The clock is read before the facts are: a deadline is judged at
		// a reading no later than what was observed. Read after, a pass
		// whose observation missed a replacement's readiness, committed
		// just before the clock passed the batch's deadline, paused the
		// rollout for want of a replacement that was ready by then
		// (TestRogue39MBaselineAgentsStoppedByTheirParentDoNotStallTheRollout,
		// 1 in ~80 runs under load).
		now := rs.Clock.Now()
		facts, targets, err := rs.observe(ctx, r)
		if err != nil {
			return time.Time{}, err
		}
		step := NextRollout(r, facts, now)
		var out RolloutOutcome
		switch step.Action {
		case ActRolloutNone:
			rs.track(r)
			return time.Time{}, nil
		case ActRolloutWait:
			// A wait for replacements with no batch running is noted (its
			// start bounds it: Rollout.WaitingSince), and cleared when it
			// ends.
			if facts.Remaining != r.Remaining || facts.ReadyTarget != r.ReadyTarget || step.Waiting == r.WaitingSince.IsZero() {
				if err := rs.save(ctx, r, step, out, facts, now); err != nil {
					return time.Time{}, err
				}
			}
			return step.Wake, nil
		case ActRolloutStartBatch:
			if rs.Fault != nil {
				rs.Fault("before-start-batch")
			}
			err = rs.startBatch(ctx, r, step, facts, now)
		case ActRolloutHandOver:
			// A pass that failed part way (a lease moved since it was
			// listed, the lease module unavailable) has reassigned the
			// leases before it: they are counted now, or no later pass
			// would — they are no longer the members' — and a job's
			// coordinator moving the last of a drained agent's jobs
			// mid-pass had the batch say none was handed over.
			out, err = rs.handOver(ctx, r, step, targets)
			if err == nil || out.HandedOver > 0 {
				err = errors.Join(err, rs.save(ctx, r, step, out, facts, now))
			}
		case ActRolloutRelease:
			if err = rs.release(ctx, r); err == nil {
				err = rs.save(ctx, r, step, out, facts, now)
			}
		default:
			err = rs.save(ctx, r, step, out, facts, now)
		}
		if err != nil {
			return time.Time{}, err
		}
		switch step.Action {
		case ActRolloutPause:
			rs.Log.Warn("rollout paused", "rollout_id", r.ID, "reason", step.Reason)
		case ActRolloutComplete:
			rs.Log.Info("rollout completed", "rollout_id", r.ID, "agents", r.Drained(), "batches", len(r.Batches))
		case ActRolloutCompleteBatch:
			rs.Log.Info("rollout batch done", "rollout_id", r.ID, "batch", step.Batch)
		}
	}
	return rs.Clock.Now(), nil // more to do: come back at once
}

// save applies step to the stored rollout if it is unchanged since r was
// read (its UpdatedAt and batch count); otherwise the next pass re-reads.
func (rs *Rollouts) save(ctx context.Context, r Rollout, step RolloutStep, out RolloutOutcome, f RolloutFacts, now time.Time) error {
	return rs.Store.Update(ctx, func(tx store.Txn) error {
		var stored Rollout
		if err := getRollout(tx, r.ID, &stored); err != nil {
			return err
		}
		// A hand-over's outcome is leases already reassigned: it is
		// counted even when the rollout changed meanwhile (a pause or a
		// resume), or the count would miss them.
		if !sameVersion(stored, r) && step.Action != ActRolloutHandOver {
			return nil
		}
		next, err := AdvanceRollout(stored, step, out, f, now)
		if err != nil {
			return err
		}
		if step.Action == ActRolloutWait {
			next.UpdatedAt = now
		}
		return kv.PutJSON(tx, rolloutKey(r.ID), next)
	})
}

func sameVersion(a, b Rollout) bool {
	return a.UpdatedAt.Equal(b.UpdatedAt) && len(a.Batches) == len(b.Batches) && a.State == b.State &&
		a.Remaining == b.Remaining && a.ReadyTarget == b.ReadyTarget
}

// startBatch writes the batch and its termination in one transaction, so a
// crash leaves either both or neither: one termination, one record, per
// batch. Agents that another termination than an agent's took over
// meanwhile, or that were terminated, are left out; an agent that claimed
// its exit meanwhile is not (stillCandidate).
func (rs *Rollouts) startBatch(ctx context.Context, r Rollout, step RolloutStep, f RolloutFacts, now time.Time) error {
	var term supervisor.Termination
	err := rs.Store.Update(ctx, func(tx store.Txn) error {
		term = supervisor.Termination{}
		var stored Rollout
		if err := getRollout(tx, r.ID, &stored); err != nil {
			return err
		}
		if !sameVersion(stored, r) {
			return nil
		}
		var nodes, exited []string
		for _, nid := range step.Nodes {
			n, err := tree.GetNodeIn(tx, nid)
			if errors.Is(err, tree.ErrNodeNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			ok, err := stillCandidate(tx, n)
			if err != nil {
				return err
			}
			if !ok {
				continue
			}
			nodes = append(nodes, nid)
			if n.State == tree.NodeStateExited {
				exited = append(exited, nid)
			}
		}
		if len(nodes) == 0 {
			return nil
		}
		step.Nodes = nodes
		reason := fmt.Sprintf("rollout %s batch %d: replace %s with %s", r.ID, step.Batch, r.Selector, r.TargetSelector)
		if r.Description != "" {
			reason += ": " + r.Description
		}
		var err error
		term, err = rs.Supervisor.TerminateIn(tx, supervisor.TerminateRequest{
			Roots: nodes, Mode: supervisor.ModeDrain, DrainWindow: orDefault(r.DrainWindow, supervisor.DefaultDrainWindow),
			CancelAckTimeout: supervisor.DefaultCancelAckTimeout, ConfirmTimeout: orDefault(r.ConfirmTimeout, supervisor.DefaultConfirmTimeout),
			Reason: kv.ClipUTF8(reason, 1024), RequestedBy: r.RequestedBy, RolloutID: r.ID, LeaseHandover: true,
		})
		if err != nil {
			return err
		}
		next, err := AdvanceRollout(stored, step, RolloutOutcome{TerminationID: term.ID, Exited: exited}, f, now)
		if err != nil {
			return err
		}
		return kv.PutJSON(tx, rolloutKey(r.ID), next)
	})
	if err == nil && term.ID != "" {
		rs.Supervisor.KickRequested(term)
		rs.Log.Info("rollout batch started", "rollout_id", r.ID, "batch", step.Batch, "termination_id", term.ID, "agents", len(term.RootIDs()))
	}
	return err
}

func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// handOver reassigns every open lease held by the batch's members to the
// ready replacements, round robin, each with generation + 1 and within the
// bound per holder (a replacement without room is skipped; a lease none
// has room for waits: BatchFacts.FullLeases). The old
// generation is fenced off from that moment: its late renewals and
// progress are recorded by the lease module as stale.
func (rs *Rollouts) handOver(ctx context.Context, r Rollout, step RolloutStep, targets []replacement) (RolloutOutcome, error) {
	var out RolloutOutcome
	if rs.Handover == nil {
		return out, nil
	}
	b := r.Batches[step.Batch]
	term, err := rs.Supervisor.Get(ctx, b.TerminationID)
	if err != nil {
		return out, err
	}
	members, err := rs.Supervisor.Members(ctx, term)
	if err != nil {
		return out, err
	}
	open, stuck, err := rs.Handover.Open(ctx, members)
	if err != nil {
		return out, fmt.Errorf("list leases: %w", err)
	}
	for _, l := range stuck {
		out.NotHandedOver = append(out.NotHandedOver, l.JobID+": "+l.Why)
	}
	ancestors, err := rs.ancestorsOf(ctx, open)
	if err != nil {
		return out, err
	}
	may := takers(targets, open, ancestors, nil)
	// Each reassignment is written down (its job, the generation it is
	// taken from, the lease id chosen for the next) before it is made,
	// and this pass's count is saved after it: one the process died in
	// between (a kill -9 mid-pass) is counted by the next pass from its
	// lease — until the forty-third hostile pass it was in no pass's
	// count, its job no longer the drained agent's.
	pending := make(map[string]supervisor.PendingHandover, len(open))
	var list []supervisor.PendingHandover
	for _, l := range open {
		if len(may[l.Holder]) > 0 {
			p := supervisor.PendingHandover{JobID: l.JobID, Generation: l.Generation, LeaseID: id.New(id.Lease)}
			pending[l.JobID] = p
			list = append(list, p)
		}
	}
	if err := rs.settleReassigning(ctx, r, b, list); err != nil {
		return out, err
	}
	offset := r.LeasesHandedOver()
	gone := map[string]bool{} // replacements found no longer standing this pass
	reason := fmt.Sprintf("rollout %s batch %d: %s replaced by %s", r.ID, b.Index, r.Selector, r.TargetSelector)
	for i, l := range open {
		may := may[l.Holder]
		if len(may) == 0 {
			// Left open (WaitingLeases): a replacement spawned by an
			// ancestor of the holder or by an operator, or in a tree an
			// operator registered, may still become ready; the batch waits
			// for it and pauses at its deadline.
			continue
		}
		if rs.Fault != nil {
			rs.Fault("before-reassign")
		}
		// The replacements were observed ready before the pass; one may
		// have claimed its exit, or a stop may have reached it, since: a
		// rogue replacement exiting as the pass runs had every job after
		// that handed to an agent that will never take it, and counted as
		// handed over. Each is checked again before it is given a job;
		// one that no longer stands is given none this pass (the lease
		// waits for one that does).
		var to string
		var gen uint64
		for {
			if to, err = rs.standingTaker(ctx, may, offset+i, gone); err != nil || to == "" {
				break
			}
			gen, err = rs.Handover.Reassign(ctx, l, to, pending[l.JobID].LeaseID, reason)
			if !errors.Is(err, supervisor.ErrHandoverFull) {
				break
			}
			// Full: it is handed nothing more this pass; the lease goes
			// to another that may take it, or waits (FullLeases).
			gone[to] = true
		}
		if errors.Is(err, supervisor.ErrHandoverFull) {
			err = nil
		}
		if err != nil && to == "" {
			return out, err
		}
		if to == "" {
			continue
		}
		switch {
		case errors.Is(err, supervisor.ErrHandoverRefused):
			out.NotHandedOver = append(out.NotHandedOver, l.JobID+": "+err.Error())
		case err != nil:
			// The lease moved meanwhile (or the module is unavailable): the
			// next pass sees it as it is now, and counts this
			// reassignment if the module made it after all.
			out.Reassigning = []supervisor.PendingHandover{pending[l.JobID]}
			return out, fmt.Errorf("reassign job %s: %w", l.JobID, err)
		default:
			out.HandedOver++
			rs.Log.Info("lease handed over", "rollout_id", r.ID, "job_id", l.JobID, "from", l.Holder, "to", to, "generation", gen)
		}
	}
	return out, nil
}

// settleReassigning counts, from their leases, the reassignments an
// earlier pass of batch b wrote down and did not count (it was cut short
// between making them and saving its count), and writes down next, the
// reassignments this pass is about to make, in one transaction.
func (rs *Rollouts) settleReassigning(ctx context.Context, r Rollout, b RolloutBatch, next []supervisor.PendingHandover) error {
	earlier := r.reassigning(b.Index)
	if len(earlier) == 0 && len(next) == 0 {
		return nil
	}
	made := 0
	for _, p := range earlier {
		ok, err := rs.Handover.Reassigned(ctx, p)
		if err != nil {
			return fmt.Errorf("read reassignment of job %s: %w", p.JobID, err)
		}
		if ok {
			made++
			rs.Log.Info("lease handed over before the pass was cut short", "rollout_id", r.ID, "job_id", p.JobID, "generation", p.Generation+1)
		}
	}
	return rs.Store.Update(ctx, func(tx store.Txn) error {
		var stored Rollout
		if err := getRollout(tx, r.ID, &stored); err != nil {
			return err
		}
		if b.Index >= len(stored.Batches) || !slices.Equal(stored.reassigning(b.Index), earlier) {
			return fmt.Errorf("rollout %s batch %d: its handover changed meanwhile", r.ID, b.Index)
		}
		stored.Batches[b.Index].LeasesHandedOver += made
		stored.setReassigning(b.Index, next)
		return kv.PutJSON(tx, rolloutKey(r.ID), stored)
	})
}

// standingTaker returns the first of may, in turn from start, that still
// stands as a replacement — running, ready, and under no stop — read now,
// after the observation that chose may; "" when none does. Those found no
// longer standing are added to gone and not read again in the pass.
func (rs *Rollouts) standingTaker(ctx context.Context, may []string, start int, gone map[string]bool) (string, error) {
	for k := range may {
		to := may[(start+k)%len(may)]
		if gone[to] {
			continue
		}
		stands := false
		err := rs.Store.View(ctx, func(tx store.ReadTxn) error {
			n, err := tree.GetNodeIn(tx, to)
			if errors.Is(err, tree.ErrNodeNotFound) {
				stands = false
				return nil
			}
			if err != nil {
				return err
			}
			if !isReady(n) {
				stands = false
				return nil
			}
			cover, err := tree.CoveringStopIn(tx, n)
			stands = cover == nil
			return err
		})
		if err != nil {
			return "", err
		}
		if stands {
			return to, nil
		}
		gone[to] = true
		rs.Log.Warn("rollout replacement no longer stands; it is handed no job", "node_id", to)
	}
	return "", nil
}

// room is what observe counts of the replacements' room for open leases
// (LeaseHandover.Room), read once per replacement and taken as leases are
// counted against it.
type room struct {
	read func(string) (int, bool)
	left map[string]int // -1: no bound
}

func (rs *Rollouts) roomOf() *room { return &room{read: rs.Handover.Room, left: map[string]int{}} }

// take returns the first of may with room for one more lease, and takes
// that place; "" when none has room.
func (r *room) take(may []string) string {
	for _, to := range may {
		n, ok := r.left[to]
		if !ok {
			n, ok = r.read(to)
			if !ok {
				n = -1
			}
			r.left[to] = n
		}
		switch {
		case n < 0:
			return to
		case n > 0:
			r.left[to] = n - 1
			return to
		}
	}
	return ""
}

// takers lists, for each holder of open, the replacements that may take
// its jobs, in order: judged once per holder (who may take a job depends
// on its holder alone), not per lease — a holder has up to
// MaxOpenPerHolder open leases, and the replacements may include a rogue's
// thousands of look-alikes. steps, when not nil, counts the replacements
// judged.
func takers(targets []replacement, open []supervisor.HandoverLease, ancestors map[string][]string, steps *int) map[string][]string {
	out := map[string][]string{}
	for _, l := range open {
		if _, ok := out[l.Holder]; ok {
			continue
		}
		var may []string
		for _, t := range targets {
			if steps != nil {
				*steps++
			}
			if t.mayTake(ancestors[l.Holder]) {
				may = append(may, t.id)
			}
		}
		out[l.Holder] = may
	}
	return out
}

// ancestorsOf reads the ancestors of each lease holder (none when the
// holder is not a node, or is a root).
func (rs *Rollouts) ancestorsOf(ctx context.Context, open []supervisor.HandoverLease) (map[string][]string, error) {
	ancestors := map[string][]string{}
	err := rs.Store.View(ctx, func(tx store.ReadTxn) error {
		for _, l := range open {
			if _, ok := ancestors[l.Holder]; ok {
				continue
			}
			n, err := tree.GetNodeIn(tx, l.Holder)
			switch {
			case errors.Is(err, tree.ErrNodeNotFound) || errors.Is(err, tree.ErrInvalidArgument):
				ancestors[l.Holder] = nil
			case err != nil:
				return err
			default:
				ancestors[l.Holder] = n.Ancestors
			}
		}
		return nil
	})
	return ancestors, err
}

// release turns every unfinished batch of an aborted rollout into a plain
// termination: a batch still terminating cancels and resolves its leases
// itself (its record says how); a terminated batch's open leases are
// resolved explicitly now. The reassignments a handover pass of the batch
// wrote down and was cut short before counting (settleReassigning) are
// counted from their leases first: until the forty-third hostile pass an
// abort after such a pass released the batch without them, and its count
// missed jobs the rollout had handed over.
func (rs *Rollouts) release(ctx context.Context, r Rollout) error {
	for _, b := range r.Batches {
		if b.finished() {
			continue
		}
		if rs.Handover != nil {
			if err := rs.settleReassigning(ctx, r, b, nil); err != nil {
				return err
			}
		}
		var members []string
		terminated := false
		err := rs.Store.Update(ctx, func(tx store.Txn) error {
			t, m, err := supervisor.EndLeaseHandoverIn(tx, b.TerminationID)
			members, terminated = m, t.Phase == supervisor.PhaseTerminated
			return err
		})
		if err != nil {
			return err
		}
		rs.Supervisor.Kick(b.TerminationID)
		if terminated && rs.Supervisor.Leases != nil {
			if _, _, err := rs.Supervisor.Leases.FinalizeHeldBy(ctx, members, "rollout "+r.ID+" aborted before batch "+fmt.Sprint(b.Index)+" was replaced", supervisor.LeasePage{}); err != nil {
				return fmt.Errorf("finalize leases of batch %d: %w", b.Index, err)
			}
		}
	}
	return nil
}

// replacement is a ready agent matching a rollout's target selector.
type replacement struct {
	id   string
	root string // the root of its tree (itself for a root)
	// parent is the agent that spawned it ("" for a root): its labels
	// are that agent's word, which counts for the agents it is an
	// ancestor of.
	parent string
	depth  int // its ancestors
	// byOperator: an operator spawned it, so its labels are an
	// operator's word (Spawn asks an operator for the role RegisterRoot
	// does), wherever the operator placed it.
	byOperator bool
	// vouched: its tree's root matches the target selector. A root's
	// labels are an operator's word (only operators register roots); a
	// spawned agent's are its parent's, so any agent can label a child to
	// look like a replacement.
	vouched bool
	readyAt time.Time
}

// credited is how many of targets count as replacements of r (the
// rollout's facts' ReadyTarget): every vouched one, and of the others
// those that reported ready after the rollout started, each standing in
// for one agent the rollout drained (drained: each such agent's
// ancestors) that its parent is an ancestor of — or any one, when an
// operator spawned it. A spawned agent's labels
// are its parent's word, and that word counts for the agents its parent
// could itself have stopped and replaced: otherwise a rogue labelling its
// children like replacements, and having them report ready, had the
// rollout count them — for another tree's agents, or for its siblings in
// its own — take their batches as replaced and drain the rest with
// nothing ready in their place.
//
// The baseline (r.BaselineReady, vouched agents ready when the rollout
// started) is subtracted from the count (Rollout.Replacements): a baseline
// agent that is no longer ready (stopped, exited, under a stop) is counted
// here still, or each one that left swallowed a real replacement and a
// rogue in a vouched tree, stopping the ready agents it had spawned before
// the rollout, kept it from ever seeing a batch replaced. Only as many as
// the vouched agents that reported ready by the rollout's start (or by
// the last baseline agent's report, Rollout.BaselineReadyBy, when another
// replica's clock ran ahead) and are still ready fall short of the
// baseline are added: every baseline agent reported ready by then, so
// this never counts more than the agents that are really new.
func credited(r Rollout, targets []replacement, drained [][]string) int {
	n := 0
	early := 0 // vouched, ready by the rollout's start: baseline agents at most
	by := r.CreatedAt
	if r.BaselineReadyBy.After(by) {
		by = r.BaselineReadyBy
	}
	var late []replacement
	for _, t := range targets {
		switch {
		case t.vouched:
			n++
			if !t.readyAt.After(by) {
				early++
			}
		case t.parent != "" && !t.readyAt.Before(r.CreatedAt):
			late = append(late, t)
		}
	}
	// The agents under each parent are a subtree: two parents' are nested
	// or apart. Matched deepest parent first, a replacement never takes an
	// agent that one under a shallower parent was the only one for; one an
	// operator spawned may stand in for any, so it is matched last.
	reach := func(t replacement) int {
		if t.byOperator {
			return -1
		}
		return t.depth
	}
	slices.SortStableFunc(late, func(a, b replacement) int { return reach(b) - reach(a) })
	return n + max(0, r.BaselineReady-early) + standIns(late, drained, nil)
}

// standIns matches late (in order) to the drained agents (by their
// ancestors), each once, and returns how many it matched. It reads the
// drained agents under each replacement's parent only, through an index
// by ancestor, each at most once per parent: a rogue's thousands of
// children labelled like replacements cost a lookup each, not a look at
// every drained agent. steps, when not nil, counts the index entries
// written and the drained agents looked at.
func standIns(late []replacement, drained [][]string, steps *int) int {
	step := func() {
		if steps != nil {
			*steps++
		}
	}
	under := map[string][]int{} // the drained agents under each ancestor, in order
	for i, ancestors := range drained {
		for _, a := range ancestors {
			step()
			under[a] = append(under[a], i)
		}
	}
	taken := make([]bool, len(drained))
	// next: per parent, the drained agents before it in under[parent]
	// are taken (taken only ever becomes true); nextAny, the same over
	// every drained agent, for the replacements an operator spawned.
	next := map[string]int{}
	nextAny := 0
	n := 0
	for _, t := range late {
		step()
		if t.byOperator {
			for nextAny < len(drained) && taken[nextAny] {
				step()
				nextAny++
			}
			if nextAny < len(drained) {
				taken[nextAny] = true
				n++
			}
			continue
		}
		agents, i := under[t.parent], next[t.parent]
		for i < len(agents) && taken[agents[i]] {
			step()
			i++
		}
		if i < len(agents) {
			taken[agents[i]] = true
			n++
		}
		if len(agents) > 0 {
			next[t.parent] = i
		}
	}
	return n
}

// mayTake reports whether a job held by an agent whose ancestors are
// holderAncestors may be handed to rep: a replacement spawned by an
// ancestor of the holder (who could have stopped the holder and
// reassigned the job itself), one an operator spawned, or in a tree an
// operator registered as a replacement. Any other agent labelled like a replacement — in another
// tree, or a sibling's child in the holder's own — is a stranger to the
// job: it would gain the job's authority (and its parent the job's
// coordination) by choosing its child's labels.
func (rep replacement) mayTake(holderAncestors []string) bool {
	return rep.vouched || rep.byOperator || (rep.parent != "" && slices.Contains(holderAncestors, rep.parent))
}

// observe reads the rollout's facts from the tree, the terminations and
// the lease module; targets are the ready replacements in id order.
func (rs *Rollouts) observe(ctx context.Context, r Rollout) (RolloutFacts, []replacement, error) {
	f := RolloutFacts{Batches: map[int]BatchFacts{}}
	if r.Finished() {
		return f, nil, nil
	}
	if rs.Fault != nil {
		rs.Fault("observe")
	}
	from, err := tree.ParseSelector(r.Selector)
	if err != nil {
		return f, nil, err
	}
	to, err := tree.ParseSelector(r.TargetSelector)
	if err != nil {
		return f, nil, err
	}
	inBatch := map[string]bool{}
	batched := map[string]bool{} // every batch's nodes needing a replacement, finished or not
	for _, b := range r.Batches {
		for _, n := range b.NodeIDs {
			batched[n] = !slices.Contains(b.Exited, n)
			if !b.finished() {
				inBatch[n] = true
			}
		}
	}
	var drained [][]string // the ancestors of each agent drained that needs a replacement

	var targets []replacement
	members := map[int][]string{}
	err = rs.Store.View(ctx, func(tx store.ReadTxn) error {
		targets = nil
		var candidates []*tree.Node
		set := map[string]bool{}
		vouched := map[string]bool{}              // roots matching the target selector
		old := map[string]bool{}                  // nodes matching the selector, in any state
		var under [][]string                      // targets' ancestors
		var shields []*tree.Node                  // exited, or stopped by another termination: taken over?
		stopping := map[string]tree.LineageStop{} // nodes stopping, stopped, or with a stop requested
		drained = drained[:0]
		err := scanNodes(tx, func(n *tree.Node) {
			if stopsBelow(n) {
				stopping[n.NodeID] = tree.LineageStop{NodeID: n.NodeID, State: n.State, TerminationID: n.TerminationID}
			}
			if len(n.Ancestors) == 0 && tree.MatchLabels(n.Labels, to) {
				vouched[n.NodeID] = true
			}
			if batched[n.NodeID] {
				drained = append(drained, n.Ancestors)
			}
			if tree.MatchLabels(n.Labels, from) && !tree.MatchLabels(n.Labels, to) {
				old[n.NodeID] = true
			}
			if n.State != tree.NodeStateRunning {
				if n.State != tree.NodeStateTerminated && !inBatch[n.NodeID] &&
					tree.MatchLabels(n.Labels, from) && !tree.MatchLabels(n.Labels, to) {
					shields = append(shields, n)
				}
				return
			}
			if tree.MatchLabels(n.Labels, to) {
				if isReady(n) {
					targets = append(targets, replacement{id: n.NodeID, root: tree.Root(n), parent: n.ParentNodeID, depth: len(n.Ancestors),
						byOperator: n.ParentNodeID != "" && strings.HasPrefix(n.CreatedBy, capability.OperatorPrefix), readyAt: n.ReadyAt})
					under = append(under, n.Ancestors)
				}
				return
			}
			if tree.MatchLabels(n.Labels, from) && !inBatch[n.NodeID] {
				candidates = append(candidates, n)
				set[n.NodeID] = true
			}
		})
		if err != nil {
			return err
		}
		if err := stopRequests(tx, stopping); err != nil {
			return err
		}
		for _, n := range shields {
			ok, err := stillCandidate(tx, n)
			if err != nil {
				return err
			}
			if ok {
				candidates = append(candidates, n)
				set[n.NodeID] = true
			}
		}
		slices.SortFunc(candidates, func(a, b *tree.Node) int { return strings.Compare(a.NodeID, b.NodeID) })
		// A replacement under an agent the rollout drains (or drained)
		// goes with that agent's subtree: it replaces nothing. Outside a
		// tree an operator vouched for, it is not one at all — otherwise a
		// rogue waiting for its batch labelled a child like a replacement
		// and had it count for the agent drained before it in its tree.
		kept := targets[:0]
		for i, t := range targets {
			// Nor is a running agent a stop covers before its mark reaches
			// it (an ancestor stopping, or a stop requested on it or
			// above): the workload of a termination, whose jobs the mark
			// will cancel, stands in for no one.
			if coveredByStop(t.id, under[i], stopping) {
				continue
			}
			t.vouched = vouched[t.root]
			if !t.vouched && slices.ContainsFunc(under[i], func(a string) bool { return old[a] }) {
				continue
			}
			kept = append(kept, t)
		}
		targets = kept
		// A candidate under another candidate goes with its ancestor's
		// subtree; count and drain only the topmost.
		f.Candidates = f.Candidates[:0]
		for _, n := range candidates {
			covered := false
			for _, a := range n.Ancestors {
				covered = covered || set[a]
			}
			if !covered {
				f.Candidates = append(f.Candidates, n.NodeID)
			}
		}
		f.Remaining = len(f.Candidates)
		if len(f.Candidates) > r.Batch {
			f.Candidates = f.Candidates[:r.Batch]
		}
		f.ReadyTarget = credited(r, targets, drained)
		for _, b := range r.Batches {
			if b.finished() {
				continue
			}
			t, err := supervisor.GetTerminationIn(tx, b.TerminationID)
			if err != nil {
				return err
			}
			bf := BatchFacts{Marked: t.Phase != supervisor.PhaseRequested, Terminated: t.Phase == supervisor.PhaseTerminated, RecordID: t.RecordID}
			if members[b.Index], err = supervisor.MembersIn(tx, t); err != nil {
				return err
			}
			f.Batches[b.Index] = bf
		}
		return nil
	})
	if err != nil {
		return f, nil, err
	}
	// Open leases matter once a batch is replaced (they have somewhere to
	// go); they are read outside the store snapshot, from the lease module.
	if rs.Handover != nil {
		for _, b := range r.Batches {
			bf, ok := f.Batches[b.Index]
			if !ok || b.ReplacedAt.IsZero() || !bf.Marked {
				continue
			}
			open, stuck, err := rs.Handover.Open(ctx, members[b.Index])
			if err != nil {
				return f, nil, fmt.Errorf("list leases: %w", err)
			}
			ancestors, err := rs.ancestorsOf(ctx, open)
			if err != nil {
				return f, nil, err
			}
			may := takers(targets, open, ancestors, nil)
			room := rs.roomOf()
			for _, l := range open {
				switch {
				case len(may[l.Holder]) == 0:
					bf.WaitingLeases++
				case room.take(may[l.Holder]) == "":
					bf.FullLeases++
				default:
					bf.OpenLeases++
				}
			}
			for _, l := range stuck {
				if l.Conflict {
					bf.ConflictedLeases++
				}
			}
			f.Batches[b.Index] = bf
		}
	}
	return f, targets, nil
}

// stillCandidate reports whether a node that matches a rollout's selector
// is one its batch drains: a running node; one whose exit was claimed (or
// confirmed) outside any termination — an exit is a word, not a stop:
// nothing the node holds is revoked, no call of it cancelled, no record
// written until a termination covers it, so a rogue claiming its exit just
// before its batch would otherwise keep all of it and stay out of every
// record of the rollout; and one an agent's termination is stopping
// (agentShielded).
func stillCandidate(tx store.ReadTxn, n *tree.Node) (bool, error) {
	switch {
	case n.State == tree.NodeStateRunning:
		return true, nil
	case n.State == tree.NodeStateExited && n.TerminationID == "":
		return true, nil
	}
	return agentShielded(tx, n)
}

// agentShielded reports whether n is being stopped by an agent's
// termination, which a rollout's outranks (supervisor.Supersedes), or by
// the agent's own stop proposal, whose windows are the agent's whoever
// approved it (AgentWindows): such a node is still a candidate, and its
// batch takes it over, so that an agent cannot keep a node out of a
// rollout — and its leases from the replacements — by draining it first
// with a window of its choosing.
func agentShielded(tx store.ReadTxn, n *tree.Node) (bool, error) {
	if n.State == tree.NodeStateRunning || n.State == tree.NodeStateTerminated || n.TerminationID == "" {
		return false, nil
	}
	owner, err := supervisor.GetTerminationIn(tx, n.TerminationID)
	if err != nil {
		return false, err
	}
	return (owner.Rank() == supervisor.RankAgent || owner.AgentWindows) && owner.Phase != supervisor.PhaseTerminated, nil
}

// scanNodes calls fn with every node, in id order.
func scanNodes(tx store.ReadTxn, fn func(*tree.Node)) error {
	return tx.Scan([]byte(tree.NodePrefix), nil, func(k, v []byte) error {
		n := &tree.Node{}
		if err := tree.UnmarshalNode(v, n); err != nil {
			return fmt.Errorf("supervisor: decode %s: %w", k, err)
		}
		fn(n)
		return nil
	})
}

// stopsBelow says whether n, stopping, covers its running descendants
// (tree.StopsBelow). A terminated node has none (its mark reached its
// whole subtree): it is left out, so that the map of a store's history of
// terminated agents is not built on every observation.
func stopsBelow(n *tree.Node) bool {
	return n.State != tree.NodeStateTerminated && tree.StopsBelow(n.State, n.TerminationID)
}

// stopRequests adds to stopping the nodes with a stop requested on them
// and not yet marked there (tree.StopRequestsIn).
func stopRequests(tx store.ReadTxn, stopping map[string]tree.LineageStop) error {
	return tree.StopRequestsIn(tx, func(nodeID, terminationID string) {
		s, ok := stopping[nodeID]
		if !ok {
			s = tree.LineageStop{NodeID: nodeID, State: tree.NodeStateRunning}
		}
		s.Requested = terminationID
		stopping[nodeID] = s
	})
}

// coveredByStop says whether a stop covers the running node id with
// ancestors (tree.CoverOf), from stopping: the tree's stopping and stopped
// nodes and its nodes with a stop requested, read with the scan.
func coveredByStop(id string, ancestors []string, stopping map[string]tree.LineageStop) bool {
	if len(stopping) == 0 {
		return false
	}
	lineage := make([]tree.LineageStop, 0, len(ancestors)+1)
	for _, a := range append(ancestors[:len(ancestors):len(ancestors)], id) {
		s, ok := stopping[a]
		if !ok {
			s = tree.LineageStop{NodeID: a, State: tree.NodeStateRunning}
		}
		lineage = append(lineage, s)
	}
	lineage[len(lineage)-1].State = tree.NodeStateRunning
	at, _ := tree.CoverOf(lineage)
	return at >= 0
}

func isReady(n *tree.Node) bool {
	return n.State == tree.NodeStateRunning && !n.ReadyAt.IsZero()
}
