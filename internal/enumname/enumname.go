// Package enumname names the values of the domain packages' enums: each
// enum keeps a table of its names, indexed by value, and its String method
// reads it here, so that every enum falls back the same way for a value the
// table does not name.
package enumname

import "strconv"

// Integer is any enum's underlying kind.
type Integer interface {
	~int | ~int8 | ~int16 | ~int32 | ~int64 | ~uint | ~uint8 | ~uint16 | ~uint32 | ~uint64
}

// Of is names[v]; for a value outside the table or at a gap in it, v's
// number, written "unknown(N)" when unknown is set and "N" when it is empty
// (as protobuf writes an enum value it does not know).
func Of[T Integer](names []string, v T, unknown string) string {
	if i := uint64(v); v >= 0 && i < uint64(len(names)) && names[i] != "" {
		return names[i]
	}
	n := strconv.FormatInt(int64(v), 10)
	if unknown == "" {
		return n
	}
	return unknown + "(" + n + ")"
}
