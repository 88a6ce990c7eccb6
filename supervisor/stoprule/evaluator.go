package stoprule

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/tetherhq/tether/internal/reconcile"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/storecodec"
	"github.com/tetherhq/tether/supervisor"
	"github.com/tetherhq/tether/supervisor/tree"
)

// activeRule is a stored rule with its compiled expression.
type activeRule struct {
	rule     *Rule
	compiled *Compiled
}

// nodeInfo is what the evaluator keeps of each running node to find the
// rules in effect at it without reading the store.
type nodeInfo struct {
	ancestors []string
	labels    map[string]string
}

// index is the evaluator's memory, rebuilt from the store each time Run
// starts (after a restart or on gaining the lead).
type index struct {
	byNode    map[string][]*activeRule // attached to the node's subtree
	selectors map[string]*activeRule   // by rule id
	byID      map[string]*activeRule
	nodes     map[string]nodeInfo // running nodes
	children  map[string]map[string]bool
	dirty     *fairQueue      // marked for evaluation, by tree (fair.go)
	retry     map[string]bool // failed evaluations, marked again at the next tick
	timed     int             // rules evaluated every tick (polled)
	// timedAt counts the polled rules attached to each node, timedSel the
	// polled selector rules: a tick walks the subtrees of the first, and
	// every node only for the second (an operator's).
	timedAt  map[string]int
	timedSel int
	// callTimeAt counts the rules on call time attached to each node,
	// callTimeSel the selector rules on it: a tick keeps judging a node
	// with calls open while its lineage has one (inEffectWhere).
	callTimeAt  map[string]int
	callTimeSel int
	// subAt counts the rules reading the subtree's totals attached to each
	// node, subSel the selector rules reading them: a descendant's call
	// marks an ancestor when its lineage has one (markForSubtree).
	subAt  map[string]int
	subSel int
	// open holds the nodes whose last evaluation of a rule on call time
	// found calls open in their subtree: judged again every tick while
	// they are (markTimed), as their calls' time grows with the clock.
	open map[string]bool
	// judgedBelow counts, for each node with one, the running nodes of
	// its subtree (itself included). When it falls to none the rules
	// attached to the node are in effect nowhere ever again (a terminated
	// node spawns no child), and the index lets them go (dropDead).
	judgedBelow map[string]int
	// nodesRev is the latest revision the evaluator has read of the
	// nodes (its scan's, then its nodes' watch's): every node's change
	// committed before it has been read. A rule on a node not judged,
	// stored before it, is on a subtree already wholly terminated
	// (deadOnArrival).
	nodesRev uint64
	// peaks counts the subtree's calls in flight of each node at which a
	// rule reading subtree_calls_in_flight_max was evaluated, from each
	// change of its records (peak.go).
	peaks map[string]*subtreePeak
	// peakAt counts the rules reading subtree_calls_in_flight_max attached
	// to each node, peakSel the selector rules reading it: a node where one
	// is in effect has its count started as soon as the evaluator learns
	// of it (peakStart), not at its first evaluation, which the rogue's
	// own tree's turns make as late as it likes.
	peakAt  map[string]int
	peakSel int
	// peakStart holds the nodes whose count is to start (startPeaks),
	// with the changes of their records taken since the evaluator learnt
	// it (pendingPeak: the count starts at the highest level they
	// reached, not at its snapshot's); peakRisen those whose count rose
	// above the peak the store holds (savePeaks).
	peakStart map[string]*pendingPeak
	peakRisen map[string]bool
	// rulesRev is the latest revision the evaluator has read of the stop
	// rules' records (its scan's, then its rules' watch's): a count to
	// start keeps the changes after it (pendingPeak).
	rulesRev uint64
	// unseen holds, while a rule reading the peak is stored, the changes
	// of the count records of nodes the evaluator does not know, committed
	// after nodesRev: the node's spawn may be still to come on the nodes'
	// watch (two watches, read in either order), and its count starts from
	// them (putNode). Once the nodes are read past a node's first change,
	// its spawn was read, and it is not judged: they go (pruneUnseen).
	unseen map[string]*pendingPeak
	// progressAsked is the highest snapshot revision the evaluator wrote
	// its progress mark for (progressKey): a count whose snapshot is
	// ahead of the watch starts once the watch hands the mark back.
	progressAsked uint64
	// handed is the latest revision the stop rules' watch has handed (not
	// the scan's: the pass's watch began before it, and hands its changes
	// after): a count's snapshot at a later one waits for it (settle).
	handed uint64
	// settleAt is the earliest revision of a count's snapshot read and
	// not yet handed whole by the watch (0: none): the watch's first
	// change past it starts the count before it is taken (settle), so
	// that no change after the snapshot waits among the kept ones.
	settleAt uint64
	// peakSaveWait is set when a write of the peaks failed: the next is
	// tried at the next tick (or as the pass ends), not every round.
	peakSaveWait bool
	// tickVisits counts the nodes the last tick's markTimed looked at.
	tickVisits int
	// subtreeLooks counts what markForSubtree looked at, for tests.
	subtreeLooks int
	// tickLooks counts what the last tick's markTimed looked at to learn
	// which rules are in effect at the nodes it visited, for tests.
	tickLooks int
}

// Run is the level-triggered evaluator. It watches the rules, the
// counters (observed and self-reported) and the tree, and evaluates the
// rules in effect at a node whenever one of them changes; rules that read
// the clock are evaluated again every Tick. It resumes from stored state,
// so a rule that became true while no evaluator ran fires when Run starts.
// It runs until ctx ends (leader-only: one evaluator per cluster).
func (r *Rules) Run(ctx context.Context) error {
	if r.Log == nil {
		r.Log = slog.New(slog.DiscardHandler)
	}
	return reconcile.Passes(ctx, "stop rules", r.Clock, r.Log, r.run)
}

