package capability

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Tombstone records that a grant, and with it the grant's whole subtree, is
// revoked. One tombstone is written per revocation, however large the
// subtree: a verifier rejects a token whose jti or any chain entry has one.
type Tombstone struct {
	// Sequence orders tombstones in the revocation feed; it is assigned by
	// the control plane when the tombstone is committed.
	Sequence  uint64    `pb:"1"`
	GrantID   string    `pb:"2"`
	RevokedAt time.Time `pb:"3"`
	// DropAfter is when no token carrying the grant can still be accepted,
	// so the tombstone may leave the feed and every set. See DropAfter.
	DropAfter time.Time `pb:"4"`
	Reason    string    `pb:"5"`
	// Holder is the node holding the revoked grant and Lineage the root of
	// its tree, so that the feed can show an agent only what concerns its
	// own lineage. Both are empty for a revoked bearer token (GrantID then
	// holds the token's id) and for tombstones written before they were
	// recorded.
	Holder  string `pb:"6"`
	Lineage string `pb:"7"`
	// RevokedBy is the principal that revoked the grant (the grant's
	// RevokedBy): Reason is the revoker's own text, and an agent's may
	// read like an operator's. Empty for a revoked bearer token and for
	// tombstones written before it was recorded.
	RevokedBy string `pb:"8"`
}

// DropAfter is the earliest safe drop time for a tombstone written at
// revokedAt: a token minted before the revocation expires by
// revokedAt + MaxTokenTTL and is accepted at most MaxLeeway beyond that.
// Both comparisons run on the verifier's own clock against times the control
// plane wrote, so the bound holds whatever the verifier's clock skew, as
// long as the verifier prunes its own set. A snapshot (a verifier behind
// the feed's compaction point) holds only what the control plane's clock
// kept: see docs/design.md §11.
func DropAfter(revokedAt time.Time) time.Time {
	return revokedAt.Add(MaxTokenTTL + MaxLeeway)
}

// TombstoneFor builds the tombstone for a grant revoked directly (by
// Revoke), with the sequence the store assigned.
func TombstoneFor(g Grant, sequence uint64) (Tombstone, error) {
	if g.State != StateRevoked || g.RevokedVia != g.GrantID {
		return Tombstone{}, fmt.Errorf("%w: grant %s was not revoked directly", ErrInvalidGrant, g.GrantID)
	}
	return Tombstone{
		Sequence:  sequence,
		GrantID:   g.GrantID,
		RevokedAt: g.RevokedAt,
		DropAfter: DropAfter(g.RevokedAt),
		Reason:    g.Reason,
		Holder:    g.HolderNodeID,
		RevokedBy: g.RevokedBy,
	}, nil
}

// TombstoneSet is the in-memory set of live tombstones that a verifier (or
// the control plane itself) consults on every request. It is safe for
// concurrent use; the zero value is an empty set.
//
// Reads are lock-free: the set is an immutable snapshot behind an atomic
// pointer, and writers (the feed follower, the pruner) copy it, change the
// copy and swap it in under a mutex. Reads happen per tool call; writes per
// revocation, and the set only holds tombstones younger than
// MaxTokenTTL + MaxLeeway, so paying on write is the right trade: a reader
// never contends with other readers on a shared lock word, as an RWMutex's
// readers do, and never waits behind a writer.
//
// A snapshot is a large base map and a small map of what was added since
// (recent), each immutable once published: Add copies only recent, and
// folds it into a new base once it holds about the square root of the
// set's size, so a write costs O(√n) amortized, a lookup two map reads.
// Until the thirty-ninth pass every Add copied the whole map (14 ms and
// 3.5 MB at 100,000 tombstones on a loaded host): a rogue revoking grants
// it delegates, in a loop (two requests of its lineage's budget each),
// cost the control plane's feed and every verifier following the whole
// feed a copy of every live tombstone for each of its revocations
// (rogue39h test TestRogue39HAddingToALargeSetDoesNotCopyIt). Prune and
// Replace still rebuild the set whole. Add a feed message's tombstones in
// one Add call rather than one call each.
type TombstoneSet struct {
	writer   sync.Mutex
	snapshot atomic.Pointer[tombstoneSnapshot]
}

