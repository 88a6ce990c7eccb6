package sortedmap

import (
	"fmt"
	"testing"
)

func TestJoin(t *testing.T) {
	pair := func(k, v string) string { return k + "=" + v }
	if got := Join(map[string]string{"b": "2", "a": "1", "c": "3"}, "-", ",", pair); got != "a=1,b=2,c=3" {
		t.Errorf("Join = %q, want a=1,b=2,c=3", got)
	}
	if got := Join(map[string]string{}, "-", ",", pair); got != "-" {
		t.Errorf("an empty map joins to %q, want -", got)
	}
	if got := Join[string](nil, "", ",", pair); got != "" {
		t.Errorf("a nil map joins to %q, want nothing", got)
	}
	count := func(k string, n int) string { return fmt.Sprintf("%d %s", n, k) }
	if got := Join(map[string]int{"shell": 2, "http": 1}, "none", ", ", count); got != "1 http, 2 shell" {
		t.Errorf("Join = %q, want 1 http, 2 shell", got)
	}
}