func (r *Rules) run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Watch first, then scan: nothing written between the two is missed.
	rulesW, err := r.Store.Watch(ctx, []byte(prefixAll))
	if err != nil {
		return err
	}
	nodesW, err := r.Store.Watch(ctx, []byte(tree.NodePrefix))
	if err != nil {
		return err
	}
	ix, err := r.load(ctx)
	if err != nil {
		return err
	}
	defer r.endPass(ctx, ix)
	tick := r.Tick
	if tick <= 0 {
		tick = DefaultTick
	}
	// The tick is a timer on the clock, armed again each time it fires:
	// a test moves a manual clock past it instead of poking.
	ticker := r.Clock.NewTimer(tick)
	defer ticker.Stop()
	for {
		// Take what the watches hold, then evaluate a slice of the marked
		// nodes, so that a long backlog never stops the watches from being
		// read (a watcher that falls behind is ended and costs a rescan).
		var err error
		for drained := false; !drained && err == nil; {
			select {
			case batch, ok := <-rulesW.Events():
				err = r.take(ix, rulesW, batch, ok)
			case batch, ok := <-nodesW.Events():
				err = r.take(ix, nodesW, batch, ok)
			default:
				drained = true
			}
		}
		if err != nil {
			return err
		}
		// The counts of the subtrees' calls in flight start before their
		// nodes' evaluations (peakStart), and the peaks that rose are
		// kept in the store.
		r.startPeaks(ctx, ix)
		if !ix.peakSaveWait {
			ix.peakSaveWait = r.savePeaks(ctx, ix) != nil
		}
		if ix.dirty.len() > 0 {
			if err := r.evaluateDirty(ctx, ix, evaluateSlice); err != nil {
				return err
			}
			continue
		}
		if ix.countsToRead() {
			continue
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case batch, ok := <-rulesW.Events():
			err = r.take(ix, rulesW, batch, ok)
		case batch, ok := <-nodesW.Events():
			err = r.take(ix, nodesW, batch, ok)
		case <-ticker.C():
			ticker.Reset(tick)
			ix.peakSaveWait = false
			ix.markTimed()
			for id := range ix.retry {
				ix.markNode(id)
				delete(ix.retry, id)
			}
		}
		if err != nil {
			return err
		}
	}
}

// endPass keeps what the next pass needs of ix when Run's pass ends. A
// pass ended by a watch that fell behind (a rogue flooding the store with
// writes can make it) starts again from a scan: the trees' debts outlive
// it, else each rescan would clear the rogue's and give its tree's
// evaluations the next turns again.
//
// Its counts of the subtrees' calls in flight outlive it too: the next
// scan starts each from its own snapshot at the peak this one reached
// (subtreePeak.carry), and the peaks that rose are written to the store
// (for a next leader), else a rogue that made the watch fall behind after
// its burst had it forgotten.
func (r *Rules) endPass(ctx context.Context, ix *index) {
	r.debts = ix.dirty.debts()
	r.peaks = ix.peaks
	// A count read and waiting for the watch to hand its snapshot goes on
	// from its snapshot, the peak it carried included (its kept changes,
	// handed in part, are not replayed: a record changed in the part not
	// handed would be read at a value it reached only later).
	for id, q := range ix.peakStart {
		if q.snap != nil && r.peaks[id] == nil {
			r.peaks[id] = q.snap
		}
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), peakSaveTimeout)
	defer cancel()
	_ = r.savePeaks(sctx, ix) // logged; the next pass tries again
}

// logger is r.Log, or a logger that discards when none is set (a test
// that drives the evaluator's parts without Run).
func (r *Rules) logger() *slog.Logger {
	if r.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return r.Log
}

// peakSaveTimeout bounds the write of the peaks as a pass ends (the
// leader's context may be done: its lead lost).
const peakSaveTimeout = 5 * time.Second

// peakBatch is how many counts startPeaks reads, or savePeaks writes, in
// one transaction.
const peakBatch = 256

// startPeaks starts the counts of up to peakBatch nodes marked for one
// (peakStart), each from a snapshot of its records, in one transaction
// (readPeaks: one each when that fails); Run's loop goes round again
// while some are still to read, the watches read between two batches. A
// snapshot is read at the store's latest revision, which the watch may
// not have handed yet: such a count starts once the watch has handed
// every change up to it (install), the evaluator's own mark written to be
// sure a change past it comes (askProgress).
func (r *Rules) startPeaks(ctx context.Context, ix *index) {
	var ids []string
	for id, q := range ix.peakStart {
		if _, ok := ix.nodes[id]; !ok || ix.peaks[id] != nil {
			delete(ix.peakStart, id)
			continue
		}
		switch {
		case q.snap != nil:
			if ix.handed >= q.snap.base {
				ix.install(id)
			}
		case len(ids) < peakBatch:
			ids = append(ids, id)
		}
	}
	r.startCounts(ctx, ix, ids)
	r.askProgress(ctx, ix)
}

// startCounts reads the snapshots of ids' counts, marked to start, and
// starts each the watch has caught up with (install).
func (r *Rules) startCounts(ctx context.Context, ix *index, ids []string) {
	if len(ids) == 0 {
		return
	}
	counts := map[string]*subtreePeak{}
	r.readPeaks(func(f func(store.ReadTxn) error) error { return r.Store.View(ctx, f) }, ids, counts)
	for _, id := range ids {
		p, q := counts[id], ix.peakStart[id]
		if p == nil || q == nil {
			delete(ix.peakStart, id)
			continue
		}
		q.snap = p
		if ix.handed >= p.base {
			ix.install(id)
		} else if ix.settleAt == 0 || p.base < ix.settleAt {
			ix.settleAt = p.base
		}
	}
}

// settle starts the counts whose snapshot the watch has handed whole, a
// change of revision rev coming next (the watch hands changes in commit
// order): every change after the snapshot is then taken by the count,
// none kept to be replayed.
func (ix *index) settle(rev uint64) {
	if ix.settleAt == 0 || rev <= ix.settleAt {
		return
	}
	ix.settleAt = 0
	for id, q := range ix.peakStart {
		switch {
		case q.snap == nil:
		case q.snap.base < rev:
			ix.install(id)
		case ix.settleAt == 0 || q.snap.base < ix.settleAt:
			ix.settleAt = q.snap.base
		}
	}
}

// install starts node id's count from its snapshot, the watch having
// handed every change up to it, at the highest level the changes taken
// since it was marked reached (pendingPeak.replay), and marks the node
// when the count is above the peak the store holds (an evaluation while
// the count was still to start read the level and that peak).
func (ix *index) install(id string) {
	q := ix.peakStart[id]
	p := q.snap
	delete(ix.peakStart, id)
	q.snap = nil
	p.replay(q)
	ix.peaks[id] = p
	if p.now() > p.saved {
		ix.peakRisen[id] = true
		ix.markNode(id)
	}
}

