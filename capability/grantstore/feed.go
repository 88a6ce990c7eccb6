package grantstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store"
)

// MaxFeedBatch bounds the tombstones of one feed message.
const MaxFeedBatch = 1000

// feed is the revocation feed in memory: the live tombstones in sequence
// order, the head (the last sequence assigned) and the compaction point
// (the highest sequence pruned). It is a projection of the stored feed,
// rebuilt by RunFeed from a scan and kept current by a store watch, so
// that any replica serving WatchRevocations has it.
type feed struct {
	mu  sync.Mutex
	log []capability.Tombstone // ascending Sequence
	// lineages holds each lineage's tombstones apart (ascending Sequence;
	// no entry for "" nor for a lineage without one), so that an agent's
	// feed, which shows only its lineage's, walks only those: an agent
	// opening its feed at 0 (or behind the compaction point) had every
	// tree's live tombstones walked for it and filtered out.
	lineages  map[string][]capability.Tombstone
	head      uint64
	compacted uint64
	loaded    bool
	ready     chan struct{} // closed at the first load
	// following is closed while the feed follows the store (from each
	// load on) and replaced by an open one when its watch falls behind,
	// until the rescan's load: meanwhile the set may lack revocations the
	// store holds (FeedFollowing: a bearer token is checked in the store).
	following chan struct{}
	changed   chan struct{} // closed and replaced on every change
	stopped   chan struct{} // closed when RunFeed returns
	stopOnce  sync.Once
}

func newFeed() *feed {
	return &feed{ready: make(chan struct{}), following: make(chan struct{}), changed: make(chan struct{}), stopped: make(chan struct{}), lineages: map[string][]capability.Tombstone{}}
}

// current returns the channel closed while the feed follows the store.
func (f *feed) current() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.following
}

// fallBehind records that the feed's watch ended behind the store: until
// the next load the feed does not follow it.
func (f *feed) fallBehind() {
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case <-f.following:
		f.following = make(chan struct{})
	default:
	}
}

func (f *feed) stop() { f.stopOnce.Do(func() { close(f.stopped) }) }

// notifyLocked wakes every stream waiting for a change.
func (f *feed) notifyLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

func (f *feed) reset(log []capability.Tombstone, head, compacted uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log, f.head, f.compacted = log, head, compacted
	f.lineages = map[string][]capability.Tombstone{}
	for _, t := range log {
		if t.Lineage != "" {
			f.lineages[t.Lineage] = append(f.lineages[t.Lineage], t)
		}
	}
	if !f.loaded {
		f.loaded = true
		close(f.ready)
	}
	select {
	case <-f.following:
	default:
		close(f.following)
	}
	f.notifyLocked()
}

func (f *feed) add(t capability.Tombstone) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if old, ok := put(&f.log, t); ok && old.Lineage != "" && old.Lineage != t.Lineage {
		f.dropFromLineage(old.Lineage, t.Sequence)
	}
	if t.Lineage != "" {
		l := f.lineages[t.Lineage]
		put(&l, t)
		f.lineages[t.Lineage] = l
	}
	f.head = max(f.head, t.Sequence)
	f.notifyLocked()
}

// put puts t in log in its sequence's place, replacing (and returning) a
// tombstone of the same sequence.
func put(log *[]capability.Tombstone, t capability.Tombstone) (capability.Tombstone, bool) {
	n := len(*log)
	if n == 0 || (*log)[n-1].Sequence < t.Sequence {
		*log = append(*log, t)
		return capability.Tombstone{}, false
	}
	i := sort.Search(n, func(i int) bool { return (*log)[i].Sequence >= t.Sequence })
	if i < n && (*log)[i].Sequence == t.Sequence {
		old := (*log)[i]
		(*log)[i] = t
		return old, true
	}
	*log = slices.Insert(*log, i, t)
	return capability.Tombstone{}, false
}

// take removes the tombstone of sequence seq from log, returning it.
func take(log *[]capability.Tombstone, seq uint64) (capability.Tombstone, bool) {
	i := sort.Search(len(*log), func(i int) bool { return (*log)[i].Sequence >= seq })
	if i == len(*log) || (*log)[i].Sequence != seq {
		return capability.Tombstone{}, false
	}
	t := (*log)[i]
	// Pruning removes the oldest, so this is nearly always the front:
	// re-slicing keeps it O(1).
	if i == 0 {
		*log = (*log)[1:]
	} else {
		*log = slices.Delete(*log, i, i+1)
	}
	return t, true
}

