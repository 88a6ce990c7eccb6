package stoprule_test

import (
	"testing"

	"github.com/tetherhq/tether/supervisor/stoprule"
)

// BenchmarkEvaluate: one rule against one snapshot, the pure part of a
// node's evaluation.
func BenchmarkEvaluate(b *testing.B) {
	observed := &stoprule.Observations{
		Calls: 120, Failures: 9, CallsByTool: map[string]int64{"shell": 70, "http": 40, "sql": 10},
		FailuresByTool: map[string]int64{"http": 9}, SubtreeSize: 12,
	}
	self := map[string]float64{"cost_usd": 3.5}
	for _, tc := range []struct{ name, expression string }{
		{"lookup", `observed.calls_by_tool[?"shell"].orValue(0) > 1000000`},
		{"arithmetic", `observed.failures >= 100000 && observed.failures * 2 >= observed.calls`},
		{"comprehension", `observed.calls_by_tool.exists(t, observed.failures_by_tool[?t].orValue(0) > 100000)`},
		{"self-reported", `self_reported.?cost_usd.orValue(0.0) > 1e9 || observed.subtree_size > 1000000`},
	} {
		c, err := stoprule.Compile(tc.expression)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				if r := c.Evaluate(observed, self); r.Err != nil || r.Fired {
					b.Fatal(r)
				}
			}
		})
	}
}
