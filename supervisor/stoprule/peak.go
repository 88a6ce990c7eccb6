package stoprule

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/tetherhq/tether/internal/store"
)

// subtreePeak is the evaluator's count of one node's subtree calls in
// flight, kept from each change of the records that hold it (the node's
// own counters, stoprules/obs/<node>, and its shards' totals,
// stoprules/sub/<node>/<shard>), in commit order, for
// subtree_calls_in_flight_max: the level's high-water mark.
//
// An exact peak needs the subtree's level at each call, which no call's
// transaction reads (the sum of up to 256 shard records at every
// ancestor, or a record every call of the subtree writes, the hot key the
// shards avoid), and an evaluation reads the level as it stands: a rogue
// that began a burst of calls across its children and ended them before
// the evaluator read its node was judged below its peak, and could make
// the evaluator late by spending its own tree's turns. The evaluator's
// watch hands it every change of those records, with its value and in
// commit order, so it adds them up as they come.
//
// It starts from a snapshot at revision rev (every record's open calls
// then), and takes the changes committed after it. The changes of one
// revision are taken together (a backend may commit a call's end and
// another's begin as one): the level is a peak candidate only between
// revisions.
//
// It outlives the evaluator's pass and the evaluator (thirty-eighth
// pass): a count starts no lower than the peak the evaluator kept in the
// store (peakKey, written as it rises: a new leader's, a restarted
// evaluator's count goes on from it) nor than the node's own
// calls_in_flight_max (a subtree's level is never below its root's own);
// a pass ended by a watch that fell behind (which a rogue flooding the
// store can cause) hands its counts to the next, whose scan starts each
// again from its own snapshot at the peak the last one reached (carry).
// Else the rogue that made the watch fall behind between its burst and
// the evaluation of its nodes (late as its own tree's turns make it) had
// the burst forgotten, and one right after the rescan not counted at all.
type subtreePeak struct {
	base   uint64            // the snapshot's revision: its changes are held already
	rev    uint64            // the latest revision taken
	own    int64             // the node's own calls in flight
	shards map[string]uint64 // open calls by shard record (key tail), none when 0
	level  int64             // own and the shards' added up
	peak   int64             // the highest level between revisions
	saved  int64             // the peak the store holds (peakKey)
}

// newSubtreePeak starts a count from a snapshot at revision rev: the
// node's own calls in flight and each shard record's open calls then.
func newSubtreePeak(rev uint64, own int64, shards map[string]uint64) *subtreePeak {
	p := &subtreePeak{base: rev, rev: rev, own: own, shards: shards, level: own}
	for _, n := range shards {
		p.level += int64(n)
	}
	p.peak = p.level
	return p
}

