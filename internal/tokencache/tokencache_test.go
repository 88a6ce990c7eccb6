package tokencache

import (
	"fmt"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)

func TestAHolderPushesOutOnlyItsOwnOldest(t *testing.T) {
	c := New[string](100, 2, 0)
	c.Put(Digest("honest"), "h", "", t0.Add(time.Hour), t0, "h1")
	for i := range 10 {
		c.Put(Digest(fmt.Sprint("rogue", i)), "r", "", t0.Add(time.Hour), t0, fmt.Sprint(i))
	}
	if c.Held("r") != 2 || c.Held("h") != 1 || c.Len() != 3 {
		t.Fatalf("rogue holds %d, honest %d, %d in all; want 2, 1, 3", c.Held("r"), c.Held("h"), c.Len())
	}
	if _, ok := c.Get(Digest("rogue7")); ok {
		t.Fatal("the rogue's third newest entry is still kept")
	}
	if v, ok := c.Get(Digest("rogue9")); !ok || v != "9" {
		t.Fatalf("the rogue's newest entry: %q, %v", v, ok)
	}
	if v, ok := c.Get(Digest("honest")); !ok || v != "h1" {
		t.Fatalf("the honest entry: %q, %v", v, ok)
	}
}

func TestAFullCacheEvictsExpiredEntriesFirst(t *testing.T) {
	c := New[int](8, 8, 0)
	for i := range 4 {
		c.Put(Digest(fmt.Sprint("live", i)), fmt.Sprint("live", i), "", t0.Add(time.Hour), t0, i)
		c.Put(Digest(fmt.Sprint("dead", i)), fmt.Sprint("dead", i), "", t0.Add(time.Minute), t0, i)
	}
	c.Put(Digest("new"), "new", "", t0.Add(2*time.Hour), t0.Add(30*time.Minute), 9)
	for i := range 4 {
		if _, ok := c.Get(Digest(fmt.Sprint("live", i))); !ok {
			t.Fatalf("live entry %d evicted while expired ones were kept", i)
		}
		if _, ok := c.Get(Digest(fmt.Sprint("dead", i))); ok {
			t.Fatalf("expired entry %d kept", i)
		}
	}
	if c.Len() != 5 {
		t.Fatalf("%d entries, want 5", c.Len())
	}
}

func TestAFullCacheOfLiveEntriesFreesAQuarter(t *testing.T) {
	c := New[int](8, 8, 0)
	for i := range 8 {
		c.Put(Digest(fmt.Sprint(i)), fmt.Sprint("holder", i), "", t0.Add(time.Hour), t0, i)
	}
	c.Put(Digest("new"), "new", "", t0.Add(time.Hour), t0, 9)
	if c.Len() != 7 { // 8 → 6, and the new one
		t.Fatalf("%d entries, want 7", c.Len())
	}
	if _, ok := c.Get(Digest("new")); !ok {
		t.Fatal("the new entry is not kept")
	}
}

func TestUpdateAndRemoveKeepTheHoldersListTrue(t *testing.T) {
	c := New[int](8, 2, 0)
	if c.Update(Digest("a"), 1) {
		t.Fatal("Update kept a value for a sum never put")
	}
	c.Put(Digest("a"), "h", "", t0.Add(time.Hour), t0, 1)
	c.Put(Digest("b"), "h", "", t0.Add(time.Hour), t0, 2)
	if !c.Update(Digest("a"), 3) {
		t.Fatal("Update found no entry")
	}
	c.Put(Digest("a"), "h", "", t0.Add(time.Hour), t0, 4) // put again: a is now the newest
	c.Put(Digest("c"), "h", "", t0.Add(time.Hour), t0, 5) // pushes out b, the oldest
	if _, ok := c.Get(Digest("b")); ok {
		t.Fatal("b kept: putting a again did not make it the newest")
	}
	if v, _ := c.Get(Digest("a")); v != 4 {
		t.Fatalf("a = %d, want 4", v)
	}
	c.Remove(Digest("a"))
	c.Remove(Digest("c"))
	if c.Held("h") != 0 || c.Len() != 0 || len(c.held) != 0 {
		t.Fatalf("after removing all: held %d, len %d, holders %d", c.Held("h"), c.Len(), len(c.held))
	}
}

