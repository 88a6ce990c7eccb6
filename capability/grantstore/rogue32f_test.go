package grantstore

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/tetherhq/tether/capability"
)

// TestRogue32FALineagesViewIsTheWholeFeedFiltered: the feed keeps each
// lineage's tombstones apart so that an agent's feed walks only its own;
// whatever the order of loads, additions (a sequence put again included)
// and prunes, each lineage's view reads as the whole feed filtered by
// lineage, with the whole feed's heads and snapshots.
func TestRogue32FALineagesViewIsTheWholeFeedFiltered(t *testing.T) {
	rng := rand.New(rand.NewPCG(32, 6))
	lineages := []string{"", "a", "b", "c"}
	tomb := func(seq uint64) capability.Tombstone {
		return capability.Tombstone{GrantID: fmt.Sprint("g", seq), Sequence: seq, Lineage: lineages[rng.IntN(len(lineages))]}
	}
	f := newFeed()
	var initial []capability.Tombstone
	for seq := uint64(1); seq <= 20; seq++ {
		initial = append(initial, tomb(seq))
	}
	f.reset(initial, 20, 0)
	next := uint64(21)
	for step := range 600 {
		switch op := rng.IntN(10); {
		case op < 5:
			f.add(tomb(next))
			next++
		case op < 7 && next > 1:
			f.add(tomb(1 + rng.Uint64N(next-1))) // put again, perhaps another lineage
		default:
			f.mu.Lock()
			oldest := uint64(0)
			if len(f.log) > 0 {
				oldest = f.log[0].Sequence
			}
			f.mu.Unlock()
			if oldest > 0 {
				f.remove(oldest)
			}
		}
		for _, after := range []uint64{0, next / 2, next} {
			all, snap, reachedAll, head, _ := f.read(WholeFeed(), after, 1<<20)
			for _, l := range lineages[1:] {
				got, lsnap, reached, lhead, _ := f.read(LineageFeed(l), after, 1<<20)
				var want []capability.Tombstone
				for _, t := range all {
					if t.Lineage == l {
						want = append(want, t)
					}
				}
				if !slices.Equal(got, want) || lsnap != snap || reached != reachedAll || lhead != head {
					t.Fatalf("step %d, after %d, lineage %q: %v snapshot=%v reached %d head %d; the whole feed filtered: %v snapshot=%v reached %d head %d",
						step, after, l, sequences(got), lsnap, reached, lhead, sequences(want), snap, reachedAll, head)
				}
			}
		}
	}
	if got, _, _, _, _ := f.read(LineageFeed(""), 0, 1<<20); len(got) != 0 {
		t.Fatalf("the lineage \"\" (no agent's) shows %v", sequences(got))
	}
}
