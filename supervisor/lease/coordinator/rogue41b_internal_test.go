package coordinator

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestRogue41BJobOrderKeepsAHoldersJobsInOrder: a holder's index
// (jobOrder) holds exactly the jobs added and not removed since, and
// yields those after any id in order, through adds and removes in any
// order that split its blocks and empty them.
func TestRogue41BJobOrderKeepsAHoldersJobsInOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 2))
	for round := range 50 {
		x := holderIndex{}
		want := map[string]*entry{}
		ids := 1 + r.IntN(3*maxJobBlock)
		for step := range 2000 {
			job := fmt.Sprintf("job-%04d", r.IntN(ids))
			if r.IntN(3) == 0 {
				if e := want[job]; e != nil {
					x.remove("h", e)
					delete(want, job)
				}
			} else {
				e := &entry{job: job}
				x.add("h", e)
				want[job] = e
			}
			if step%97 != 0 {
				continue
			}
			sorted := slices.Sorted(maps.Keys(want))
			for _, e := range want {
				if !x.has("h", e) {
					t.Fatalf("round %d step %d: job %s is not found", round, step, e.job)
				}
			}
			after := fmt.Sprintf("job-%04d", r.IntN(ids+1))
			if r.IntN(4) == 0 {
				after = ""
			}
			var got []string
			for e := range x.after("h", after) {
				if want[e.job] != e {
					t.Fatalf("round %d step %d: yielded %s, not the entry filed", round, step, e.job)
				}
				got = append(got, e.job)
			}
			i, _ := slices.BinarySearch(sorted, after)
			if i < len(sorted) && sorted[i] == after {
				i++
			}
			if !slices.Equal(got, sorted[i:]) {
				t.Fatalf("round %d step %d: after %q yielded %d jobs, want %d in order", round, step, after, len(got), len(sorted[i:]))
			}
			if n := len(want); (n == 0) != (x["h"] == nil) || (n > 0 && x["h"].n != n) {
				t.Fatalf("round %d step %d: the index counts %v, want %d", round, step, x["h"], n)
			}
		}
	}
}