// countsToRead reports whether a count marked to start has its snapshot
// still to read (Run's loop goes round for it; one read waits for its
// watch).
func (ix *index) countsToRead() bool {
	for _, q := range ix.peakStart {
		if q.snap == nil {
			return true
		}
	}
	return false
}

// askProgress writes the evaluator's progress mark (progressKey) when a
// count's snapshot is ahead of what the watch has handed and no mark was
// written since that snapshot was read: the watch hands it back, past the
// snapshot, so the count starts even when nothing else is written under
// the stop rules' records. A failed write is tried again at the next
// round of the loop.
func (r *Rules) askProgress(ctx context.Context, ix *index) {
	var need uint64
	for _, q := range ix.peakStart {
		if q.snap != nil && q.snap.base > ix.handed {
			need = max(need, q.snap.base)
		}
	}
	if need <= ix.progressAsked {
		return
	}
	err := r.Store.Update(ctx, func(tx store.Txn) error {
		return tx.Put([]byte(progressKey), binary.AppendUvarint(nil, need))
	})
	if err != nil {
		r.logger().Warn("stop rules: writing the evaluator's progress mark failed; retrying", "error", err)
		return
	}
	ix.progressAsked = need
}

// toStart marks node id's count to start, keeping the changes of its
// records from the revision of the stop rules' records read so far.
func (ix *index) toStart(id string) {
	if ix.peakStart[id] == nil {
		ix.peakStart[id] = &pendingPeak{from: ix.rulesRev}
	}
}

// readPeaks starts a count for each of ids into counts, reading through
// view (a transaction each call): all together, or when that fails one by
// one, so that a record that does not decode keeps no other node's count
// from starting, nor the loop turning or the pass starting. A node whose
// own read fails has no count (it starts at its evaluation, which reports
// the failure and retries as evaluations do).
func (r *Rules) readPeaks(view func(func(store.ReadTxn) error) error, ids []string, counts map[string]*subtreePeak) {
	if view(func(tx store.ReadTxn) error { return readSubtreePeaks(tx, ids, counts) }) == nil {
		return
	}
	for _, id := range ids {
		delete(counts, id)
	}
	for _, id := range ids {
		if err := view(func(tx store.ReadTxn) error { return readSubtreePeaks(tx, []string{id}, counts) }); err != nil {
			delete(counts, id)
			r.logger().Warn("stop rules: reading the subtree's calls in flight failed; its count starts at its evaluation", "node_id", id, "error", err)
		}
	}
}

// readSubtreePeaks starts a count for each of ids from tx into counts
// (their reads fetched together).
func readSubtreePeaks(tx store.ReadTxn, ids []string, counts map[string]*subtreePeak) error {
	keys, prefixes := make([][]byte, 0, 2*len(ids)), make([][]byte, 0, len(ids))
	for _, id := range ids {
		keys = append(keys, obsKey(id), peakKey(id))
		prefixes = append(prefixes, subPrefix(id))
	}
	if err := store.Prefetch(tx, keys, prefixes); err != nil {
		return err
	}
	for _, id := range ids {
		own, err := storedObs(tx, id)
		if err != nil {
			return err
		}
		if counts[id], err = readSubtreePeak(tx, id, own); err != nil {
			return err
		}
	}
	return nil
}

// savePeaks writes to the store the peaks that rose above what it holds
// (peakRisen), a transaction per peakBatch nodes. A failed write leaves
// them for the next try, and says why.
func (r *Rules) savePeaks(ctx context.Context, ix *index) error {
	for len(ix.peakRisen) > 0 {
		batch := map[string]*subtreePeak{}
		for id := range ix.peakRisen {
			if p := ix.peaks[id]; p != nil && p.now() > p.saved {
				batch[id] = p
			} else {
				delete(ix.peakRisen, id)
			}
			if len(batch) == peakBatch {
				break
			}
		}
		if len(batch) == 0 {
			return nil
		}
		if err := r.Store.Update(ctx, func(tx store.Txn) error { return savePeaksIn(tx, batch) }); err != nil {
			r.logger().Warn("stop rules: keeping the subtrees' peaks of calls in flight failed; retrying at the next tick", "error", err)
			return err
		}
		for id, p := range batch {
			p.saved = max(p.saved, p.now())
			delete(ix.peakRisen, id)
		}
	}
	return nil
}

// DefaultTick is how often polled rules are evaluated again: their values
// change continuously, and each tick costs one evaluation per node they
// apply to.
const DefaultTick = 5 * time.Second

// evaluateSlice is how many marked nodes are evaluated between two reads
// of the watches, at most: a slice also ends once its evaluations cost a
// turn (TurnCost, the one that passed it included). A slice of 256 nodes
// whatever they cost let a rogue alone in the ring, its nodes each costing
// a turn and more, have hundreds of turns' work done before the watches
// were read: another tree's node marked meanwhile waited for all of it
// before it was even queued.
const evaluateSlice = 256

