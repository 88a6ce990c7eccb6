package supervisor

import (
	"testing"
	"time"
)

// Forty-fourth hostile pass (letter E): the supervisor's termination path.

// TestRogue44EStopSinceAtKeepsTheFirstStop is the rule the mark applies to
// each node it marks or takes over (tree.Node.StopSince): the instant the
// node first came under a stop, which every take-over keeps, so a
// holder's word given under the first stop is its claim in the record of
// the last (the controlplane's rogue44e tests drive it through the
// server).
func TestRogue44EStopSinceAtKeepsTheFirstStop(t *testing.T) {
	at := func(s int) time.Time { return time.Date(2026, 3, 1, 12, 0, s, 0, time.UTC) }
	stop := func(id string, requested, marked int) Termination {
		t.Helper()
		term, err := NewTermination(id, "n_a", ModeDrain, time.Minute, time.Second, time.Minute, "", "operator:admin", at(requested))
		if err != nil {
			t.Fatal(err)
		}
		if marked > 0 {
			term, err = Advance(term, ActMark, Progress{}, at(marked))
			if err != nil {
				t.Fatal(err)
			}
		}
		return term
	}
	first, second := stop("t_first", 10, 11), stop("t_second", 30, 0)
	for _, c := range []struct {
		name       string
		since      time.Time
		t, owner   Termination
		takingOver bool
		now        time.Time
		want       time.Time
	}{
		{"a fresh mark: its request", time.Time{}, first, Termination{}, false, at(11), at(10)},
		{"a take-over keeps the node's first stop", at(10), second, first, true, at(31), at(10)},
		{"a node marked before it was kept: the stop it is taken from", time.Time{}, second, first, true, at(31), at(10)},
		{"a mark the reconciler's clock reads before the request (etcd)", time.Time{}, second, Termination{}, false, at(25), at(25)},
	} {
		if got := c.t.StopSinceAt(c.since, c.owner, c.takingOver, c.now); !got.Equal(c.want) {
			t.Errorf("%s: StopSinceAt = %s, want %s", c.name, got.Format(time.TimeOnly), c.want.Format(time.TimeOnly))
		}
	}
}