func (f *feed) dropFromLineage(lineage string, seq uint64) {
	l := f.lineages[lineage]
	take(&l, seq)
	if len(l) == 0 {
		delete(f.lineages, lineage)
	} else {
		f.lineages[lineage] = l
	}
}

// entries is the log a follower walks: the whole feed's (all), or one
// lineage's.
func (f *feed) entries(v View) []capability.Tombstone {
	if v.Whole() {
		return f.log
	}
	return f.lineages[v.lineage]
}

func (f *feed) remove(seq uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if t, ok := take(&f.log, seq); ok && t.Lineage != "" {
		f.dropFromLineage(t.Lineage, seq)
	}
	f.compacted = max(f.compacted, seq)
	f.head = max(f.head, seq)
	f.notifyLocked()
}

// read returns what a follower of v positioned after `after` needs next:
// up to limit of v's tombstones, whether they are a snapshot (the
// follower's position was compacted away, or is ahead of this feed, so it
// must replace its set), the position the follower reaches with them, and
// the feed head. It walks v's tombstones only, a lineage's apart from the
// others'; positions and heads are the whole feed's.
func (f *feed) read(v View, after uint64, limit int) (batch []capability.Tombstone, snapshot bool, reached, head uint64, changed <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	start := after
	if after < f.compacted || after > f.head {
		snapshot, start = true, 0
	}
	log := f.entries(v)
	i := sort.Search(len(log), func(i int) bool { return log[i].Sequence > start })
	end := min(len(log), i+limit)
	batch = slices.Clone(log[i:end])
	reached = f.head
	if end < len(log) {
		reached = batch[len(batch)-1].Sequence
	}
	return batch, snapshot, reached, f.head, f.changed
}

// newest returns at most n of v's newest tombstones after `after`, the
// feed head and the change channel: a follower that wants the recent feed
// only (a display) starts there and reaches the head.
func (f *feed) newest(v View, after uint64, n int) (batch []capability.Tombstone, head uint64, changed <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	log := f.entries(v)
	i := sort.Search(len(log), func(i int) bool { return log[i].Sequence > after })
	i = max(i, len(log)-n)
	return slices.Clone(log[i:]), f.head, f.changed
}

// before returns at most n of v's newest tombstones with a sequence below
// `before`, and the feed head.
func (f *feed) before(v View, before uint64, n int) (batch []capability.Tombstone, head uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	log := f.entries(v)
	end := sort.Search(len(log), func(i int) bool { return log[i].Sequence >= before })
	return slices.Clone(log[max(0, end-n):end]), f.head
}

// View names the tombstones a follower is sent: the whole feed's (All),
// or one lineage's (Lineage), which are walked apart from the others'.
type View struct {
	lineage string
	one     bool
}

// WholeFeed is the whole feed: an operator's, a tool server's.
func WholeFeed() View { return View{} }

// LineageFeed is the tombstones of the grants held in one tree (the root
// node's id), as an agent is shown its own. A lineage "" has none.
func LineageFeed(root string) View { return View{lineage: root, one: true} }

// Whole says whether v is the whole feed.
func (v View) Whole() bool { return !v.one }

// Root is the root node id of the one tree v follows, "" for the whole
// feed.
func (v View) Root() string { return v.lineage }

