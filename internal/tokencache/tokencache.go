// Package tokencache keeps what the verification of a token proved, keyed
// by the token's SHA-256 (no token is kept), bounded in all and per
// holder. It is the bookkeeping under the control plane's bearer-token
// cache (controlplane/auth.TokenCache) and the capability tokens'
// (capability/grantstore): each of them decides what a hit must still
// check; this package only holds, bounds and evicts.
//
// One holder keeps at most perHolder entries, its oldest going first, so
// a caller presenting fresh tokens of its own (an agent minting itself
// credentials or grants) pushes out its own entries, never another's.
// When the cache is full, a token of a group (a lineage: a root and all
// its descendants) holding groupShare entries or more replaces its group's
// oldest; any other makes room: expired entries go first, then the
// oldest of the groups holding more than their share (down to it), then
// the oldest of the largest groups (down to a common level), then
// arbitrary ones, until a quarter of it is free — so a rogue whose
// thousands of children each present their tokens takes at most its
// share before it pushes out only its own, and a group that filled the
// cache while it was not full is trimmed to its share before another
// group's entry goes. Every entry leaves its group's list at a constant
// cost (amortised), however many entries its group holds.
package tokencache

import (
	"crypto/sha256"
	"slices"
	"time"
)

// Sum is a token's digest, the key of its entry.
type Sum = [sha256.Size]byte

// Digest returns token's Sum. A token of up to 2 KiB (an agent's, a
// tool call's) is hashed from a copy on the stack: the conversion of a
// longer string than 32 bytes to the bytes sha256 reads allocated on
// every lookup, a cache hit's only allocation.
func Digest(token string) Sum {
	var buf [2 << 10]byte
	if len(token) <= len(buf) {
		return sha256.Sum256(buf[:copy(buf[:], token)])
	}
	return sha256.Sum256([]byte(token))
}

// Cache maps a token's Sum to a V. It is not safe for concurrent use: its
// owner holds a lock around it.
type Cache[V any] struct {
	max, perHolder, groupShare int
	entries                    map[Sum]entry[V]
	// held lists each holder's entries, oldest first, at most perHolder.
	held map[string][]Sum
	// groups lists each group's entries, oldest first. A group may hold
	// most of the cache (a rogue lineage's thousands of children, filling
	// it while it is not full), so an entry leaving its group is not looked
	// for in the list: its item is left there, stale (its entry gone, or
	// kept anew under another seq), skipped when the group's oldest is
	// asked for, and dropped when the stale items outnumber the live ones.
	// Each entry so leaves its group at a constant cost (amortised), where
	// a walk of the list per entry cost the group's size squared when a
	// full group was trimmed or expired (rogue37k test), under the lock
	// every caller's authentication takes.
	groups map[string]*groupList
	seq    uint64 // the last entry's seq
	// steps counts the list items looked at to keep the lists (tests).
	steps int
}

type entry[V any] struct {
	holder, group string
	seq           uint64 // its place in its group's list
	expires       time.Time
	value         V
}

// groupList is a group's entries, oldest first, with stale items among
// them (groups); live is how many are not.
type groupList struct {
	items []groupItem
	live  int
}

type groupItem struct {
	sum Sum
	seq uint64
}

// New returns a cache of at most max entries, perHolder of one holder's;
// a full cache takes a token of a group holding groupShare entries or more
// in place of its group's oldest (0: no group share).
func New[V any](max, perHolder, groupShare int) *Cache[V] {
	return &Cache[V]{max: max, perHolder: perHolder, groupShare: groupShare, entries: make(map[Sum]entry[V]), held: make(map[string][]Sum), groups: make(map[string]*groupList)}
}

// Len returns how many entries are kept.
func (c *Cache[V]) Len() int { return len(c.entries) }

// Get returns the value kept for sum.
func (c *Cache[V]) Get(sum Sum) (V, bool) {
	e, ok := c.entries[sum]
	return e.value, ok
}

// Update replaces the value kept for sum in its place; false when none
// is kept (evicted since, or never).
func (c *Cache[V]) Update(sum Sum, v V) bool {
	e, ok := c.entries[sum]
	if ok {
		e.value = v
		c.entries[sum] = e
	}
	return ok
}

// Put keeps v for sum, held by holder, of group ("": none); expires is
// when the entry may go first to make room (a hit's own checks are its
// owner's). A sum kept before is kept anew, as its holder's newest.
func (c *Cache[V]) Put(sum Sum, holder, group string, expires, now time.Time, v V) {
	c.Remove(sum)
	if held := c.held[holder]; len(held) >= c.perHolder {
		c.Remove(held[0])
	}
	if len(c.entries) >= c.max {
		if group != "" && c.groupShare > 0 && c.InGroup(group) >= c.groupShare {
			c.Remove(c.oldest(group))
		} else {
			c.evict(now)
		}
	}
	c.entries[sum] = entry[V]{holder: holder, group: group, seq: c.join(group, sum), expires: expires, value: v}
	c.held[holder] = append(c.held[holder], sum)
}

// SetGroup moves the entry kept for sum to group, as its newest: the
// group of a token learnt after it was kept (an agent's lineage, read
// from its node after its token verified). False when none is kept.
func (c *Cache[V]) SetGroup(sum Sum, group string) bool {
	e, ok := c.entries[sum]
	if !ok {
		return false
	}
	if e.group == group {
		return true
	}
	from := e.group
	e.group, e.seq = group, c.join(group, sum)
	c.entries[sum] = e
	c.leave(from)
	return true
}

