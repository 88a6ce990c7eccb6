// Package sortedmap renders a map in the order of its keys, so that what a
// person reads (a selector, labels, counts) is the same on every run.
package sortedmap

import (
	"maps"
	"slices"
	"strings"
)

// Join formats m's entries with pair in the order of their keys, joined by
// sep; empty when m has none.
func Join[V any](m map[string]V, empty, sep string, pair func(k string, v V) string) string {
	if len(m) == 0 {
		return empty
	}
	parts := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, pair(k, m[k]))
	}
	return strings.Join(parts, sep)
}