// RunFeed keeps the in-memory feed and tombstone set in step with the
// stored feed until ctx ends: it establishes a store watch, scans, then
// applies the watch's events above the scan's revision. A watch that falls
// behind is re-established with a fresh scan.
//
// When RunFeed returns, every WatchRevocations stream ends with ErrStopped,
// so that a server shutting down is not held up by its followers.
func (s *Service) RunFeed(ctx context.Context) error {
	defer s.feed.stop()
	for {
		err := s.followFeed(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if !errors.Is(err, store.ErrWatchLagged) {
			return fmt.Errorf("grantstore: revocation feed: %w", err)
		}
		// The set may lack what the watch did not deliver: a bearer
		// token is not answered from it until the rescan (BearerRevoked).
		s.feed.fallBehind()
		s.cfg.Log.Warn("revocation feed watch fell behind; rescanning")
	}
}

func (s *Service) followFeed(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := s.cfg.Store.Watch(ctx, []byte(prefixTombstone))
	if err != nil {
		return err
	}
	var (
		log             []capability.Tombstone
		head, compacted uint64
		revision        uint64
	)
	err = s.cfg.Store.View(ctx, func(tx store.ReadTxn) error {
		log = log[:0]
		var err error
		if head, err = getCounter(tx, feedHeadKey); err != nil {
			return err
		}
		if compacted, err = getCounter(tx, feedCompactedKey); err != nil {
			return err
		}
		revision = tx.Revision()
		return tx.Scan([]byte(prefixTombstone), nil, func(_, v []byte) error {
			t, err := decodeTombstone(v)
			if err != nil {
				return err
			}
			log = append(log, t)
			return nil
		})
	})
	if err != nil {
		return err
	}
	if n := len(log); n > 0 {
		head = max(head, log[n-1].Sequence)
	}
	// What the feed had published before a rescan (its watch fell behind):
	// the tombstones the scan finds past it are published here, as the
	// watch would have published them. A rescan that published nothing
	// left open, on this replica, the silent streams of an agent's
	// credential revoked by value meanwhile (OnPublish ends them), for as
	// long as the node ran (rogue46e tests). The first load publishes
	// nothing: no stream is open before it (BearerRevoked waits for it).
	s.feed.mu.Lock()
	rescan, published := s.feed.loaded, s.feed.head
	s.feed.mu.Unlock()
	// The set first: reset opens BearerRevoked (feed.ready), which must
	// then find every revocation of the scan.
	if err := s.tombstones.Replace(log, head); err != nil {
		return err
	}
	s.feed.reset(log, head, compacted)
	s.tombstones.MarkSynced(head, s.cfg.Clock.Now())
	if rescan {
		for _, t := range log {
			if t.Sequence > published {
				s.published(ctx, t, trace.SpanContext{})
			}
		}
	}

	for batch := range w.Events() {
		// The set learns the batch's tombstones before the feed wakes its
		// waiters (RevocationsChanged): a waiter that looks a token up on
		// the wake-up finds its revocation.
		var added []capability.Tombstone
		decoded := make([]capability.Tombstone, len(batch))
		for i, ev := range batch {
			if ev.Revision <= revision || ev.Type != store.EventPut {
				continue
			}
			t, err := decodeTombstone(ev.Value)
			if err != nil {
				return err
			}
			decoded[i] = t
			added = append(added, t)
		}
		if err := s.tombstones.Add(added...); err != nil {
			return err
		}
		var pruned []uint64
		for i, ev := range batch {
			if ev.Revision <= revision {
				continue
			}
			seq, err := sequenceOf(ev.Key, prefixTombstone)
			if err != nil {
				return err
			}
			switch ev.Type {
			case store.EventPut:
				s.feed.add(decoded[i])
				s.published(ctx, decoded[i], ev.Trace)
			case store.EventDelete:
				pruned = append(pruned, seq)
			}
		}
		now := s.cfg.Clock.Now()
		if len(pruned) > 0 {
			// The service's own set first: once the feed shows a
			// compaction, no lookup here still finds what it dropped.
			s.tombstones.Prune(now)
			for _, seq := range pruned {
				s.feed.remove(seq)
			}
		}
		s.tombstones.MarkSynced(s.tombstones.Head(), now)
	}
	if err := w.Err(); err != nil {
		return err
	}
	return ctx.Err()
}

// FeedMessage is one message of the revocation feed.
type FeedMessage struct {
	Tombstones []capability.Tombstone
	// Head is the position the follower has reached with this message:
	// every tombstone up to it has been sent. It is the feed's head, except
	// in a message cut short by MaxFeedBatch, where it is the last
	// tombstone's sequence.
	Head uint64
	// ServerTime is the control plane's clock when the message was sent.
	ServerTime time.Time
	// Snapshot: the requested position was compacted away (or is ahead of
	// this feed); this message starts a full copy of the live tombstones
	// and the follower must replace its set with it (later messages of the
	// same copy are ordinary additions).
	Snapshot bool
	// Continues: the message was cut short at MaxFeedBatch and the next
	// follows at once; the follower has not reached the feed's head. A
	// snapshot is whole only with the first of its messages that does not
	// continue, and a verifier replaces its set only then.
	Continues bool
	// Skipped: the feed's head moved past tombstones the follower's view
	// does not show (another lineage's), and the message carries none.
	// The follower reaches Head all the same; a server may send it as its
	// heartbeat only.
	Skipped bool
}

// WatchRevocations sends the feed after sequence `after` to send, then
// every new tombstone as it is committed, and a heartbeat carrying the
// head and the server time every Heartbeat when nothing happens, until ctx
// ends (nil), send fails, or RunFeed stops (ErrStopped). See the package
// documentation for the protocol.
func (s *Service) WatchRevocations(ctx context.Context, after uint64, send func(FeedMessage) error) error {
	return s.WatchNewestRevocations(ctx, WholeFeed(), after, 0, send)
}

// WatchNewestRevocations is WatchRevocations, but when newest is above 0
// its first message carries at most newest (at most MaxFeedBatch) of the
// newest live tombstones after `after`, and none older, with the feed's
// head: a view of the recent feed opens at a cost bounded by what it
// shows, however many tombstones are live. Each later message so too: a
// follower behind by more than newest skips the older ones (a display
// shows the newest; NewestBefore pages to the rest). The first message is never a
// snapshot; a follower that keeps a set of tombstones (a verifier) must
// not start this way.
//
// The tombstones sent are v's, a lineage's walked apart from the rest;
// positions, heads and snapshots are the whole feed's, so a follower's
// position is one whatever it is shown.
func (s *Service) WatchNewestRevocations(ctx context.Context, v View, after uint64, newest int, send func(FeedMessage) error) error {
	select {
	case <-s.feed.ready:
	case <-s.feed.stopped:
		return fmt.Errorf("%w; reconnect", ErrStopped)
	case <-ctx.Done():
		return ctx.Err()
	}
	// A display's view too (newest): an operator who revoked a grant and
	// looked at once was shown the feed without it.
	if err := s.catchUp(ctx); err != nil {
		return err
	}
	heartbeat := time.NewTicker(s.cfg.Heartbeat)
	defer heartbeat.Stop()
	position, first := after, true
	if newest > 0 {
		batch, head, _ := s.feed.newest(v, after, min(newest, MaxFeedBatch))
		if err := send(FeedMessage{Tombstones: batch, Head: head, ServerTime: s.cfg.Clock.Now()}); err != nil {
			return err
		}
		position, first = head, false
		heartbeat.Reset(s.cfg.Heartbeat)
	}
	for {
		var (
			batch    []capability.Tombstone
			snapshot bool
			reached  uint64
			changed  <-chan struct{}
			// continues: cut short at MaxFeedBatch, the next follows at once.
			continues bool
		)
		if newest > 0 {
			// A display follower that fell behind (a rogue's flood of
			// revocations committed between two of its reads) skips to the
			// newest, as at its opening: else it was sent every tombstone
			// of the flood, in order, before the operator's own behind it.
			batch, reached, changed = s.feed.newest(v, position, min(newest, MaxFeedBatch))
		} else {
			var head uint64
			batch, snapshot, reached, head, changed = s.feed.read(v, position, MaxFeedBatch)
			continues = reached < head
		}
		// Another lineage's tombstones moved the head: the follower hears
		// it (its server may hold it back to a heartbeat's pace).
		skipped := len(batch) == 0 && !snapshot && !first && reached > position
		if len(batch) > 0 || snapshot || first || skipped {
			err := send(FeedMessage{Tombstones: batch, Head: reached, ServerTime: s.cfg.Clock.Now(), Snapshot: snapshot, Continues: continues, Skipped: skipped})
			if err != nil {
				return err
			}
			position, first = reached, false
			heartbeat.Reset(s.cfg.Heartbeat)
			continue // there may be more
		}
		select {
		case <-ctx.Done():
			return nil
		case <-s.feed.stopped:
			return fmt.Errorf("%w; reconnect", ErrStopped)
		case <-changed:
		case <-heartbeat.C:
			if err := send(FeedMessage{Head: position, ServerTime: s.cfg.Clock.Now()}); err != nil {
				return err
			}
		}
	}
}

// catchUp waits until this replica's feed has applied every tombstone the
// store held when the follower opened it. A follower's first message is
// then never older than a revocation already acknowledged: the feed is
// filled by the store's watch, a moment after each commit, and a verifier
// that connected in that moment (a new replica's, or one reconnecting
// just after an operator's revocation) was sent a first message without
// it, and took it as the whole set. So is a follower's position ahead of
// this replica's feed waited for, when the store has it: the follower read
// those tombstones from another replica whose watch was ahead of this
// one's, and a snapshot of this feed would have it replace its set with
// one that lacks them (a verifier accepted a token again whose revocation
// it had applied). Only a position the store itself has not reached (the
// store was restored from an older copy) is answered with a snapshot, as
// before. Nothing is sent while it waits, not even a heartbeat (this
// replica cannot say what followed the position), so the follower fails
// closed after its staleness budget and may try another replica. A
// display's view (newest) and a page of it (NewestBefore) wait the same
// way: an operator who revoked a grant and looked at once was shown the
// feed without it. It costs one read of the stored head per feed opened
// or page read.
func (s *Service) catchUp(ctx context.Context) error {
	stored, err := store.Read(ctx, s.cfg.Store, func(tx store.ReadTxn) (uint64, error) { return getCounter(tx, feedHeadKey) })
	if err != nil {
		return err
	}
	for {
		s.feed.mu.Lock()
		head, changed := s.feed.head, s.feed.changed
		s.feed.mu.Unlock()
		if stored <= head {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.feed.stopped:
			return fmt.Errorf("%w; reconnect", ErrStopped)
		case <-changed:
		}
	}
}

// NewestBefore returns at most n (at most MaxFeedBatch) of the newest live
// tombstones with a sequence below `before`, oldest first, and the feed's
// head: the page of a display (WatchNewestRevocations) older than what it
// shows.
func (s *Service) NewestBefore(ctx context.Context, v View, before uint64, n int) ([]capability.Tombstone, uint64, error) {
	select {
	case <-s.feed.ready:
	case <-s.feed.stopped:
		return nil, 0, fmt.Errorf("%w; reconnect", ErrStopped)
	case <-ctx.Done():
		return nil, 0, ctx.Err()
	}
	// As a feed's first message (catchUp): a page asked for just after a
	// revocation shows it.
	if err := s.catchUp(ctx); err != nil {
		return nil, 0, err
	}
	batch, head := s.feed.before(v, before, min(n, MaxFeedBatch))
	return batch, head, nil
}

// PruneTombstones drops from the stored feed every tombstone, oldest
// first, whose DropAfter has passed on the control plane's clock, and
// advances the compaction point. It stops at the first grant tombstone
// still needed; a bearer token's tombstone, which lives as long as the
// token, is skipped and stays while later ones go. A follower whose
// position is below the compaction point gets a snapshot of every live
// tombstone, so one kept behind the compaction point is never missed.
// Grants are untouched: their stored state still says revoked.
func (s *Service) PruneTombstones(ctx context.Context) (int, error) {
	pruned := 0
	for {
		now := s.cfg.Clock.Now()
		n, more := 0, false
		err := s.cfg.Store.Update(ctx, func(tx store.Txn) error {
			n, more = 0, false
			compacted, err := getCounter(tx, feedCompactedKey)
			if err != nil {
				return err
			}
			var drop []uint64
			err = tx.Scan([]byte(prefixTombstone), nil, func(k, v []byte) error {
				if len(drop) == bulkChunk {
					more = true
					return store.ErrStopScan
				}
				t, err := decodeTombstone(v)
				if err != nil {
					return err
				}
				if !now.After(t.DropAfter) {
					if t.Holder == "" && t.DropAfter.After(capability.DropAfter(t.RevokedAt)) {
						// A bearer token's tombstone (no holder) lives
						// until the token expires, months perhaps: skip
						// it, or it would hold every later tombstone in
						// the feed. A grant's stops the scan, even one
						// whose drop is counted from its commit, past
						// the decision's bound (rogue38i): the later
						// grants' are needed as long, near enough (their
						// drops are counted from later commits), and
						// skipping them walked every live tombstone at
						// each prune (rogue40o test).
						return nil
					}
					return store.ErrStopScan
				}
				seq, err := sequenceOf(k, prefixTombstone)
				if err != nil {
					return err
				}
				drop = append(drop, seq)
				return nil
			})
			if err != nil {
				return err
			}
			for _, seq := range drop {
				if err := tx.Delete(tombstoneKey(seq)); err != nil {
					return err
				}
				compacted = max(compacted, seq)
			}
			n = len(drop)
			if n == 0 {
				return nil
			}
			return putCounter(tx, feedCompactedKey, compacted)
		})
		pruned += n
		if err != nil || !more {
			return pruned, err
		}
	}
}

// RunPruner prunes the stored feed every PruneInterval (on the clock)
// until ctx ends.
func (s *Service) RunPruner(ctx context.Context) error {
	for {
		if clock.Sleep(ctx, s.cfg.Clock, s.cfg.PruneInterval) != nil {
			return nil
		}
		if _, err := s.PruneTombstones(ctx); err != nil && ctx.Err() == nil {
			s.cfg.Log.Error("pruning the revocation feed failed; will retry", "error", err)
		}
	}
}
