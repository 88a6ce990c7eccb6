package tokencache

import (
	"fmt"
	"testing"
	"time"
)

// TestRogue38BALineageJustUnderItsShareCannotDropOthersEntriesAtRandom:
// a full cache in which no lineage holds more than its share — a rogue's
// lineage just under it, sixteen honest lineages with a few each, the
// rest of no lineage yet known — takes a token of a lineage below its
// share by making room. Until the thirty-eighth pass that room was a
// quarter of the cache dropped at random (map order), every honest
// lineage's entries among them, each costing its owner a verification at
// its next call, as often as the rogue presented a token at a full
// cache. Now the largest lineages lose their oldest first, down to a
// common level: the rogue's, not the honest ones, which keep every entry.
func TestRogue38BALineageJustUnderItsShareCannotDropOthersEntriesAtRandom(t *testing.T) {
	const max, share = 256, 64
	c := New[int](max, 4, share)
	put := func(token, holder, group string) {
		c.Put(Digest(token), holder, group, t0.Add(time.Hour), t0, 0)
	}
	// Sixteen honest lineages, four tokens each (64).
	for l := range 16 {
		for i := range 4 {
			put(fmt.Sprint("honest", l, "-", i), fmt.Sprint("honest", l, "-node", i), fmt.Sprint("lineage", l))
		}
	}
	// Operators and tool servers, no lineage (64).
	for i := range 64 {
		put(fmt.Sprint("operator", i), fmt.Sprint("operator", i/4), "")
	}
	// The rogue's children, one under its share (63), and more lineages
	// of its own making, each under the share (65), fill the cache.
	for i := range share - 1 {
		put(fmt.Sprint("rogue", i), fmt.Sprint("child", i/4), "rogue")
	}
	for i := range max - c.Len() {
		put(fmt.Sprint("rogue2-", i), fmt.Sprint("rogue2-child", i/4), "rogue2")
	}
	if c.Len() != max {
		t.Fatalf("the cache holds %d, want it full (%d)", c.Len(), max)
	}
	// The rogue presents tokens of its own at a full cache, again and
	// again, each room made filled again by its lineages.
	for round := range 8 {
		put(fmt.Sprint("rogue-new", round), fmt.Sprint("child-new", round), "rogue")
		for i := 0; c.Len() < max; i++ {
			put(fmt.Sprint("rogue2-more", round, "-", i), fmt.Sprint("rogue2-child-more", round, i/4), "rogue2")
		}
	}
	lost := 0
	for l := range 16 {
		for i := range 4 {
			if _, ok := c.Get(Digest(fmt.Sprint("honest", l, "-", i))); !ok {
				lost++
			}
		}
	}
	if lost > 0 {
		t.Fatalf("the honest lineages lost %d of their 64 entries to the rogue's arrivals at a full cache", lost)
	}
	for i := range 64 {
		if _, ok := c.Get(Digest(fmt.Sprint("operator", i))); !ok {
			t.Fatalf("an operator's entry (%d) was dropped while the rogue's lineages held more", i)
		}
	}
}