// load builds the index from the store: every rule, every running node,
// and every running node marked for evaluation.
func (r *Rules) load(ctx context.Context) (*index, error) {
	ix := &index{byNode: map[string][]*activeRule{}, selectors: map[string]*activeRule{}, byID: map[string]*activeRule{},
		nodes: map[string]nodeInfo{}, children: map[string]map[string]bool{}, dirty: newFairQueue(), retry: map[string]bool{}, open: map[string]bool{},
		judgedBelow: map[string]int{}, peaks: map[string]*subtreePeak{}, timedAt: map[string]int{}, callTimeAt: map[string]int{}, subAt: map[string]int{},
		peakAt: map[string]int{}, peakStart: map[string]*pendingPeak{}, unseen: map[string]*pendingPeak{}, peakRisen: map[string]bool{}}
	var rules []*Rule
	err := r.Store.View(ctx, func(tx store.ReadTxn) error {
		ix.nodesRev = tx.Revision()
		ix.rulesRev = tx.Revision()
		err := tx.Scan([]byte(tree.NodePrefix), nil, func(_, v []byte) error {
			n := &tree.Node{}
			if err := tree.UnmarshalNode(v, n); err != nil {
				return err
			}
			ix.putNode(n)
			return nil
		})
		if err != nil {
			return err
		}
		// The rules that can be in effect at a node judged: the selector
		// rules, and those attached to a node with a judged node below
		// it, found by their index (a key each, no value), and only their
		// records read. A rule attached to a node whose whole subtree has
		// terminated is in effect at no node ever judged again (a
		// terminated node spawns no child): it is neither read, compiled
		// nor held. Each start (a restart, a leader change, a rescan after
		// the watch fell behind, which a rogue flooding the store can
		// force) read and decoded every rule ever stored: a rogue that gave
		// each child it ended its allotment of rules, each with the
		// largest description and labels it may set, had every start read
		// some 128 records of nearly 3 KiB per child it ever had, all held
		// at once, before any rule of any tree was judged (rogue46a test).
		if rules, err = liveRules(tx, ix.judgedBelow); err != nil {
			return err
		}
		// The last pass's counts go on from this snapshot, read in the
		// scan's transaction: a change after the watch began is counted
		// by this pass (a burst the rogue began and ended right after
		// the rescan it forced), not only from each node's first
		// evaluation.
		var ids []string
		for id := range r.peaks {
			if _, ok := ix.nodes[id]; ok {
				ids = append(ids, id)
			}
		}
		counts := map[string]*subtreePeak{}
		for len(ids) > 0 {
			n := min(len(ids), peakBatch)
			r.readPeaks(func(f func(store.ReadTxn) error) error { return f(tx) }, ids[:n], counts)
			ids = ids[n:]
		}
		// Each starts once the pass's watch has handed the changes up to
		// the scan (its watch began before it): those committed between
		// the two are kept and replayed, not dropped as held by the scan
		// (pendingPeak.snap, settle).
		for id, p := range counts {
			p.carry(r.peaks[id])
			ix.peakStart[id] = &pendingPeak{snap: p}
			if ix.settleAt == 0 || p.base < ix.settleAt {
				ix.settleAt = p.base
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	r.peaks = nil
	// Only the rules in effect at a node judged were read (liveRules):
	// else a rogue that gave each child it ended its allotment of rules
	// had every start of the evaluator compile them all before any rule
	// of any tree was judged, and hold them in memory.
	for _, rule := range rules {
		r.putRule(ix, rule)
	}
	for id, n := range ix.nodes {
		ix.dirty.mark(rootOf(id, n.ancestors), id)
	}
	ix.dirty.owe(r.debts)
	return ix, nil
}

func (ix *index) putNode(n *tree.Node) {
	if !judged(n) {
		ix.dropNode(n.NodeID)
		ix.dirty.unmark(rootOf(n.NodeID, n.Ancestors), n.NodeID)
		return
	}
	if _, known := ix.nodes[n.NodeID]; !known {
		defer func() {
			kept := ix.unseen[n.NodeID]
			delete(ix.unseen, n.NodeID)
			if ix.peaks[n.NodeID] == nil && ix.readsPeak(n.NodeID) {
				// A node spawned: its records hold nothing before its
				// spawn, so every change of them since, those taken
				// before the spawn included, makes its count exact.
				if kept == nil {
					kept = &pendingPeak{}
				}
				if ix.peakStart[n.NodeID] == nil {
					ix.peakStart[n.NodeID] = kept
				}
			}
		}()
		ix.judgedBelow[n.NodeID]++
		for i, anc := range n.Ancestors {
			ix.judgedBelow[anc]++
			// The lineage's links too, not only the parent's: an ancestor
			// terminated before its descendants (a termination's chunks)
			// is never put, and a walk of a subtree above it (markSubtree,
			// markTimed) would stop there.
			below := n.NodeID
			if i+1 < len(n.Ancestors) {
				below = n.Ancestors[i+1]
			}
			if ix.children[anc] == nil {
				ix.children[anc] = map[string]bool{}
			}
			ix.children[anc][below] = true
		}
	}
	ix.nodes[n.NodeID] = nodeInfo{ancestors: n.Ancestors, labels: n.Labels}
	ix.dirty.mark(rootOf(n.NodeID, n.Ancestors), n.NodeID)
	if p := n.ParentNodeID; p != "" {
		if ix.children[p] == nil {
			ix.children[p] = map[string]bool{}
		}
		ix.children[p][n.NodeID] = true
	}
}

// dropNode forgets a node no longer judged (terminated, or deleted), and
// the rules of each node of its lineage whose subtree has no running node
// left: they are in effect at no node ever judged again. Else a rogue that
// gave each child it ended its allotment of rules had them all held
// compiled by the evaluator until it restarted.
func (ix *index) dropNode(id string) {
	n, known := ix.nodes[id]
	delete(ix.nodes, id)
	delete(ix.open, id)
	delete(ix.peaks, id)
	delete(ix.peakStart, id)
	delete(ix.peakRisen, id)
	if !known {
		return
	}
	lineage := append(slices.Clone(n.ancestors), id)
	for i := len(lineage) - 1; i >= 0; i-- {
		x := lineage[i]
		if ix.judgedBelow[x]--; ix.judgedBelow[x] > 0 {
			continue
		}
		delete(ix.judgedBelow, x)
		for _, a := range slices.Clone(ix.byNode[x]) {
			ix.removeRule(a.rule.RuleID)
		}
		delete(ix.byNode, x)
		delete(ix.children, x)
		// Its parent's link to it too: a walk of the parent's subtree
		// (markSubtree, markTimed) no longer steps over it.
		if i > 0 {
			if kids := ix.children[lineage[i-1]]; kids != nil {
				delete(kids, x)
			}
		}
	}
}

// judged reports whether rules are evaluated for n: a running node, one a
// termination is stopping — a rule's stop may take it over (an operator's
// rule over an agent's drain), else a rogue parent draining its child
// first would keep every rule from judging it for the window — and one
// whose exit was claimed or confirmed: an exit is a word, not a stop (no
// call of the node is cancelled, nothing it holds revoked, no record
// written until a termination covers it), else a rogue would claim its
// exit to keep its operator's rule from ever stopping it. Only a
// terminated node is past every rule.
func judged(n *tree.Node) bool {
	return n.State != tree.NodeStateTerminated
}

// markSubtree marks the running nodes of root's subtree (a rule attached
// there was added): a walk of the subtree, not of every node, so an agent
// adding rules to itself costs in proportion to its own subtree. For a
// rule reading the subtree's peak of calls in flight (peak), it marks the
// nodes without a count for one too.
func (ix *index) markSubtree(root string, peak bool) {
	stack := []string{root}
	for len(stack) > 0 {
		id := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		ix.markNode(id)
		if _, ok := ix.nodes[id]; ok && peak && ix.peaks[id] == nil {
			ix.toStart(id)
		}
		for c := range ix.children[id] {
			stack = append(stack, c)
		}
	}
}

func (r *Rules) putRule(ix *index, rule *Rule) {
	if _, ok := ix.byID[rule.RuleID]; ok {
		return // rules never change once stored
	}
	c, err := r.compile(rule.Expression)
	if err != nil {
		// Checked when attached; a rule that no longer compiles (an older
		// environment) never fires, and says so.
		r.Log.Warn("stop rule does not compile; it will not fire", "rule_id", rule.RuleID, "error", err)
		return
	}
	a := &activeRule{rule: rule, compiled: c}
	ix.byID[rule.RuleID] = a
	if a.polled() {
		ix.timed++
		if rule.NodeID != "" {
			ix.timedAt[rule.NodeID]++
		} else {
			ix.timedSel++
		}
	}
	if a.compiled.UsesCallTime {
		if rule.NodeID != "" {
			ix.callTimeAt[rule.NodeID]++
		} else {
			ix.callTimeSel++
		}
	}
	if a.compiled.UsesSubtree {
		if rule.NodeID != "" {
			ix.subAt[rule.NodeID]++
		} else {
			ix.subSel++
		}
	}
	peak := a.compiled.UsesSubtreePeak
	if peak {
		if rule.NodeID != "" {
			ix.peakAt[rule.NodeID]++
		} else {
			ix.peakSel++
		}
	}
	if rule.NodeID != "" {
		ix.byNode[rule.NodeID] = append(ix.byNode[rule.NodeID], a)
	} else {
		ix.selectors[rule.RuleID] = a
	}
	if rule.NodeID != "" {
		ix.markSubtree(rule.NodeID, peak)
		return
	}
	for id, n := range ix.nodes {
		if ix.appliesTo(a, id, n) {
			ix.dirty.mark(rootOf(id, n.ancestors), id)
			if peak && ix.peaks[id] == nil {
				ix.toStart(id)
			}
		}
	}
}

// polled: the rule reads what changes without a store write the evaluator
// watches (the clock; the leases and revocations, read at evaluation time),
// so the nodes it applies to are evaluated again every tick.
func (a *activeRule) polled() bool {
	return a.compiled.UsesTime || a.compiled.UsesLeases || a.compiled.UsesRevocations
}

func (ix *index) removeRule(ruleID string) {
	a, ok := ix.byID[ruleID]
	if !ok {
		return
	}
	delete(ix.byID, ruleID)
	delete(ix.selectors, ruleID)
	if a.polled() {
		ix.timed--
		uncount(ix.timedAt, &ix.timedSel, a.rule.NodeID)
	}
	if a.compiled.UsesCallTime {
		uncount(ix.callTimeAt, &ix.callTimeSel, a.rule.NodeID)
	}
	if a.compiled.UsesSubtree {
		uncount(ix.subAt, &ix.subSel, a.rule.NodeID)
	}
	if a.compiled.UsesSubtreePeak {
		uncount(ix.peakAt, &ix.peakSel, a.rule.NodeID)
	}
	if list := ix.byNode[a.rule.NodeID]; len(list) > 0 {
		out := list[:0:0]
		for _, x := range list {
			if x != a {
				out = append(out, x)
			}
		}
		ix.byNode[a.rule.NodeID] = out
	}
}

// uncount takes a removed rule off a count by node (at) or, for a
// selector rule (nodeID ""), off the selector rules' count (sel),
// dropping a node's entry at zero.
func uncount(at map[string]int, sel *int, nodeID string) {
	switch {
	case nodeID == "":
		*sel--
	case at[nodeID] > 1:
		at[nodeID]--
	default:
		delete(at, nodeID)
	}
}

func (ix *index) appliesTo(a *activeRule, id string, n nodeInfo) bool {
	if a.rule.NodeID == "" {
		return ix.selected(a, n)
	}
	if a.rule.NodeID == id {
		return true
	}
	for _, anc := range n.ancestors {
		if anc == a.rule.NodeID {
			return true
		}
	}
	return false
}

// inEffect lists the rules in effect at a node: attached to it or an
// ancestor, or selector rules matching it or an ancestor.
func (ix *index) inEffect(id string, n nodeInfo) []*activeRule {
	out := append([]*activeRule(nil), ix.byNode[id]...)
	for _, anc := range n.ancestors {
		out = append(out, ix.byNode[anc]...)
	}
	for _, a := range ix.selectors {
		if ix.selected(a, n) {
			out = append(out, a)
		}
	}
	return out
}

// selected reports whether selector rule a matches n or one of its
// ancestors (a selector rule is inherited as an attached one is:
// Applies).
func (ix *index) selected(a *activeRule, n nodeInfo) bool {
	if tree.MatchLabels(n.labels, a.rule.Selector) {
		return true
	}
	for _, anc := range n.ancestors {
		if p, ok := ix.nodes[anc]; ok && tree.MatchLabels(p.labels, a.rule.Selector) {
			return true
		}
	}
	return false
}

func (ix *index) markTimed() {
	// The nodes with calls open, for their rules on call time: a node is
	// judged again each tick while its last evaluation found some open,
	// not every node a rule on call time applies to.
	//
	// Whether a rule is in effect at a node is a lookup a level of its
	// lineage (the rules counted by node), not a list of every rule in
	// effect: a rogue that attached its allotment of cheap rules to each
	// node of a chain had each tick list them all for each node below it,
	// uncharged.
	ix.tickLooks = 0
	for id := range ix.open {
		n, ok := ix.nodes[id]
		if !ok || !ix.inEffectWhere(id, n, ix.callTimeAt, ix.callTimeSel, func(a *activeRule) bool { return a.compiled.UsesCallTime }, &ix.tickLooks) {
			delete(ix.open, id)
			continue
		}
		ix.dirty.mark(rootOf(id, n.ancestors), id)
	}
	ix.tickVisits = 0
	if ix.timed == 0 {
		return
	}
	if ix.timedSel == 0 {
		// The polled rules are attached ones: in effect at their nodes'
		// subtrees alone, walked each once. Every running node was looked
		// at, its rules in effect listed, as soon as one such rule was
		// stored anywhere: a rogue's rule on the clock made each tick walk
		// the whole cluster.
		seen := map[string]bool{}
		for root := range ix.timedAt {
			stack := []string{root}
			for len(stack) > 0 {
				id := stack[len(stack)-1]
				stack = stack[:len(stack)-1]
				if seen[id] {
					continue
				}
				seen[id] = true
				ix.tickVisits++
				ix.markNode(id)
				for c := range ix.children[id] {
					stack = append(stack, c)
				}
			}
		}
		return
	}
	for id, n := range ix.nodes {
		ix.tickVisits++
		if ix.inEffectWhere(id, n, ix.timedAt, ix.timedSel, (*activeRule).polled, &ix.tickLooks) {
			ix.dirty.mark(rootOf(id, n.ancestors), id)
		}
	}
}

// inEffectWhere reports whether a rule that is is in effect at node id:
// one attached to it or an ancestor (at counts them by node: a lookup a
// level), or, when sel counts some, a selector rule that is matching it.
// It never lists the rules in effect along the lineage (inEffect): a
// rogue's chain of descendants each given its allotment of rules would
// have each call (markForSubtree) or each tick (markTimed) list them all.
// looks, when not nil, counts what it looked at (for tests).
func (ix *index) inEffectWhere(id string, n nodeInfo, at map[string]int, sel int, is func(*activeRule) bool, looks *int) bool {
	look := func() {
		if looks != nil {
			*looks++
		}
	}
	look()
	if at[id] > 0 {
		return true
	}
	for _, anc := range n.ancestors {
		look()
		if at[anc] > 0 {
			return true
		}
	}
	if sel > 0 {
		for _, a := range ix.selectors {
			look()
			if is(a) && ix.selected(a, n) {
				return true
			}
		}
	}
	return false
}

// take applies a batch from watch w or, when w has ended (ok false),
// returns why.
func (r *Rules) take(ix *index, w store.Watcher, batch []store.Event, ok bool) error {
	if !ok {
		return reconcile.WatchEnded(w)
	}
	r.applyEvents(ix, batch)
	return nil
}

func (r *Rules) applyEvents(ix *index, batch []store.Event) {
	passed := false // the nodes read past a revision more
	defer func() {
		if passed && len(ix.unseen) > 0 {
			ix.pruneUnseen()
		}
	}()
	for _, ev := range batch {
		if !isUnder(ev.Key, tree.NodePrefix) {
			ix.settle(ev.Revision)
			ix.rulesRev = max(ix.rulesRev, ev.Revision)
			ix.handed = max(ix.handed, ev.Revision)
		}
		switch {
		case isUnder(ev.Key, prefixRule):
			if ev.Type == store.EventDelete {
				ix.removeRule(tail(ev.Key, prefixRule))
				continue
			}
			rule := &Rule{}
			if storecodec.Unmarshal(ev.Value, rule) == nil && !ix.deadOnArrival(rule, ev.Revision) {
				r.putRule(ix, rule)
			}
		case isUnder(ev.Key, prefixObs):
			id := tail(ev.Key, prefixObs)
			ix.markNode(id)
			if p := ix.peaks[id]; p != nil {
				p.takeOwn(ev)
				if p.now() > p.saved {
					ix.peakRisen[id] = true
				}
			} else if own, ok := ownOf(ev); ok {
				ix.keepChange(id, ev.Revision, ownRecord, own)
			}
		case isUnder(ev.Key, prefixGrow):
			ix.markNode(keyNode(ev.Key, prefixGrow))
		case isUnder(ev.Key, prefixSub):
			// A descendant's call: its ancestors are judged again only
			// for rules that read the subtree's calls, so an ordinary
			// call costs the evaluator its own node, not its lineage.
			id := keyNode(ev.Key, prefixSub)
			ix.markForSubtree(id)
			shard := tail(ev.Key, prefixSub+id+"/")
			if p := ix.peaks[id]; p != nil {
				p.takeShard(shard, ev)
				if p.now() > p.saved {
					ix.peakRisen[id] = true
				}
			} else if open, ok := openOf(ev); ok {
				ix.keepChange(id, ev.Revision, shard, open)
			}
		case isUnder(ev.Key, prefixSubSelf):
			ix.markForSubtree(keyNode(ev.Key, prefixSubSelf))
		case isUnder(ev.Key, prefixSelf):
			ix.markNode(tail(ev.Key, prefixSelf))
		case isUnder(ev.Key, tree.NodePrefix):
			if ev.Revision > ix.nodesRev {
				ix.nodesRev, passed = ev.Revision, true
			}
			if ev.Type == store.EventDelete {
				ix.dropNode(tail(ev.Key, tree.NodePrefix))
				continue
			}
			n := &tree.Node{}
			if tree.UnmarshalNode(ev.Value, n) == nil {
				ix.putNode(n)
			}
		}
	}
}

// keepChange keeps a change of node id's count records, the node's count
// not started: for a count marked to start (peakStart), or a node not
// known yet whose spawn may be still to come (unseen).
func (ix *index) keepChange(id string, rev uint64, record string, value int64) {
	if q := ix.peakStart[id]; q != nil {
		q.add(rev, record, value)
		return
	}
	if _, known := ix.nodes[id]; known || rev <= ix.nodesRev || (len(ix.peakAt) == 0 && ix.peakSel == 0) {
		return
	}
	q := ix.unseen[id]
	if q == nil {
		q = &pendingPeak{}
		ix.unseen[id] = q
	}
	q.add(rev, record, value)
}

// pruneUnseen lets go the changes of nodes not known whose first change
// the nodes' watch has passed: their spawn (before it) was read, and they
// are not judged.
func (ix *index) pruneUnseen() {
	for id, q := range ix.unseen {
		if q.first <= ix.nodesRev {
			delete(ix.unseen, id)
		}
	}
}

// deadOnArrival reports whether rule, stored at revision rev, is attached
// to a subtree the evaluator has already seen wholly terminated: its node
// has no running node below it and the evaluator has read the nodes past
// rev, so the node's spawn was read (Add stores a rule only on a node not
// terminated) and so was its subtree's end. The rules and the nodes are two
// watches, read in either order: a rule attached just before its node
// ended, read after the end, was held compiled until the evaluator
// restarted (dropNode had let go of the node's rules before it came), and
// a rogue attaching its allotment to each child it ended at once grew the
// leader's memory at will. A rule read before its node's spawn (rev past
// nodesRev) is held: the spawn is still to come, or the end, which lets it
// go. Revisions equal are not decided (held), and cannot be of a rule and
// its subtree's end: Add reads the node, its end writes it, and a backend
// merging commits (etcd) never merges a write with a read of the same key.
func (ix *index) deadOnArrival(rule *Rule, rev uint64) bool {
	return rule.NodeID != "" && ix.judgedBelow[rule.NodeID] == 0 && ix.nodesRev > rev
}

// markForSubtree marks node id when a rule in effect at it reads the
// subtree's totals: one attached to it or an ancestor (a lookup a level),
// or a selector rule matching it. It listed every rule in effect at the
// node, for every ancestor of every call: a rogue whose chain of
// descendants each held its allotment of rules had each call at the
// bottom make the evaluator list thousands, uncharged.
func (ix *index) markForSubtree(id string) {
	n, ok := ix.nodes[id]
	if ok && ix.inEffectWhere(id, n, ix.subAt, ix.subSel, func(a *activeRule) bool { return a.compiled.UsesSubtree }, &ix.subtreeLooks) {
		ix.dirty.mark(rootOf(id, n.ancestors), id)
	}
}

// readsPeak reports whether a rule reading subtree_calls_in_flight_max is
// in effect at node id: one attached to it or an ancestor (a lookup a
// level), or a selector rule matching it.
func (ix *index) readsPeak(id string) bool {
	n, ok := ix.nodes[id]
	return ok && ix.inEffectWhere(id, n, ix.peakAt, ix.peakSel, func(a *activeRule) bool { return a.compiled.UsesSubtreePeak }, nil)
}

func (ix *index) markNode(id string) {
	if n, ok := ix.nodes[id]; ok {
		ix.dirty.mark(rootOf(id, n.ancestors), id)
	}
}

// evaluateDirty evaluates up to limit marked nodes, the trees in turn
// and within a tree the operators' rules first (fair.go), and clears
// their marks.
func (r *Rules) evaluateDirty(ctx context.Context, ix *index, limit int) error {
	return ix.dirty.serveUpTo(limit, TurnCost, func(id string, p phase) (int64, bool, error) {
		n, ok := ix.nodes[id]
		if !ok {
			return 0, true, nil
		}
		operators, agents := splitBySide(ix.inEffect(id, n))
		rules, agentsToo := agents, false
		if p == operatorsPhase {
			if len(operators) == 0 {
				return 0, false, nil // the agents' phase takes the node
			}
			rules = operators
			if worstCost(agents) <= cheapAgentRulesCost {
				rules, agentsToo = append(rules, agents...), true
			}
		}
		if len(rules) == 0 {
			return 0, agentsToo, nil
		}
		peaks := ix.peaks
		if ix.peakStart[id] != nil && ix.peaks[id] == nil {
			// Its count marked to start and not yet (more than a batch
			// marked at once, or its snapshot ahead of the watch): judged
			// on the level and the peak the store holds, no count started
			// from this evaluation's snapshot alone; the count, once
			// started, marks the node again when it is above (install).
			peaks = nil
		}
		cost, open, err := r.evaluateNodeOpen(ctx, id, rules, peaks)
		if p := ix.peaks[id]; p != nil && p.now() > p.saved {
			ix.peakRisen[id] = true
		}
		switch open {
		case openSome:
			ix.open[id] = true
		case openNone:
			delete(ix.open, id)
		}
		if err != nil {
			if ctx.Err() != nil {
				return cost, agentsToo, ctx.Err()
			}
			if errors.Is(err, errFault) {
				return cost, agentsToo, reconcile.Permanent(err) // an injected crash ends Run
			}
			if errors.Is(err, errWaitingForRoom) {
				ix.retry[id] = true
				return cost, agentsToo, nil
			}
			r.Log.Warn("stop rules: evaluation failed; retrying at the next tick", "node_id", id, "error", err)
			ix.retry[id] = true
		}
		return cost, agentsToo, nil
	})
}

// splitBySide separates the operators' rules from the agents'.
func splitBySide(rules []*activeRule) (operators, agents []*activeRule) {
	for _, a := range rules {
		if SetterNode(a.rule) == "" {
			operators = append(operators, a)
		} else {
			agents = append(agents, a)
		}
	}
	return operators, agents
}

// worstCost is what rules may cost together in the worst case.
func worstCost(rules []*activeRule) uint64 {
	var c uint64
	for _, a := range rules {
		c += a.compiled.Cost
	}
	return c
}

var errFault = errors.New("stoprule: injected fault")

// evaluateNode reads one consistent snapshot of the node and evaluates
// every rule in effect that has not fired for it yet. It returns what the
// evaluation cost, to be charged to the node's tree: evaluationBaseCost
// for each read (the node's snapshot, and its leases or revocations when a
// rule reads them, the revocations a read more per grantsPerRead grants
// the node holds) and the CEL cost of each rule evaluated.
func (r *Rules) evaluateNode(ctx context.Context, nodeID string, rules []*activeRule) (int64, error) {
	cost, _, err := r.evaluateNodeOpen(ctx, nodeID, rules, nil)
	return cost, err
}

// openState is what an evaluation learnt of a node's calls open, for
// rules on call time.
type openState int

const (
	openUnknown openState = iota // no rule evaluated reads call time
	openNone                     // none open in its subtree
	openSome                     // some open: judge it again every tick
)

// evaluateNodeOpen is evaluateNode, and says whether the node has calls
// open in its subtree when a rule evaluated reads call time. peaks are the
// evaluator's counts of the subtrees' calls in flight (nil: none, the
// level stands for the peak): a rule reading the peak starts the node's
// from this evaluation's snapshot when it has none.
func (r *Rules) evaluateNodeOpen(ctx context.Context, nodeID string, rules []*activeRule, peaks map[string]*subtreePeak) (int64, openState, error) {
	cost := int64(evaluationBaseCost)
	start := time.Now()
	var node *tree.Node
	var stored *Observations
	var self map[string]float64
	var sums *reportedSums
	fired := map[string]bool{}
	tools, reported, callTime, peaked := false, false, false, false
	for _, a := range rules {
		peaked = peaked || a.compiled.UsesSubtreePeak
		tools = tools || a.compiled.UsesSubtreeTools
		reported = reported || a.compiled.UsesSubtreeReported
		callTime = callTime || a.compiled.UsesCallTime
	}
	decoded, openRead := 0, 0
	err := r.Store.View(ctx, func(tx store.ReadTxn) error {
		var err error
		if node, err = tree.GetNodeIn(tx, nodeID); err != nil {
			return err
		}
		if stored, self, decoded, err = readNodeTools(tx, nodeID, tools); err != nil {
			return err
		}
		if peaked {
			if err := peakFloor(tx, nodeID, stored); err != nil {
				return err
			}
			if peaks != nil && peaks[nodeID] == nil {
				p, err := readSubtreePeak(tx, nodeID, stored)
				if err != nil {
					return err
				}
				peaks[nodeID] = p
			}
		}
		if callTime {
			if openRead, err = readOwnOpenCalls(tx, nodeID, stored); err != nil {
				return err
			}
		}
		if reported {
			var size int
			if sums, size, err = readSubtreeReportedSize(tx, nodeID, self); err != nil {
				return err
			}
			decoded += size
		}
		p := firedPrefix(nodeID)
		return tx.Scan(p, nil, func(k, _ []byte) error {
			fired[tail(k, string(p))] = true
			return nil
		})
	})
	// The subtree's counts by tool and reported counters, by their size: a
	// rogue that fills its ancestors' records with names has each
	// evaluation that reads them charged to its tree as the reads it
	// costs.
	cost += int64(evaluationBaseCost * ((decoded + subtreeToolsBytesPerRead - 1) / subtreeToolsBytesPerRead))
	// The node's own open calls, read for rules on call time: a read more
	// per openCallsPerRead of them (a rogue opening hundreds of calls has
	// each evaluation of its node charged the reads they cost).
	cost += int64(evaluationBaseCost * (openRead / openCallsPerRead))
	if errors.Is(err, tree.ErrNodeNotFound) {
		return cost, openUnknown, nil
	}
	if err != nil || !judged(node) {
		return cost, openUnknown, err
	}
	open := openUnknown
	if callTime {
		// Judged again every tick while calls are open and a rule on call
		// time has not fired (markTimed): their time grows with the clock
		// alone.
		open = openNone
		if stored.open.any() && slices.ContainsFunc(rules, func(a *activeRule) bool { return a.compiled.UsesCallTime && !fired[a.rule.RuleID] }) {
			open = openSome
		}
	}
	leases, revocations := false, false
	for _, a := range rules {
		leases = leases || a.compiled.UsesLeases
		revocations = revocations || a.compiled.UsesRevocations
	}
	for _, read := range []bool{leases, revocations} {
		if read {
			cost += evaluationBaseCost
		}
	}
	observed, grants, err := r.snapshot(ctx, node, stored, leases, revocations)
	// The grants the node holds, read with their chains for a rule on
	// revocations: a read more per grantsPerRead of them (a rogue holding
	// hundreds of grants has each evaluation of its node charged the
	// reads they cost).
	cost += int64(evaluationBaseCost * (grants / grantsPerRead))
	if err != nil {
		return cost, open, err
	}
	if p := peaks[nodeID]; peaked && p != nil {
		observed.SubtreeCallsInFlightMax = max(observed.SubtreeCallsInFlightMax, p.now())
	}
	r.stats.Nodes.Add(1)
	defer func() { r.stats.EvalNanos.Add(int64(time.Since(start))) }()
	waiting := false
	for _, a := range rules {
		if fired[a.rule.RuleID] {
			continue
		}
		r.stats.Evaluations.Add(1)
		res := a.compiled.evaluate(observed, self, sums)
		cost += int64(min(res.Cost, CostBudget))
		if !res.Fired {
			continue
		}
		if err := r.file(ctx, node, a.rule, res); err != nil {
			if errors.Is(err, supervisor.ErrAlreadyStopping) {
				return cost, open, nil // stopped meanwhile: nothing to propose
			}
			if errors.Is(err, supervisor.ErrTreeProposalsFull) {
				// An agent's rule, its tree's proposals at their bound:
				// the others still file; this one when there is room.
				waiting = true
				continue
			}
			return cost, open, err
		}
	}
	if waiting {
		return cost, open, errWaitingForRoom
	}
	return cost, open, nil
}

// errWaitingForRoom: a rule that is true could not file its proposal
// until its tree's pending proposals are decided; the node is evaluated
// again at the next tick, without a warning each time.
var errWaitingForRoom = errors.New("stoprule: waiting for room in the tree's stop proposals")

// file writes the stop proposal of a rule that is true for the node, and
// the rule's fired mark, in one transaction: a rule that fires once files
// exactly one proposal, across crashes and leader changes.
func (r *Rules) file(ctx context.Context, node *tree.Node, rule *Rule, res Result) error {
	if err := r.fault("before-file"); err != nil {
		return err
	}
	firing := &supervisor.StopRuleFiring{
		RuleID: rule.RuleID, Name: rule.Name, Expression: rule.Expression, SetBy: rule.SetBy, Severity: rule.Severity,
		Labels: rule.Labels, RuleNodeID: rule.NodeID, NodeID: node.NodeID, Values: res.Values,
		SelfReported: res.SelfReported(), FiredAt: r.Clock.Now(), Action: rule.Action,
	}
	mode := supervisor.ModeDrain
	if rule.Action == ActionAbort {
		mode = supervisor.ModeAbort
	}
	var term supervisor.Termination
	filed := false
	err := r.Store.Update(ctx, func(tx store.Txn) error {
		term, filed = supervisor.Termination{}, false
		if _, err := tx.Get(firedKey(node.NodeID, rule.RuleID)); err == nil {
			return nil // fired already (another evaluation got there first)
		} else if !errors.Is(err, store.ErrNotFound) {
			return err
		}
		if _, err := tx.Get(ruleKey(rule.RuleID)); err != nil {
			if errors.Is(err, store.ErrNotFound) {
				return nil // removed meanwhile
			}
			return err
		}
		p, t, err := r.Supervisor.FileRuleProposal(tx, node.NodeID, firing, mode, r.Policy)
		if err != nil {
			return err
		}
		term, filed = t, true
		return tx.Put(firedKey(node.NodeID, rule.RuleID), []byte(p.ProposalID))
	})
	if err != nil {
		return err
	}
	if filed {
		r.stats.Fired.Add(1)
		r.Log.Info("stop rule fired; proposal filed", "rule_id", rule.RuleID, "rule", rule.Name, "node_id", node.NodeID, "termination_id", term.ID)
	}
	if term.ID != "" {
		r.Supervisor.KickRequested(term)
	}
	return r.fault("after-file")
}

func (r *Rules) fault(point string) error {
	if r.Fault == nil {
		return nil
	}
	if err := r.Fault(point); err != nil {
		return fmt.Errorf("%w at %s: %w", errFault, point, err)
	}
	return nil
}
