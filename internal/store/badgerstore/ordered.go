package badgerstore

import (
	"slices"
	"strings"
)

// writeSet is the pending writes of an Update or of a batch: the latest
// mutation of each key, found by key in O(1) and in key order from any
// point in O(log n), so that a scan visits only the pending writes of its
// own range. Without the order a scan had to walk every pending write,
// which made a large Update (a termination marks and scans per node)
// quadratic.
type writeSet struct {
	byKey map[string]mutation
	order keyIndex
}

func newWriteSet() writeSet {
	return writeSet{byKey: make(map[string]mutation)}
}

func (w *writeSet) len() int { return len(w.byKey) }

func (w *writeSet) get(key string) (mutation, bool) {
	m, ok := w.byKey[key]
	return m, ok
}

func (w *writeSet) set(m mutation) {
	k := string(m.key)
	if _, ok := w.byKey[k]; !ok {
		w.order.insert(k)
	}
	w.byKey[k] = m
}

func (w *writeSet) remove(key string) {
	if _, ok := w.byKey[key]; ok {
		delete(w.byKey, key)
		w.order.remove(key)
	}
}

// ascend calls fn with the mutations whose keys start with prefix and are
// at least lower, in key order, until fn returns false.
func (w *writeSet) ascend(prefix, lower []byte, fn func(mutation) bool) {
	p := string(prefix)
	w.order.ascend(string(lower), func(k string) bool {
		if !strings.HasPrefix(k, p) {
			return false
		}
		return fn(w.byKey[k])
	})
}

// all calls fn with every mutation in key order.
func (w *writeSet) all(fn func(mutation)) {
	w.order.ascend("", func(k string) bool {
		fn(w.byKey[k])
		return true
	})
}

// keyIndex is an ordered set of strings kept as a list of sorted runs, each
// of at most 2*keyRun keys: an insert or removal moves at most one run's
// keys and finds its run by binary search, and an ordered walk from any key
// starts with two binary searches.
type keyIndex struct {
	runs [][]string
}

const keyRun = 256

// findRun returns the index of the run that holds or would hold k: the
// first run whose last key is at least k, or the last run.
func (x *keyIndex) findRun(k string) int {
	i, _ := slices.BinarySearchFunc(x.runs, k, func(run []string, k string) int {
		return strings.Compare(run[len(run)-1], k)
	})
	if i == len(x.runs) && i > 0 {
		i--
	}
	return i
}

func (x *keyIndex) insert(k string) {
	if len(x.runs) == 0 {
		x.runs = append(x.runs, []string{k})
		return
	}
	i := x.findRun(k)
	run := x.runs[i]
	j, found := slices.BinarySearch(run, k)
	if found {
		return
	}
	run = slices.Insert(run, j, k)
	if len(run) > 2*keyRun {
		// Split in two; the upper half gets its own backing array so the
		// lower half can grow in place.
		upper := slices.Clone(run[keyRun:])
		clear(run[keyRun:])
		run = run[:keyRun]
		x.runs = slices.Insert(x.runs, i+1, upper)
	}
	x.runs[i] = run
}

func (x *keyIndex) remove(k string) {
	if len(x.runs) == 0 {
		return
	}
	i := x.findRun(k)
	j, found := slices.BinarySearch(x.runs[i], k)
	if !found {
		return
	}
	x.runs[i] = slices.Delete(x.runs[i], j, j+1)
	if len(x.runs[i]) == 0 {
		x.runs = slices.Delete(x.runs, i, i+1)
	}
}

// ascend calls fn with the keys at least lower, in order, until fn returns
// false. fn must not change the index.
func (x *keyIndex) ascend(lower string, fn func(string) bool) {
	if len(x.runs) == 0 {
		return
	}
	i := x.findRun(lower)
	j, _ := slices.BinarySearch(x.runs[i], lower)
	for ; i < len(x.runs); i, j = i+1, 0 {
		for _, k := range x.runs[i][j:] {
			if !fn(k) {
				return
			}
		}
	}
}
