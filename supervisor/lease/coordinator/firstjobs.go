package coordinator

import (
	"slices"
	"strings"
)

// firstJobs keeps, of the jobs a shard walks to answer a page of a
// listing, the n whose ids sort first (all of them when n is 0 or less):
// the page's, and the one after that tells the merge another page
// follows. A holder's finished jobs stay under it for ever (its record
// and evidence keep them), and a page that copied and sorted every one of
// them after its start, on the goroutine that judges every tree's jobs on
// the shard, cost a rogue that listed its own leases a page of one at a
// time as much as all of them (rogue40c test). Since the forty-first pass
// the walk visits each holder's jobs in order from the page's start
// (holderIndex) and stops at the n-th it keeps; firstJobs merges the
// holders' of a page of several.
type firstJobs[T any] struct {
	n  int
	id func(T) string
	// kept is, while n > 0, a heap whose root has the greatest id kept.
	kept []T
}

func newFirstJobs[T any](n int, id func(T) string) *firstJobs[T] {
	return &firstJobs[T]{n: n, id: id}
}

// offer keeps x if it is among the first n seen so far.
func (f *firstJobs[T]) offer(x T) {
	switch {
	case f.n <= 0:
		f.kept = append(f.kept, x)
	case len(f.kept) < f.n:
		f.kept = append(f.kept, x)
		f.up(len(f.kept) - 1)
	case f.id(x) < f.id(f.kept[0]):
		f.kept[0] = x
		f.down(0)
	}
}

// sorted returns what was kept, in order of job id.
func (f *firstJobs[T]) sorted() []T {
	slices.SortFunc(f.kept, func(a, b T) int { return strings.Compare(f.id(a), f.id(b)) })
	return f.kept
}

func (f *firstJobs[T]) less(i, j int) bool { return f.id(f.kept[i]) > f.id(f.kept[j]) }

func (f *firstJobs[T]) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !f.less(i, p) {
			return
		}
		f.kept[i], f.kept[p] = f.kept[p], f.kept[i]
		i = p
	}
}

func (f *firstJobs[T]) down(i int) {
	for {
		top, l, r := i, 2*i+1, 2*i+2
		if l < len(f.kept) && f.less(l, top) {
			top = l
		}
		if r < len(f.kept) && f.less(r, top) {
			top = r
		}
		if top == i {
			return
		}
		f.kept[i], f.kept[top] = f.kept[top], f.kept[i]
		i = top
	}
}
