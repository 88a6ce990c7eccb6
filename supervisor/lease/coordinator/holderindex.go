package coordinator

import (
	"iter"
	"slices"
	"sort"
	"strings"
)

// holderIndex is a shard's jobs by holder identity (held: of the durable
// lease; judged: of the pending one), each holder's in order of job id, so
// that a page of a holder's jobs starts at its cursor and visits only the
// jobs it keeps. A holder's finished jobs stay under it for ever (its
// record and evidence keep them): until the forty-first pass each holder's
// were a map, and every page walked all of them after its start, on the
// goroutine that judges every tree's jobs on the shard (rogue41b test).
type holderIndex map[string]*jobOrder

// add files e under holder.
func (x holderIndex) add(holder string, e *entry) {
	jobs := x[holder]
	if jobs == nil {
		jobs = &jobOrder{}
		x[holder] = jobs
	}
	jobs.add(e)
}

// remove takes e out from under holder, and the holder with its last job.
func (x holderIndex) remove(holder string, e *entry) {
	if jobs := x[holder]; jobs != nil {
		jobs.remove(e)
		if jobs.n == 0 {
			delete(x, holder)
		}
	}
}

// has reports whether e is filed under holder.
func (x holderIndex) has(holder string, e *entry) bool {
	jobs := x[holder]
	if jobs == nil {
		return false
	}
	b, i, found := jobs.search(e.job)
	return found && jobs.blocks[b][i] == e
}

// after yields holder's jobs whose ids sort after job, in order.
func (x holderIndex) after(holder, job string) iter.Seq[*entry] {
	return func(yield func(*entry) bool) {
		if jobs := x[holder]; jobs != nil {
			jobs.after(job, yield)
		}
	}
}

// maxJobBlock is how many jobs a block of a jobOrder holds before it is
// split in two.
const maxJobBlock = 128

// jobOrder is one holder's jobs in order of job id: sorted blocks of at
// most maxJobBlock, each non-empty, the blocks in order. A page finds its
// start by two binary searches; adding or removing a job moves at most a
// block's entries and the list of blocks.
type jobOrder struct {
	blocks [][]*entry
	n      int
}

// search finds job: its block and place there, or where it would go.
func (o *jobOrder) search(job string) (b, i int, found bool) {
	b = sort.Search(len(o.blocks), func(k int) bool {
		blk := o.blocks[k]
		return blk[len(blk)-1].job >= job
	})
	if b == len(o.blocks) {
		return b, 0, false
	}
	i, found = slices.BinarySearchFunc(o.blocks[b], job, func(e *entry, job string) int { return strings.Compare(e.job, job) })
	return b, i, found
}

// add files e, in place of the entry of the same job if there is one.
func (o *jobOrder) add(e *entry) {
	b, i, found := o.search(e.job)
	if found {
		o.blocks[b][i] = e
		return
	}
	o.n++
	if b == len(o.blocks) {
		if b == 0 {
			o.blocks = append(o.blocks, []*entry{e})
			return
		}
		b--
		i = len(o.blocks[b])
	}
	blk := slices.Insert(o.blocks[b], i, e)
	if len(blk) > maxJobBlock {
		half := len(blk) / 2
		right := slices.Clone(blk[half:])
		clear(blk[half:])
		blk = blk[:half]
		o.blocks = slices.Insert(o.blocks, b+1, right)
	}
	o.blocks[b] = blk
}

// remove takes e's job out, if it is filed.
func (o *jobOrder) remove(e *entry) {
	b, i, found := o.search(e.job)
	if !found {
		return
	}
	o.n--
	if blk := slices.Delete(o.blocks[b], i, i+1); len(blk) > 0 {
		o.blocks[b] = blk
		return
	}
	o.blocks = slices.Delete(o.blocks, b, b+1)
}

// after calls yield with each job whose id sorts after job, in order,
// until it returns false.
func (o *jobOrder) after(job string, yield func(*entry) bool) {
	b := sort.Search(len(o.blocks), func(k int) bool {
		blk := o.blocks[k]
		return blk[len(blk)-1].job > job
	})
	for first := true; b < len(o.blocks); b, first = b+1, false {
		blk := o.blocks[b]
		i := 0
		if first {
			i = sort.Search(len(blk), func(k int) bool { return blk[k].job > job })
		}
		for ; i < len(blk); i++ {
			if !yield(blk[i]) {
				return
			}
		}
	}
}
