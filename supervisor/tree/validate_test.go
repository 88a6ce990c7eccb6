package tree

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
)

// The patterns a node's name and labels were checked with before the
// hand-written checks (tree.go); the checks must accept exactly these.
var (
	namePatternRef     = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)
	labelKeyPatternRef = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._/-]{0,61}[A-Za-z0-9])?$`)
	labelValPatternRef = regexp.MustCompile(`^[A-Za-z0-9._-]{0,63}$`)
)

// TestValidNamesMatchTheirPatterns compares validName, validLabelKey and
// validLabelValue with the regular expressions they replace: every string
// of up to three bytes over an alphabet with each class's edges and its
// neighbours, strings at and around the length bounds, and random ones.
func TestValidNamesMatchTheirPatterns(t *testing.T) {
	const alphabet = "aAzZ09._-/ \n$^@[`{:\x00\x7f\xff\xc3\xa9"
	check := func(s string) {
		t.Helper()
		if got, want := validName(s), namePatternRef.MatchString(s); got != want {
			t.Fatalf("validName(%q) = %v, the pattern says %v", s, got, want)
		}
		if got, want := validLabelKey(s), labelKeyPatternRef.MatchString(s); got != want {
			t.Fatalf("validLabelKey(%q) = %v, the pattern says %v", s, got, want)
		}
		if got, want := validLabelValue(s), labelValPatternRef.MatchString(s); got != want {
			t.Fatalf("validLabelValue(%q) = %v, the pattern says %v", s, got, want)
		}
	}
	check("")
	for i := range len(alphabet) {
		check(alphabet[i : i+1])
		for j := range len(alphabet) {
			check(alphabet[i:i+1] + alphabet[j:j+1])
			for k := range len(alphabet) {
				check(alphabet[i:i+1] + alphabet[j:j+1] + alphabet[k:k+1])
			}
		}
	}
	for n := 60; n <= 66; n++ {
		for _, mid := range []string{"a", ".", "/", "-", "_", " "} {
			for _, first := range []string{"a", "9", ".", "/"} {
				for _, last := range []string{"a", "9", ".", "/", "-", "\n"} {
					check(first + strings.Repeat(mid, n-2) + last)
				}
			}
		}
	}
	r := rand.New(rand.NewPCG(34, 8))
	for range 200000 {
		b := make([]byte, r.IntN(70))
		for i := range b {
			if r.IntN(20) == 0 {
				b[i] = alphabet[r.IntN(len(alphabet))]
			} else {
				b[i] = "abcXYZ019._-/"[r.IntN(13)]
			}
		}
		check(string(b))
	}
}
