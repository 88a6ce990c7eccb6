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
// arbitrary ones, until a quarter of it is free — so a rogue whose
// thousands of children each present their tokens takes at most its
// share before it pushes out only its own, and a group that filled the
// cache while it was not full is trimmed to its share before another
// group's entry goes.
package tokencache

import (
	"crypto/sha256"
	"slices"
	"time"
)

// Sum is a token's digest, the key of its entry.
type Sum = [sha256.Size]byte

// Digest returns token's Sum.
func Digest(token string) Sum { return sha256.Sum256([]byte(token)) }

// Cache maps a token's Sum to a V. It is not safe for concurrent use: its
// owner holds a lock around it.
type Cache[V any] struct {
	max, perHolder, groupShare int
	entries                    map[Sum]entry[V]
	// held lists each holder's entries, oldest first, at most perHolder;
	// groups each group's.
	held, groups map[string][]Sum
}

type entry[V any] struct {
	holder, group string
	expires       time.Time
	value         V
}

// New returns a cache of at most max entries, perHolder of one holder's;
// a full cache takes a token of a group holding groupShare entries or more
// in place of its group's oldest (0: no group share).
func New[V any](max, perHolder, groupShare int) *Cache[V] {
	return &Cache[V]{max: max, perHolder: perHolder, groupShare: groupShare, entries: make(map[Sum]entry[V]), held: make(map[string][]Sum), groups: make(map[string][]Sum)}
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
		if own := c.groups[group]; group != "" && c.groupShare > 0 && len(own) >= c.groupShare {
			c.Remove(own[0])
		} else {
			c.evict(now)
		}
	}
	c.entries[sum] = entry[V]{holder: holder, group: group, expires: expires, value: v}
	c.held[holder] = append(c.held[holder], sum)
	if group != "" {
		c.groups[group] = append(c.groups[group], sum)
	}
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
	if e.group != "" {
		unlist(c.groups, e.group, sum)
	}
	e.group = group
	c.entries[sum] = e
	if group != "" {
		c.groups[group] = append(c.groups[group], sum)
	}
	return true
}

// Remove forgets sum, and its place in its holder's list.
func (c *Cache[V]) Remove(sum Sum) {
	e, ok := c.entries[sum]
	if !ok {
		return
	}
	delete(c.entries, sum)
	unlist(c.held, e.holder, sum)
	if e.group != "" {
		unlist(c.groups, e.group, sum)
	}
}

// unlist removes sum from m[k], and m[k] once empty.
func unlist(m map[string][]Sum, k string, sum Sum) {
	list := slices.DeleteFunc(m[k], func(s Sum) bool { return s == sum })
	if len(list) == 0 {
		delete(m, k)
		return
	}
	m[k] = list
}

// evict makes room: expired entries first, then the oldest of the groups
// holding more than their share, down to it, then arbitrary ones (map
// order), until a quarter of the cache is free. Without the second step a
// group that filled the cache while it was not full (the share is applied
// at a full cache) had every other group's arrival drop a quarter of the
// entries at random, others' among them, and filled the quarter again
// (rogue37b test).
func (c *Cache[V]) evict(now time.Time) {
	for sum, e := range c.entries {
		if !now.Before(e.expires) {
			c.Remove(sum)
		}
	}
	if c.groupShare > 0 {
		for group := range c.groups {
			for len(c.groups[group]) > c.groupShare && len(c.entries) > c.max*3/4 {
				c.Remove(c.groups[group][0])
			}
		}
	}
	for sum := range c.entries {
		if len(c.entries) <= c.max*3/4 {
			return
		}
		c.Remove(sum)
	}
}

// Held returns how many entries holder holds.
func (c *Cache[V]) Held(holder string) int { return len(c.held[holder]) }

// InGroup returns how many entries group holds.
func (c *Cache[V]) InGroup(group string) int { return len(c.groups[group]) }