// readSubtreePeak starts the count of nodeID's subtree calls in flight
// from tx: own is the node's stored counters, read in tx. It starts at
// the peak the store holds, or the node's own calls_in_flight_max, when
// either is above the level.
func readSubtreePeak(tx store.ReadTxn, nodeID string, own *Observations) (*subtreePeak, error) {
	prefix := subPrefix(nodeID)
	shards := map[string]uint64{}
	err := tx.Scan(prefix, nil, func(k, v []byte) error {
		s, err := decodeSubtotal(v)
		if err != nil {
			return err
		}
		if s.open > 0 {
			shards[string(k[len(prefix):])] = s.open
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	saved, err := readSavedPeak(tx, nodeID)
	if err != nil {
		return nil, err
	}
	p := newSubtreePeak(tx.Revision(), own.CallsInFlight, shards)
	p.peak = max(p.peak, saved, own.CallsInFlightMax)
	p.saved = saved
	return p, nil
}

// carry starts p, a new pass's count of a node, at the peak old (the last
// pass's) reached: what old took of the changes before p's snapshot is
// in that snapshot's level, and its peak is kept.
func (p *subtreePeak) carry(old *subtreePeak) {
	p.peak = max(p.peak, old.now())
	p.saved = max(p.saved, old.saved)
}

// readSavedPeak reads the peak of nodeID's subtree calls in flight the
// evaluator kept in the store: 0 when it kept none.
func readSavedPeak(tx store.ReadTxn, nodeID string) (int64, error) {
	v, err := tx.Get(peakKey(nodeID))
	if errors.Is(err, store.ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	n, k := binary.Uvarint(v)
	if k <= 0 || n > math.MaxInt64 {
		return 0, fmt.Errorf("stoprule: corrupt subtree peak of %s", nodeID)
	}
	return int64(n), nil
}

// peakFloor raises o's subtree_calls_in_flight_max, read as the level, to
// the peak the evaluator kept in the store and to the node's own
// calls_in_flight_max: what TestStopRule, one snapshot on any replica,
// reads of the peak.
func peakFloor(tx store.ReadTxn, nodeID string, o *Observations) error {
	saved, err := readSavedPeak(tx, nodeID)
	if err != nil {
		return err
	}
	o.SubtreeCallsInFlightMax = max(o.SubtreeCallsInFlightMax, saved, o.CallsInFlightMax)
	return nil
}

// savePeaksIn raises the peaks the store holds of the counts' nodes to
// what the counts reached (never lowers one: two leaders for a moment
// both keep the higher).
func savePeaksIn(tx store.Txn, counts map[string]*subtreePeak) error {
	for id, p := range counts {
		saved, err := readSavedPeak(tx, id)
		if err != nil {
			return err
		}
		if now := p.now(); now > saved {
			if err := tx.Put(peakKey(id), binary.AppendUvarint(nil, uint64(now))); err != nil {
				return err
			}
		}
	}
	return nil
}

// step takes a change committed at rev; false when the snapshot the count
// started from holds it already. A change of a later revision than the
// last closes that one: its level is a peak candidate.
func (p *subtreePeak) step(rev uint64) bool {
	if rev <= p.base {
		return false
	}
	if rev > p.rev {
		p.peak = max(p.peak, p.level)
		p.rev = rev
	}
	return true
}

// now is the peak, the current level included (every change the
// evaluator has taken is of a whole revision: a watch hands one
// revision's changes in one batch).
func (p *subtreePeak) now() int64 { return max(p.peak, p.level) }

// takeOwn applies a change of the node's own counters.
func (p *subtreePeak) takeOwn(ev store.Event) {
	if !p.step(ev.Revision) {
		return
	}
	if own, ok := ownOf(ev); ok {
		p.set(ownRecord, own)
	}
}

// ownRecord names the node's own counters among the records a count
// adds up (a shard record's name, the key's tail, is never empty).
const ownRecord = ""

// ownOf reads the node's own calls in flight from a change of its
// counters: false when it does not decode.
func ownOf(ev store.Event) (int64, bool) {
	if ev.Type == store.EventDelete {
		return 0, true
	}
	return callsInFlightOf(ev.Value)
}

// set takes record's new value (ownRecord: the node's own calls in
// flight; else a shard record's open calls).
func (p *subtreePeak) set(record string, v int64) {
	if record == ownRecord {
		p.level += v - p.own
		p.own = v
		return
	}
	p.level += v - int64(p.shards[record])
	if v == 0 {
		delete(p.shards, record)
	} else {
		p.shards[record] = uint64(v)
	}
}

// callsInFlightOf reads calls_in_flight (field 6, a varint) from a
// node's stored counters without decoding the rest (their maps by tool and
// by outcome): every call of a counted node changes them.
func callsInFlightOf(v []byte) (int64, bool) {
	var n int64
	for len(v) > 0 {
		num, typ, k := protowire.ConsumeTag(v)
		if k < 0 {
			return 0, false
		}
		v = v[k:]
		if num == 6 && typ == protowire.VarintType {
			x, k := protowire.ConsumeVarint(v)
			if k < 0 {
				return 0, false
			}
			n, v = int64(x), v[k:]
			continue
		}
		if k = protowire.ConsumeFieldValue(num, typ, v); k < 0 {
			return 0, false
		}
		v = v[k:]
	}
	return n, true
}

// takeShard applies a change of one of the node's shard records.
func (p *subtreePeak) takeShard(shard string, ev store.Event) {
	if !p.step(ev.Revision) {
		return
	}
	if open, ok := openOf(ev); ok {
		p.set(shard, open)
	}
}

// openOf reads a shard record's open calls from a change of it: false
// when it does not decode.
func openOf(ev store.Event) (int64, bool) {
	if ev.Type == store.EventDelete {
		return 0, true
	}
	s, err := decodeSubtotal(ev.Value)
	if err != nil || s.open > math.MaxInt64 {
		return 0, false
	}
	return int64(s.open), true
}

// pendingPeak is a count the evaluator is to start (startPeaks) and has
// not yet: the changes of the node's records its watch handed it since
// from, the revision of the stop rules' watch it had taken when it learnt
// the count was to start (a new leader's scan, a rule read, a node
// spawned). The count starts from a later snapshot, which holds their
// net effect and not the levels between: a rogue that began a burst
// across its children and ended it in that gap (right after a leader
// change, or after its operator attached the rule) was counted from the
// level after it.
type pendingPeak struct {
	from    uint64
	first   uint64 // the revision of the first change kept
	changes []peakChange
	// The changes let go past maxPendingChanges, folded: the highest
	// level between revisions they reached (the records they did not
	// change read as none), each record's last value, and the revision of
	// the last. Else a rogue whose count was still to start churned calls
	// after its burst until the burst's changes were let go.
	floor   int64
	known   map[string]int64
	foldRev uint64
	// snap is the count's snapshot once read, waiting for the watch to
	// hand every change up to its revision (startPeaks): a change
	// committed before it and handed after was dropped as held by it (a
	// burst in that moment was counted from the level after it), and the
	// changes handed before it were replayed over the values the records
	// they did not change reached only later (an honest tree's workers
	// peaking one after another read their sum).
	snap *subtreePeak
}

// peakChange is one change of a record a count adds up: its new value
// (the node's own calls in flight, or a shard record's open calls).
type peakChange struct {
	rev    uint64
	record string
	value  int64
}

// maxPendingChanges bounds the changes a pending count keeps: past it
// the older half is folded (pendingPeak.fold).
const maxPendingChanges = 4096

// add keeps a change committed after from.
func (q *pendingPeak) add(rev uint64, record string, value int64) {
	if rev <= q.from {
		return
	}
	if len(q.changes) >= maxPendingChanges {
		q.fold()
	}
	if q.first == 0 {
		q.first = rev
	}
	q.changes = append(q.changes, peakChange{rev: rev, record: record, value: value})
}

// fold folds the older half of q's changes (to a revision's end, when
// one ends after it) into floor, known and foldRev. A level within a
// revision is no candidate: when the changes folded end within one, the
// level they leave is taken only once a change of a later revision
// follows (replay).
func (q *pendingPeak) fold() {
	cut := len(q.changes) / 2
	for cut < len(q.changes) && q.changes[cut].rev == q.changes[cut-1].rev {
		cut++
	}
	if q.known == nil {
		q.known = map[string]int64{}
	}
	var level int64
	for _, v := range q.known {
		level += v
	}
	rev := q.foldRev
	for _, c := range q.changes[:cut] {
		if c.rev != rev {
			q.floor = max(q.floor, level)
			rev = c.rev
		}
		level += c.value - q.known[c.record]
		q.known[c.record] = c.value
	}
	q.foldRev = rev
	q.changes = append(q.changes[:0], q.changes[cut:]...)
}

// replay raises p, started from a snapshot at p.base, to the highest level
// between revisions that q's changes reached before it, and takes those
// after it as the watch's. A record changed before the snapshot has its
// value before its first change read as none (unknown: the count did not
// hold it), every other its snapshot's value (it did not change): each
// level so computed is at most the true one, so an honest subtree whose
// children peaked one after another reads no more than its peak, and a
// burst begun and ended in the gap is read at its height (the records it
// raised from none, the calls it began).
func (p *subtreePeak) replay(q *pendingPeak) {
	if q == nil || (len(q.changes) == 0 && q.known == nil) {
		return
	}
	changed := map[string]bool{}
	values := map[string]int64{}
	var level int64
	for r, v := range q.known {
		changed[r] = true
		values[r] = v
		level += v
	}
	for _, c := range q.changes {
		if c.rev <= p.base {
			changed[c.record] = true
		}
	}
	if !changed[ownRecord] {
		level += p.own
	}
	for s, n := range p.shards {
		if !changed[s] {
			level += int64(n)
		}
	}
	peak, rev := q.floor, q.foldRev
	for _, c := range q.changes {
		if c.rev > p.base {
			if p.step(c.rev) {
				p.set(c.record, c.value)
			}
			continue
		}
		if c.rev != rev {
			peak = max(peak, level)
			rev = c.rev
		}
		level += c.value - values[c.record]
		values[c.record] = c.value
	}
	p.peak = max(p.peak, peak, level)
}