type tombstoneSnapshot struct {
	// byGrant is the base and recent what was added since (a tombstone in
	// both: recent's is the merged one). Neither map nor values are
	// mutated once published.
	byGrant  map[string]*Tombstone
	recent   map[string]*Tombstone
	size     int // tombstones held: byGrant's and recent's not in byGrant
	head     uint64
	syncedAt time.Time
}

var emptyTombstones = &tombstoneSnapshot{byGrant: map[string]*Tombstone{}}

// minRecent is the least number of tombstones recent holds before it is
// folded into the base: a small set is copied whole, as before.
const minRecent = 64

// get is the tombstone held for grantID.
func (snap *tombstoneSnapshot) get(grantID string) (*Tombstone, bool) {
	if t, ok := snap.recent[grantID]; ok {
		return t, true
	}
	t, ok := snap.byGrant[grantID]
	return t, ok
}

// all calls fn with each tombstone held, once.
func (snap *tombstoneSnapshot) all(fn func(t *Tombstone)) {
	for id, t := range snap.byGrant {
		if _, ok := snap.recent[id]; !ok {
			fn(t)
		}
	}
	for _, t := range snap.recent {
		fn(t)
	}
}

func (s *TombstoneSet) load() *tombstoneSnapshot {
	if snap := s.snapshot.Load(); snap != nil {
		return snap
	}
	return emptyTombstones
}

// Add inserts tombstones as one atomic change and advances the head to the
// highest sequence seen. Revocation only ever narrows what is accepted, so
// Add is idempotent and order-insensitive: a replayed or reordered
// tombstone is harmless. A tombstone for a grant already present keeps the
// earlier revocation and the later DropAfter. The batch is refused whole if
// any tombstone lacks a grant id.
func (s *TombstoneSet) Add(tombstones ...Tombstone) error {
	for _, t := range tombstones {
		if err := ValidateID("tombstone grant_id", t.GrantID); err != nil {
			return err
		}
	}
	if len(tombstones) == 0 {
		return nil
	}
	s.writer.Lock()
	defer s.writer.Unlock()
	current := s.load()
	next := &tombstoneSnapshot{
		byGrant:  current.byGrant,
		recent:   make(map[string]*Tombstone, len(current.recent)+len(tombstones)),
		size:     current.size,
		head:     current.head,
		syncedAt: current.syncedAt,
	}
	maps.Copy(next.recent, current.recent)
	for _, t := range tombstones {
		next.put(t)
	}
	if len(next.recent) >= max(minRecent, isqrt(len(next.byGrant))) {
		// Folded into a new base: each base copy pays for the √n writes
		// since the last.
		base := make(map[string]*Tombstone, next.size)
		maps.Copy(base, next.byGrant)
		maps.Copy(base, next.recent)
		next.byGrant, next.recent = base, nil
	}
	s.snapshot.Store(next)
	return nil
}

// isqrt is ⌊√n⌋ for n ≥ 0.
func isqrt(n int) int {
	r := int(math.Sqrt(float64(n)))
	for r*r > n {
		r--
	}
	for (r+1)*(r+1) <= n {
		r++
	}
	return r
}

// Replace makes the set exactly tombstones, at head. It is for a feed that
// answers with a snapshot because the verifier's position was compacted
// away.
func (s *TombstoneSet) Replace(tombstones []Tombstone, head uint64) error {
	for _, t := range tombstones {
		if err := ValidateID("tombstone grant_id", t.GrantID); err != nil {
			return err
		}
	}
	s.writer.Lock()
	defer s.writer.Unlock()
	next := &tombstoneSnapshot{
		recent:   make(map[string]*Tombstone, len(tombstones)),
		head:     head,
		syncedAt: s.load().syncedAt,
	}
	for _, t := range tombstones {
		next.put(t)
	}
	next.byGrant, next.recent = next.recent, nil
	s.snapshot.Store(next)
	return nil
}

