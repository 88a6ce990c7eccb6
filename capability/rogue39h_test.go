package capability

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"
)

// A rogue revoking grants it delegates, in a loop (two requests of its
// lineage's budget each), keeps as many tombstones live as it revokes in
// MaxTokenTTL + MaxLeeway, and each of its revocations is one Add on the
// control plane's set and on every verifier's following the whole feed.
// Add copied the whole set each time: 3.5 MB (and 14 ms on a loaded host)
// for one tombstone added to 100,000. It now copies what was added since
// the base was last rebuilt, about √n, and rebuilds the base once per √n
// additions.
func TestRogue39HAddingToALargeSetDoesNotCopyIt(t *testing.T) {
	const live, adds = 50_000, 500 // each round rebuilds the base at least twice
	now := time.Unix(1_700_000_000, 0)
	var s TombstoneSet
	flood := make([]Tombstone, live)
	for i := range flood {
		flood[i] = Tombstone{Sequence: uint64(i + 1), GrantID: fmt.Sprintf("g_rogue%019d", i), RevokedAt: now, DropAfter: DropAfter(now)}
	}
	if err := s.Add(flood...); err != nil {
		t.Fatal(err)
	}
	// The least of three measures: another goroutine's allocation (the
	// runtime's, the test framework's) only ever adds to one.
	least := ^uint64(0)
	seq := uint64(live)
	for round := range 3 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for i := range adds {
			seq++
			if err := s.Add(Tombstone{Sequence: seq, GrantID: fmt.Sprintf("g_more%d_%015d", round, i), RevokedAt: now, DropAfter: DropAfter(now)}); err != nil {
				t.Fatal(err)
			}
		}
		runtime.ReadMemStats(&after)
		least = min(least, (after.TotalAlloc-before.TotalAlloc)/adds)
	}
	t.Logf("adding one tombstone to %d allocated %d bytes (the least of three measures)", live, least)
	// A copy of 50,000 entries is over 1.5 MB; √50,000 of them some 10 KB.
	if least > 256<<10 {
		t.Fatalf("adding one tombstone to %d allocated %d bytes: the set is copied on each Add", live, least)
	}
	if got, want := s.Len(), live+3*adds; got != want {
		t.Fatalf("Len = %d, want %d", got, want)
	}
}

// The set answers as a plain map of merged tombstones does, across the
// rebuilds of its base, prunes and replacements.
func TestRogue39HTheSetAnswersAsOneMapDoes(t *testing.T) {
	rng := rand.New(rand.NewPCG(39, 8))
	base := time.Unix(1_700_000_000, 0)
	var s TombstoneSet
	model := map[string]Tombstone{}
	seq := uint64(0)
	ids := make([]string, 3000)
	for i := range ids {
		ids[i] = fmt.Sprintf("g_%022d", i)
	}
	check := func(step int) {
		t.Helper()
		if s.Len() != len(model) {
			t.Fatalf("step %d: Len = %d, model %d", step, s.Len(), len(model))
		}
		for range 50 {
			id := ids[rng.IntN(len(ids))]
			got, ok := s.Lookup(id)
			want, wantOK := model[id]
			if ok != wantOK || ok && (got.DropAfter != want.DropAfter || got.RevokedAt != want.RevokedAt || got.Sequence != want.Sequence) {
				t.Fatalf("step %d: Lookup(%s) = %+v %v, model %+v %v", step, id, got, ok, want, wantOK)
			}
			chain := []string{ids[rng.IntN(len(ids))], ids[rng.IntN(len(ids))]}
			via, revoked := s.Revoked(id, chain)
			wantVia := ""
			for _, c := range append(slices.Clone(chain), id) {
				if _, ok := model[c]; ok {
					wantVia = c
					break
				}
			}
			if revoked != (wantVia != "") || via != wantVia {
				t.Fatalf("step %d: Revoked(%s, %v) = %q %v, model %q", step, id, chain, via, revoked, wantVia)
			}
		}
		all := s.Tombstones()
		if len(all) != len(model) {
			t.Fatalf("step %d: Tombstones has %d, model %d", step, len(all), len(model))
		}
		for _, tb := range all {
			if model[tb.GrantID] != tb {
				t.Fatalf("step %d: Tombstones holds %+v, model %+v", step, tb, model[tb.GrantID])
			}
		}
	}
	for step := range 4000 {
		switch r := rng.IntN(100); {
		case r < 90:
			batch := make([]Tombstone, 1+rng.IntN(5))
			for i := range batch {
				seq++
				at := base.Add(time.Duration(rng.IntN(3600)) * time.Second)
				batch[i] = Tombstone{Sequence: seq, GrantID: ids[rng.IntN(len(ids))], RevokedAt: at, DropAfter: DropAfter(at).Add(time.Duration(rng.IntN(600)) * time.Second)}
			}
			if err := s.Add(batch...); err != nil {
				t.Fatal(err)
			}
			for _, tb := range batch {
				if old, ok := model[tb.GrantID]; ok {
					merged := old
					if merged.RevokedAt.After(tb.RevokedAt) {
						merged.RevokedAt, merged.Reason, merged.Sequence = tb.RevokedAt, tb.Reason, tb.Sequence
					}
					if tb.DropAfter.After(merged.DropAfter) {
						merged.DropAfter = tb.DropAfter
					}
					tb = merged
				}
				model[tb.GrantID] = tb
			}
		case r < 97:
			at := base.Add(time.Duration(rng.IntN(3600))*time.Second + MaxTokenTTL + MaxLeeway)
			dropped := s.Prune(at)
			want := 0
			for id, tb := range model {
				if at.After(tb.DropAfter) {
					delete(model, id)
					want++
				}
			}
			if dropped != want {
				t.Fatalf("step %d: Prune dropped %d, model %d", step, dropped, want)
			}
		default:
			keep := s.Tombstones()
			keep = keep[:len(keep)/2]
			if err := s.Replace(keep, seq); err != nil {
				t.Fatal(err)
			}
			model = map[string]Tombstone{}
			for _, tb := range keep {
				model[tb.GrantID] = tb
			}
		}
		if step%50 == 0 {
			check(step)
		}
	}
	check(4000)
}
