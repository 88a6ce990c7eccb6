package id

import (
	"strings"
	"testing"
)

// Kind names the kind of every well-formed id, and nothing for a string
// that is not one, without an allocation (it checks every spawn's name).
func TestKindRecognisesEachKindAndNothingElse(t *testing.T) {
	for kind := range names {
		s := New(kind)
		if got := Kind(s); got != kind {
			t.Errorf("Kind(%q) = %q; want %q", s, got, kind)
		}
		for _, bad := range []string{
			s[:len(s)-1],                        // one character short
			s + "a",                             // one too many
			strings.Replace(s, "_", "-", 1),     // no underscore
			s[:len(s)-1] + "u",                  // 'u' is not in the alphabet
			s[:len(s)-1] + "A",                  // nor capitals
			s[:len(s)-2] + "é",                  // nor non-ASCII (two bytes)
			"q_" + s[len(kind)+1:],              // no such kind
			kind + kind + "_" + s[len(kind)+2:], // the kind twice
		} {
			if got := Kind(bad); got != "" {
				t.Errorf("Kind(%q) = %q; want none", bad, got)
			}
		}
	}
	for _, name := range []string{"", "agent", "n_", "worker-7"} {
		if got := Kind(name); got != "" {
			t.Errorf("Kind(%q) = %q; want none", name, got)
		}
	}
	name := "agent"
	if allocs := testing.AllocsPerRun(100, func() { _ = Kind(name) }); allocs != 0 {
		t.Errorf("Kind of a name allocates %.0f times; want none", allocs)
	}
}

// TestKindIsTheOneKindWellFormed compares Kind with a walk over every kind
// (what it did before it looked up the one kind a string can be): ids of
// every kind, each with one byte changed anywhere, prefixed and cut, and
// strings of every length around an id's.
func TestKindIsTheOneKindWellFormed(t *testing.T) {
	walk := func(s string) string {
		for kind := range names {
			if wellFormed(kind, s) {
				return kind
			}
		}
		return ""
	}
	check := func(s string) {
		t.Helper()
		if got, want := Kind(s), walk(s); got != want {
			t.Fatalf("Kind(%q) = %q; a walk over the kinds finds %q", s, got, want)
		}
	}
	for kind := range names {
		s := New(kind)
		check(s)
		for i := range len(s) {
			for _, c := range []byte{'_', 'a', 'z', 'u', '0', '9', 'n', 'A', 0, 0xff} {
				b := []byte(s)
				b[i] = c
				check(string(b))
			}
			check(s[i:])
			check(s[:i])
			check("x" + s[i:])
		}
		for other := range names {
			check(other + s)
			check(other + "_" + s[len(kind)+1:])
		}
	}
	for n := range 40 {
		check(strings.Repeat("a", n))
		check(strings.Repeat("_", n))
		if n > 0 {
			check(strings.Repeat("n", n-1) + "_" + strings.Repeat("a", 20))
		}
	}
}
