// Package enumtest pins a domain enum to the tether.v1 enum it is stored
// and sent as, for the enums' tests: one check instead of a loop in each.
package enumtest

import (
	"strconv"
	"testing"
)

// Pin checks that the enum's String (str) names every value of the
// generated enum as tether.v1 does (names is the generated <Enum>_name
// map), that the enum names no more values than tether.v1 has (count, the
// number of names its table holds; negative to skip), and that a value
// tether.v1 does not know reads as its number, as tether.v1 writes it.
func Pin(t testing.TB, enum string, names map[int32]string, count int, str func(int32) string) {
	t.Helper()
	if count >= 0 && count != len(names) {
		t.Errorf("%s has %d names, tether.v1 has %d", enum, count, len(names))
	}
	for v, want := range names {
		if got := str(v); got != want {
			t.Errorf("%s(%d).String() = %q, want %q", enum, v, got, want)
		}
	}
	if got := str(99); got != strconv.Itoa(99) {
		t.Errorf("%s(99) reads %q, want its number", enum, got)
	}
}
