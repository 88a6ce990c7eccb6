package coordinator

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestRogue40CFirstJobsKeepsThePagesJobs: what a shard keeps for a page
// (firstJobs) is the first n of the ids it walked, in order, whatever
// order it walked them in; every one of them when n is 0.
func TestRogue40CFirstJobsKeepsThePagesJobs(t *testing.T) {
	r := rand.New(rand.NewPCG(40, 3))
	for round := range 200 {
		ids := make([]string, r.IntN(60))
		for i := range ids {
			ids[i] = fmt.Sprintf("job-%04d", r.IntN(10000))
		}
		slices.Sort(ids)
		ids = slices.Compact(ids)
		walk := slices.Clone(ids)
		r.Shuffle(len(walk), func(i, j int) { walk[i], walk[j] = walk[j], walk[i] })
		n := r.IntN(len(ids) + 3)
		first := newFirstJobs(n, func(s string) string { return s })
		for _, id := range walk {
			first.offer(id)
		}
		want := ids
		if n > 0 && n < len(ids) {
			want = ids[:n]
		}
		if got := first.sorted(); !slices.Equal(got, want) {
			t.Fatalf("round %d: kept %v of %d ids (n %d), want %v", round, got, len(ids), n, want)
		}
	}
}
