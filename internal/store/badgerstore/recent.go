package badgerstore

// recentValues is the committer's memory of the committed state of the
// keys its Updates last read or wrote, so that an Update reading a key
// that was read or written a moment ago (a parent spawning its next
// child reads the same parent, child count, ancestors and growth records
// each time) skips Badger's lookup: the memtables, then the levels'
// tables, and some eight allocations.
//
// It holds exactly what a batch's snapshot would return for its keys: the
// committer is the store's only writer and the only user of this memory;
// it fills it from a snapshot (a read that missed, opened after the last
// commit) and from the writes of commits that succeeded, in commit order,
// before the next batch begins; a failed commit forgets everything.
//
// It is bounded: two generations of at most recentEntries keys and
// recentBytes bytes of values each, the older dropped when the newer is
// full, a hit in the older moved to the newer; a value larger than
// recentMaxValue is not kept (and forgets the key's older value).
type recentValues struct {
	cur, prev recentGeneration
	// The bounds: keys and bytes of values a generation holds, and the
	// largest value kept.
	entries, bytes, maxValue int
}

type recentGeneration struct {
	m     map[string]recentValue
	bytes int
}

// recentValue is one key's committed state: its value, or absent.
type recentValue struct {
	value  []byte
	absent bool
}

// The store's bounds: at most 32,768 keys and 8 MiB of values in all
// (about 10 MiB of heap with the maps once full), enough for the hot keys
// of a few hundred parents spawning at once and for the nodes a
// termination of about 10,000 agents marks and then, chunk by chunk,
// reads again for its record: with 2,048 keys and 256 KiB a generation,
// a 1,000-agent termination found 93% of its Updates' reads here and a
// 10,000-agent one under 1%, each a lookup in Badger's memtables instead
// (28,000 of them; docs/capacity.md).
const (
	recentEntries  = 16384
	recentBytes    = 4 << 20
	recentMaxValue = 4096
)

func newRecentValues(entries, bytes, maxValue int) *recentValues {
	return &recentValues{cur: newRecentGeneration(entries), entries: entries, bytes: bytes, maxValue: maxValue}
}

// newRecentGeneration sizes the map for a full generation, so that it
// never grows (a growing map rehashes its keys).
func newRecentGeneration(entries int) recentGeneration {
	return recentGeneration{m: make(map[string]recentValue, entries)}
}

// get returns key's committed state if it is remembered. The value is
// the memory's own: the caller copies it before handing it on.
func (r *recentValues) get(key []byte) (recentValue, bool) {
	if v, ok := r.cur.m[string(key)]; ok {
		return v, true
	}
	v, ok := r.prev.m[string(key)]
	if !ok {
		return recentValue{}, false
	}
	delete(r.prev.m, string(key))
	r.prev.bytes -= len(v.value)
	r.cur.add(string(key), v)
	r.flip()
	return v, true
}

// set remembers key's committed state, a copy of value (nil with absent).
func (r *recentValues) set(key []byte, value []byte, absent bool) {
	k := string(key)
	if old, ok := r.prev.m[k]; ok {
		delete(r.prev.m, k)
		r.prev.bytes -= len(old.value)
	}
	if old, ok := r.cur.m[k]; ok {
		delete(r.cur.m, k)
		r.cur.bytes -= len(old.value)
	}
	if len(value) > r.maxValue {
		return
	}
	v := recentValue{absent: absent}
	if !absent {
		v.value = append(make([]byte, 0, len(value)), value...)
	}
	r.cur.add(k, v)
	r.flip()
}

func (g *recentGeneration) add(k string, v recentValue) {
	g.m[k] = v
	g.bytes += len(v.value)
}

// flip starts a new generation when the current one is full.
func (r *recentValues) flip() {
	if len(r.cur.m) >= r.entries || r.cur.bytes >= r.bytes {
		r.prev, r.cur = r.cur, newRecentGeneration(r.entries)
	}
}

// forget drops everything (after a failed commit).
func (r *recentValues) forget() {
	r.prev, r.cur = recentGeneration{}, newRecentGeneration(r.entries)
}

// len is how many keys are remembered.
func (r *recentValues) len() int { return len(r.cur.m) + len(r.prev.m) }

// commitWrites remembers the writes of committed updates, in order.
func (r *recentValues) commitWrites(updates []*appliedUpdate) {
	for _, u := range updates {
		for _, m := range u.writes {
			r.set(m.key, m.value, m.deleted)
		}
	}
}
