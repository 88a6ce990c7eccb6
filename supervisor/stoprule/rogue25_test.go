package stoprule_test

import (
	"testing"

	"github.com/tetherhq/tether/supervisor/stoprule"
)

// TestRogue25WhatARuleReadsIsFoundHoweverItIsWritten: the evaluator
// fetches the leases and revocations, and polls on the clock, for the
// rules found to read them. A field selected optionally is found; an
// `observed` held in a list or a map, where the fields read cannot be
// told, counts as reading every one; a rule reading neither stays cheap.
func TestRogue25WhatARuleReadsIsFoundHoweverItIsWritten(t *testing.T) {
	for _, c := range []struct {
		expression                string
		time, leases, revocations bool
	}{
		{`observed.leases_held > 0`, false, true, false},
		{`observed.?leases_held.orValue(0) > 0`, false, true, false},
		{`observed.?leases_by_state.orValue({})["active"] > 0`, false, true, false},
		{`observed.?age_seconds.orValue(0.0) > 10.0`, true, false, false},
		{`observed.?revocations.orValue(0) > 0`, false, false, true},
		{`has(observed.leases_held) && observed.calls > 1`, false, true, false},
		{`[observed][0].calls > 0`, true, true, true},
		{`{"o": observed}["o"].calls > 0`, true, true, true},
		{`observed.calls > 1 && self_reported.?cost.orValue(0.0) > 1.0`, false, false, false},
	} {
		compiled, err := stoprule.Compile(c.expression)
		if err != nil {
			t.Fatalf("%s: %v", c.expression, err)
		}
		if compiled.UsesTime != c.time || compiled.UsesLeases != c.leases || compiled.UsesRevocations != c.revocations {
			t.Errorf("%s: time %v leases %v revocations %v, want %v %v %v", c.expression,
				compiled.UsesTime, compiled.UsesLeases, compiled.UsesRevocations, c.time, c.leases, c.revocations)
		}
	}
}