func TestAFullCacheTakesAGroupPastItsShareInPlaceOfItsOwnOldest(t *testing.T) {
	c := New[int](8, 1, 4)
	for i := range 4 {
		c.Put(Digest(fmt.Sprint("honest", i)), fmt.Sprint("honest", i), fmt.Sprint("lineage", i), t0.Add(time.Hour), t0, i)
	}
	for i := range 100 { // a rogue lineage's children, one token each
		c.Put(Digest(fmt.Sprint("rogue", i)), fmt.Sprint("child", i), "rogue", t0.Add(time.Hour), t0, i)
	}
	for i := range 4 {
		if _, ok := c.Get(Digest(fmt.Sprint("honest", i))); !ok {
			t.Fatalf("honest lineage %d pushed out by a rogue lineage past its share", i)
		}
	}
	if n := c.InGroup("rogue"); n != 4 {
		t.Fatalf("the rogue lineage holds %d entries, want its share, 4", n)
	}
	if _, ok := c.Get(Digest("rogue99")); !ok {
		t.Fatal("the rogue's newest token is not kept")
	}
	c.Remove(Digest("rogue99"))
	if n := c.InGroup("rogue"); n != 3 {
		t.Fatalf("after a removal the rogue lineage holds %d, want 3", n)
	}
}

// TestRogue37BAGroupPastItsShareIsTrimmedBeforeOthersAreEvicted: a group
// may fill the cache while it is not full (the share is applied when it
// is), and then every token of another group arriving at a full cache
// made room by dropping a quarter of the entries at random, others'
// among them; the rogue filled the quarter again, and the next honest
// arrival dropped another quarter. Room is now made from the groups past
// their share first, their oldest going.
func TestRogue37BAGroupPastItsShareIsTrimmedBeforeOthersAreEvicted(t *testing.T) {
	c := New[int](64, 1, 8)
	for i := range 8 {
		c.Put(Digest(fmt.Sprint("honest", i)), fmt.Sprint("honest", i), fmt.Sprint("lineage", i), t0.Add(time.Hour), t0, i)
	}
	next := 0
	for round := range 10 {
		for c.Len() < 64 { // the rogue's children fill the cache
			c.Put(Digest(fmt.Sprint("rogue", next)), fmt.Sprint("child", next), "rogue", t0.Add(time.Hour), t0, next)
			next++
		}
		// An honest lineage's new agent.
		c.Put(Digest(fmt.Sprint("new", round)), fmt.Sprint("new", round), fmt.Sprint("newlineage", round), t0.Add(time.Hour), t0, round)
		if _, ok := c.Get(Digest(fmt.Sprint("rogue", next-1))); !ok {
			t.Errorf("round %d: the rogue's newest entry went before its older ones", round)
		}
	}
	for i := range 8 {
		if _, ok := c.Get(Digest(fmt.Sprint("honest", i))); !ok {
			t.Errorf("honest lineage %d's entry was evicted while a rogue group held more than its share", i)
		}
	}
	for round := range 10 {
		if _, ok := c.Get(Digest(fmt.Sprint("new", round))); !ok {
			t.Errorf("round %d's honest arrival was evicted while a rogue group held more than its share", round)
		}
	}
}

// TestRogue37BSetGroupMovesAnEntryIntoItsGroupsShare: an entry whose
// group is learnt after it was kept (an agent's lineage, read from its
// node once its token verified) counts in that group from then on, and
// leaves the group it was kept in.
func TestRogue37BSetGroupMovesAnEntryIntoItsGroupsShare(t *testing.T) {
	c := New[int](8, 1, 2)
	if c.SetGroup(Digest("none"), "g") {
		t.Fatal("SetGroup moved an entry never kept")
	}
	for i := range 4 {
		c.Put(Digest(fmt.Sprint("a", i)), fmt.Sprint("holder", i), "unplaced", t0.Add(time.Hour), t0, i)
	}
	for i := range 4 {
		if !c.SetGroup(Digest(fmt.Sprint("a", i)), "rogue") {
			t.Fatalf("SetGroup found no entry %d", i)
		}
	}
	if c.InGroup("unplaced") != 0 || c.InGroup("rogue") != 4 {
		t.Fatalf("after moving: %d unplaced, %d in the rogue's group; want 0 and 4", c.InGroup("unplaced"), c.InGroup("rogue"))
	}
	for i := range 4 {
		c.Put(Digest(fmt.Sprint("h", i)), fmt.Sprint("honest", i), fmt.Sprint("lineage", i), t0.Add(time.Hour), t0, i)
	}
	// Full: another lineage's arrival trims the rogue's group to its
	// share, which frees the quarter.
	c.Put(Digest("new"), "new", "newlineage", t0.Add(time.Hour), t0, 9)
	if n := c.InGroup("rogue"); n != 2 {
		t.Errorf("the rogue's group holds %d at a full cache, want its share of 2", n)
	}
	for i := range 4 {
		if _, ok := c.Get(Digest(fmt.Sprint("h", i))); !ok {
			t.Errorf("honest entry %d evicted while the rogue's group held more than its share", i)
		}
	}
	for i, kept := range []bool{false, false, true, true} {
		if _, ok := c.Get(Digest(fmt.Sprint("a", i))); ok != kept {
			t.Errorf("the rogue's entry %d kept: %v, want %v (its oldest go first)", i, ok, kept)
		}
	}
}