// put adds t to recent (which the caller owns), merged with the
// tombstone held for its grant.
func (snap *tombstoneSnapshot) put(t Tombstone) {
	if existing, ok := snap.get(t.GrantID); ok {
		merged := *existing // copy: the old value is shared with published snapshots
		if merged.RevokedAt.After(t.RevokedAt) {
			merged.RevokedAt, merged.Reason, merged.Sequence = t.RevokedAt, t.Reason, t.Sequence
		}
		if t.DropAfter.After(merged.DropAfter) {
			merged.DropAfter = t.DropAfter
		}
		t = merged
	} else {
		snap.size++
	}
	snap.recent[t.GrantID] = &t
	snap.head = max(snap.head, t.Sequence)
}

// Revoked reports whether a token or grant with this id and chain (ancestor
// ids, root first) is revoked, in O(len(chain)) map lookups. grantID names
// the tombstoned grant closest to the root — the revocation that covers
// the most — so the answer is the same whichever of several revoked
// ancestors was revoked first.
func (s *TombstoneSet) Revoked(grantID string, chain []string) (revokedVia string, ok bool) {
	snap := s.load()
	if snap.size == 0 {
		return "", false
	}
	for _, id := range chain {
		if _, ok := snap.get(id); ok {
			return id, true
		}
	}
	if _, ok := snap.get(grantID); ok {
		return grantID, true
	}
	return "", false
}

// Lookup returns the tombstone for grantID, if the set holds one.
func (s *TombstoneSet) Lookup(grantID string) (Tombstone, bool) {
	if t, ok := s.load().get(grantID); ok {
		return *t, true
	}
	return Tombstone{}, false
}

// Prune drops tombstones whose DropAfter is before now and returns how many
// it dropped. Call it periodically; a tombstone kept too long is harmless.
func (s *TombstoneSet) Prune(now time.Time) int {
	s.writer.Lock()
	defer s.writer.Unlock()
	current := s.load()
	dropped := 0
	current.all(func(t *Tombstone) {
		if now.After(t.DropAfter) {
			dropped++
		}
	})
	if dropped == 0 {
		return 0
	}
	next := &tombstoneSnapshot{
		byGrant:  make(map[string]*Tombstone, current.size-dropped),
		size:     current.size - dropped,
		head:     current.head,
		syncedAt: current.syncedAt,
	}
	current.all(func(t *Tombstone) {
		if !now.After(t.DropAfter) {
			next.byGrant[t.GrantID] = t
		}
	})
	s.snapshot.Store(next)
	return dropped
}

// Head is the highest sequence the set has seen, pruned or not; a feed
// follower resumes after it.
func (s *TombstoneSet) Head() uint64 { return s.load().head }

// Len is the number of tombstones held.
func (s *TombstoneSet) Len() int { return s.load().size }

// Tombstones returns the held tombstones in sequence order.
func (s *TombstoneSet) Tombstones() []Tombstone {
	snap := s.load()
	out := make([]Tombstone, 0, snap.size)
	snap.all(func(t *Tombstone) { out = append(out, *t) })
	slices.SortFunc(out, func(a, b Tombstone) int {
		return cmp.Or(cmp.Compare(a.Sequence, b.Sequence), cmp.Compare(a.GrantID, b.GrantID))
	})
	return out
}

// MarkSynced records that the feed was known complete up to head at
// receivedAt (the verifier's clock when the feed message arrived, not the
// server's time in it): every tombstone up to head has been added.
func (s *TombstoneSet) MarkSynced(head uint64, receivedAt time.Time) {
	s.writer.Lock()
	defer s.writer.Unlock()
	current := s.load()
	next := *current // shares the immutable map
	next.head = max(next.head, head)
	if receivedAt.After(next.syncedAt) {
		next.syncedAt = receivedAt
	}
	s.snapshot.Store(&next)
}

// CheckFresh returns an error wrapping ErrFeedStale if the set was last
// synced more than budget before now (or never). A verifier calls it before
// trusting Revoked: an old set cannot prove a token is not revoked.
func (s *TombstoneSet) CheckFresh(now time.Time, budget time.Duration) error {
	synced := s.load().syncedAt
	if synced.IsZero() {
		return fmt.Errorf("%w: never synced", ErrFeedStale)
	}
	if age := now.Sub(synced); age > budget {
		return fmt.Errorf("%w: last synced %s ago, budget %s", ErrFeedStale, age, budget)
	}
	return nil
}
