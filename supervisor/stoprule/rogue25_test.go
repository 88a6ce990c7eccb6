package stoprule_test

import (
	"fmt"
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

// TestRogue25AFullToolMapReadsOtherHoweverItIsReached: once a rogue has
// filled calls_by_tool with harmless tools, its shell calls are counted
// under `other`, and a lookup of "shell" reads other's count
// (rogue22_test.go) — also when the map is reached by an optional
// selection, through a list, a map or a conditional. (It held.)
func TestRogue25AFullToolMapReadsOtherHoweverItIsReached(t *testing.T) {
	o := &stoprule.Observations{Calls: stoprule.MaxTools + 300, CallsByTool: map[string]int64{}}
	for i := range stoprule.MaxTools {
		o.CallsByTool[fmt.Sprintf("harmless-%02d", i)] = 1
	}
	o.CallsByTool[stoprule.OtherTool] = 300
	for _, e := range []string{
		`observed.?calls_by_tool.orValue({})[?"shell"].orValue(0) > 200`,
		`observed.calls_by_tool.?shell.orValue(0) > 200`,
		`[observed.calls_by_tool][0][?"shell"].orValue(0) > 200`,
		`{"m": observed.calls_by_tool}.m["shell"] > 200`,
		`(observed.calls > 0 ? observed.calls_by_tool : {})[?"shell"].orValue(0) > 200`,
		`"shell" in observed.?calls_by_tool.orValue({})`,
	} {
		c, err := stoprule.Compile(e)
		if err != nil {
			t.Fatalf("%s: %v", e, err)
		}
		if r := c.Evaluate(o, nil); !r.Fired || r.Err != nil {
			t.Errorf("%s: fired %v (%v) for a rogue with 300 calls under other", e, r.Fired, r.Err)
		}
	}
}
