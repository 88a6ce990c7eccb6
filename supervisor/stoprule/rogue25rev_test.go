package stoprule_test

import (
	"testing"

	"github.com/tetherhq/tether/supervisor/stoprule"
)

// TestRogue25ReviewEveryOtherWayOfReachingObservedReadsAll: beside the
// forms the pass found (observed.?f, has(), a list or a map), `observed`
// reaches a field through a comprehension's variable, dyn(), optional.of()
// or a conditional; each is taken to read every field, so the leases and
// revocations are fetched and the rule polled. Indexing the message by a
// string (`observed["leases_held"]`) and cel.bind do not compile in the
// rules' environment. (Nothing found: it held.)
func TestRogue25ReviewEveryOtherWayOfReachingObservedReadsAll(t *testing.T) {
	for _, e := range []string{
		`[observed].exists(o, o.leases_held > 0)`,
		`[observed].all(o, o.revocations == 0)`,
		`[observed].map(o, o.age_seconds).exists(x, x > 3600.0)`,
		`[observed].filter(o, o.leases_held > 0).size() > 0`,
		`dyn(observed).leases_held > 0`,
		`optional.of(observed).?leases_held.orValue(0) > 0`,
		`(observed.calls > 0 ? observed : observed).leases_held > 0`,
	} {
		c, err := stoprule.Compile(e)
		if err != nil {
			t.Fatalf("%s: %v", e, err)
		}
		if !c.UsesTime || !c.UsesLeases || !c.UsesRevocations {
			t.Errorf("%s: time %v leases %v revocations %v, want all", e, c.UsesTime, c.UsesLeases, c.UsesRevocations)
		}
	}
	for _, e := range []string{`observed["leases_held"] > 0`, `cel.bind(o, observed, o.leases_held > 0)`} {
		if _, err := stoprule.Compile(e); err == nil {
			t.Errorf("%s compiled: the evaluator would have to find what it reads", e)
		}
	}
}
