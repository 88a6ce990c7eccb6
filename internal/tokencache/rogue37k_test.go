package tokencache

import (
	"fmt"
	"testing"
	"time"
)

// TestRogue37KAGroupsEntriesGoAtAConstantCostEach: a rogue lineage whose
// children each present their tokens fills the cache with its group (it
// may, while the cache is not full); every entry of its group that goes
// afterwards (trimmed to its share at another's arrival, replaced by its
// own newest at a full cache, expired together) must cost a bounded
// number of steps of the cache's bookkeeping, not a walk of the group's
// whole list: under the control plane's one lock around the cache, a walk
// per entry (16,384 of them by default) stalled every caller's
// authentication for the rogue's whole group squared.
func TestRogue37KAGroupsEntriesGoAtAConstantCostEach(t *testing.T) {
	const max, share = 4096, 512
	c := New[int](max, 4, share)
	puts := 0
	put := func(token, holder, group string, expires, now time.Time) {
		c.Put(Digest(token), holder, group, expires, now, 0)
		puts++
	}
	// The rogue's children fill the cache with their group's tokens, each
	// expiring within the minute.
	for i := range max {
		put(fmt.Sprint("rogue", i), fmt.Sprint("child", i/4), "rogue", t0.Add(time.Minute), t0)
	}
	// An honest arrival trims the rogue's group.
	put("honest0", "honest0", "lineage0", t0.Add(time.Hour), t0)
	if n := c.InGroup("rogue"); n >= max {
		t.Fatalf("the rogue's group still holds %d", n)
	}
	// The rogue's next tokens, at a full cache, each replace its own
	// oldest.
	for i := range 2 * max {
		put(fmt.Sprint("rogue-more", i), fmt.Sprint("child", max+i/4), "rogue", t0.Add(time.Minute), t0)
	}
	// Its entries expire together; the next honest arrival drops them.
	put("honest1", "honest1", "lineage1", t0.Add(time.Hour), t0.Add(2*time.Minute))
	if n := c.InGroup("rogue"); n != 0 {
		t.Fatalf("the rogue's expired group still holds %d", n)
	}
	if _, ok := c.Get(Digest("honest0")); !ok {
		t.Fatal("the honest entry was evicted")
	}
	// Entries moved between groups and removed keep the counts true.
	for i := range 64 {
		put(fmt.Sprint("late", i), fmt.Sprint("late", i), "unplaced", t0.Add(time.Hour), t0.Add(2*time.Minute))
		c.SetGroup(Digest(fmt.Sprint("late", i)), fmt.Sprint("lineage", i%3))
		if i%2 == 0 {
			c.Remove(Digest(fmt.Sprint("late", i)))
		}
	}
	counts := map[string]int{}
	for _, e := range c.entries {
		counts[e.group]++
	}
	for group, g := range c.groups {
		if g.live != counts[group] {
			t.Errorf("group %q counts %d, holds %d", group, g.live, counts[group])
		}
	}
	for group, n := range counts {
		if group != "" && c.InGroup(group) != n {
			t.Errorf("InGroup(%q) = %d, holds %d", group, c.InGroup(group), n)
		}
	}
	if bound := 16 * puts; c.steps > bound {
		t.Fatalf("%d puts looked at %d list entries (more than %d): a removal walks its group's list", puts, c.steps, bound)
	}
}
