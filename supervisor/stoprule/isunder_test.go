package stoprule

import (
	"testing"
)

// isUnder sorts every committed event the stop rules follow (a spawn's
// several among them): it must not allocate.
func TestIsUnder(t *testing.T) {
	for _, tc := range []struct {
		key, prefix string
		want        bool
	}{
		{"rules/grow/n_1", "rules/grow/", true},
		{"rules/grow/", "rules/grow/", true},
		{"rules/gro", "rules/grow/", false},
		{"rules/self/n_1", "rules/grow/", false},
		{"", "", true},
	} {
		if got := isUnder([]byte(tc.key), tc.prefix); got != tc.want {
			t.Errorf("isUnder(%q, %q) = %v, want %v", tc.key, tc.prefix, got, tc.want)
		}
	}
	key := []byte("rules/grow/n_0123456789abcdefghjk/7")
	if allocs := testing.AllocsPerRun(100, func() { _ = isUnder(key, "rules/grow/") }); allocs != 0 {
		t.Errorf("isUnder allocates %.0f times; want none", allocs)
	}
}
