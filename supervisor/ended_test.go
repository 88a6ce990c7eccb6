package supervisor

import (
	"slices"
	"strconv"
	"testing"
)

// TestEndedCallsSkipsOnlyWhatWasSeenEnded: the reconciler skips reading
// a call only once it saw it ended; the others stay, in order; and the
// set, when full, starts afresh rather than grow (a forgotten call is
// read again, which is all it costs).
func TestEndedCallsSkipsOnlyWhatWasSeenEnded(t *testing.T) {
	var e endedCalls
	ids := []string{"c_a", "c_b", "c_c", "c_d"}
	if got := e.open(ids); !slices.Equal(got, ids) {
		t.Fatalf("nothing seen ended, open = %v", got)
	}
	e.remember([]string{"c_b", "c_d"})
	if got := e.open(ids); !slices.Equal(got, []string{"c_a", "c_c"}) {
		t.Fatalf("after c_b and c_d ended, open = %v", got)
	}
	if !slices.Equal(ids, []string{"c_a", "c_b", "c_c", "c_d"}) {
		t.Fatalf("open changed its argument: %v", ids)
	}
	var many []string
	for i := range maxEndedCalls {
		many = append(many, "c_"+strconv.Itoa(i))
	}
	e.remember(many)
	if n := len(e.ids); n > maxEndedCalls {
		t.Fatalf("the set holds %d calls, bound %d", n, maxEndedCalls)
	}
	if got := e.open([]string{"c_b"}); !slices.Equal(got, []string{"c_b"}) {
		t.Fatalf("a full set started afresh, yet c_b is still skipped: %v", got)
	}
}