// Remove forgets sum, and its place in its holder's list.
func (c *Cache[V]) Remove(sum Sum) {
	e, ok := c.entries[sum]
	if !ok {
		return
	}
	delete(c.entries, sum)
	c.steps += len(c.held[e.holder]) // at most perHolder
	list := slices.DeleteFunc(c.held[e.holder], func(s Sum) bool { return s == sum })
	if len(list) == 0 {
		delete(c.held, e.holder)
	} else {
		c.held[e.holder] = list
	}
	c.leave(e.group)
}

// join lists sum as group's newest ("": none) and returns its seq.
func (c *Cache[V]) join(group string, sum Sum) uint64 {
	c.seq++
	if group == "" {
		return c.seq
	}
	g := c.groups[group]
	if g == nil {
		g = &groupList{}
		c.groups[group] = g
	}
	g.items = append(g.items, groupItem{sum: sum, seq: c.seq})
	g.live++
	return c.seq
}

// leave counts an entry out of group ("": none), its item left stale in
// the list; the list is rid of its stale items once they outnumber the
// live ones (or forgotten once none is live).
func (c *Cache[V]) leave(group string) {
	g := c.groups[group]
	if g == nil {
		return
	}
	if g.live--; g.live == 0 {
		delete(c.groups, group)
		return
	}
	if len(g.items) > 2*g.live+16 {
		c.steps += len(g.items)
		g.items = slices.DeleteFunc(g.items, func(it groupItem) bool { return !c.current(group, it) })
	}
}

// current reports whether it is its entry's item in group's list.
func (c *Cache[V]) current(group string, it groupItem) bool {
	e, ok := c.entries[it.sum]
	return ok && e.group == group && e.seq == it.seq
}

// oldest returns group's oldest entry (group holds one), dropping the
// stale items before it.
func (c *Cache[V]) oldest(group string) Sum {
	g := c.groups[group]
	for {
		c.steps++
		it := g.items[0]
		if c.current(group, it) {
			return it.sum
		}
		g.items = g.items[1:]
	}
}

// Expire removes every entry expired at now (its expires not after it):
// an owner sweeping its cache now and then.
func (c *Cache[V]) Expire(now time.Time) {
	for sum, e := range c.entries {
		if !now.Before(e.expires) {
			c.Remove(sum)
		}
	}
}

// evict makes room: expired entries first, then the oldest of the groups
// holding more than their share, down to it, then arbitrary ones (map
// order), until a quarter of the cache is free. Without the second step a
// group that filled the cache while it was not full (the share is applied
// at a full cache) had every other group's arrival drop a quarter of the
// entries at random, others' among them, and filled the quarter again
// (rogue37b test).
func (c *Cache[V]) evict(now time.Time) {
	c.Expire(now)
	if c.groupShare > 0 {
		for group := range c.groups {
			for c.InGroup(group) > c.groupShare && len(c.entries) > c.max*3/4 {
				c.Remove(c.oldest(group))
			}
		}
	}
	c.level(len(c.entries) - c.max*3/4)
	for sum := range c.entries {
		if len(c.entries) <= c.max*3/4 {
			return
		}
		c.Remove(sum)
	}
}

// level removes up to n entries of the groups, the largest groups' first,
// each group's oldest first: the groups are cut down to a common level
// (the highest that frees n), the ones at it losing one more in turn
// until n are gone. Until the thirty-eighth pass the room was made of
// arbitrary entries (map order), whoever's, once no group held more than
// its share: a rogue lineage kept just under its share had each token it
// presented at a full cache drop a quarter of the cache at random, every
// other lineage's among them; now its own go first, down to the others'.
func (c *Cache[V]) level(n int) {
	if n <= 0 || len(c.groups) == 0 {
		return
	}
	type group struct {
		name string
		size int
	}
	groups := make([]group, 0, len(c.groups))
	total := 0
	for name, g := range c.groups {
		groups = append(groups, group{name, g.live})
		total += g.live
	}
	c.steps += len(groups)
	// Largest first; ties by name, so that the cut is the same whatever
	// the map's order.
	slices.SortFunc(groups, func(a, b group) int {
		if a.size != b.size {
			return b.size - a.size
		}
		if a.name < b.name {
			return -1
		}
		return 1
	})
	n = min(n, total)
	// The level L: the largest for which cutting every group above it to
	// it frees at least n; above counts the groups above L.
	freed, above, level := 0, 0, groups[0].size
	for freed < n {
		// The level only goes down: above only grows.
		for above < len(groups) && groups[above].size >= level {
			above++
		}
		// Lowering the level by one frees one entry of each group at or
		// above it.
		if freed+above >= n {
			break
		}
		freed += above
		level--
	}
	// Cut the groups above level to it, then one more of the first of
	// those at level until n are gone.
	for _, g := range groups {
		if g.size <= level {
			break
		}
		for c.InGroup(g.name) > level {
			c.Remove(c.oldest(g.name))
			n--
		}
	}
	for _, g := range groups[:above] {
		if n <= 0 {
			return
		}
		if c.InGroup(g.name) > 0 {
			c.Remove(c.oldest(g.name))
			n--
		}
	}
}

// Range calls fn with each entry kept, in no order, until fn returns
// false.
func (c *Cache[V]) Range(fn func(sum Sum, v V) bool) {
	for sum, e := range c.entries {
		if !fn(sum, e.value) {
			return
		}
	}
}

// Held returns how many entries holder holds.
func (c *Cache[V]) Held(holder string) int { return len(c.held[holder]) }

// InGroup returns how many entries group holds.
func (c *Cache[V]) InGroup(group string) int {
	if g := c.groups[group]; g != nil {
		return g.live
	}
	return 0
}
