package stoprule

import (
	"fmt"
	"testing"

	"github.com/tetherhq/tether/supervisor/ledger"
)

// TestARogueCannotHideItsShellCallsPastTheToolCap: a node's calls are
// counted by tool for MaxTools (64) tools, and the calls of further tools
// under OtherTool. A rogue that first calls 64 harmless tools once each
// had its 5 shell calls (each failed) counted under "other" only, and the
// documented rule `observed.calls_by_tool[?"shell"].orValue(0) >= 5` read
// 0 and never fired. A lookup of a tool the map no longer tracks reads
// OtherTool's count now (an over-count, never an under-count), and so do
// `in` and the value the firing reports. (Fails if any of these rules does
// not fire, or if a node under the cap reads an absent tool as called.)
func TestARogueCannotHideItsShellCallsPastTheToolCap(t *testing.T) {
	observe := func(o *Observations, tool string, failed bool) {
		c := &ledger.ToolCall{CallID: fmt.Sprintf("c%d", o.Calls), Tool: tool, State: ledger.CallStateEnded, Resolution: ledger.CallResolutionCompleted}
		if failed {
			c.Resolution = ledger.CallResolutionFailed
		}
		ApplyCall(o, nil, c)
	}
	rogue := &Observations{}
	for i := range MaxTools {
		observe(rogue, fmt.Sprintf("harmless_%d", i), false)
	}
	for range 5 {
		observe(rogue, "shell", true)
	}
	if n := rogue.CallsByTool["shell"]; n != 0 {
		t.Fatalf("the fold tracks shell past the cap (%d calls); the test's premise is gone", n)
	}
	for _, expr := range []string{
		`observed.calls_by_tool[?"shell"].orValue(0) >= 5`,
		`observed.calls_by_tool["shell"] >= 5`,
		`"shell" in observed.calls_by_tool`,
		`observed.failures_by_tool[?"shell"].orValue(0) >= 5`,
		`observed.?calls_by_tool[?"shell"].orValue(0) >= 5`,
	} {
		c, err := Compile(expr)
		if err != nil {
			t.Fatalf("%s: %v", expr, err)
		}
		r := c.Evaluate(rogue, nil)
		if !r.Fired || r.Err != nil {
			t.Errorf("%s on a rogue whose 5 shell calls were counted past the cap: fired %v (err %v), want fired", expr, r.Fired, r.Err)
			continue
		}
		for _, v := range r.Values {
			if v.Value == "absent" {
				t.Errorf("%s: the firing reports %s = absent, want the count it read", expr, v.Name)
			}
		}
	}
	// A tool the map tracks reads its own count, and under the cap an
	// absent tool is absent: no other count stands in for it.
	quiet := &Observations{}
	observe(quiet, "other", false)
	observe(quiet, "ls", false)
	for expr, want := range map[string]bool{
		`observed.calls_by_tool[?"shell"].orValue(0) >= 1`:      false,
		`"shell" in observed.calls_by_tool`:                     false,
		`observed.calls_by_tool[?"harmless_1"].orValue(0) == 1`: false,
		`observed.calls_by_tool["ls"] == 1`:                     true,
	} {
		c, err := Compile(expr)
		if err != nil {
			t.Fatalf("%s: %v", expr, err)
		}
		if r := c.Evaluate(quiet, nil); r.Fired != want {
			t.Errorf("%s on a node of 2 tools: fired %v (err %v), want %v", expr, r.Fired, r.Err, want)
		}
	}
	c, err := Compile(`observed.calls_by_tool[?"harmless_1"].orValue(0) == 1`)
	if err != nil {
		t.Fatal(err)
	}
	if r := c.Evaluate(rogue, nil); !r.Fired {
		t.Errorf("a tracked tool past the cap reads %v (err %v), want its own count 1", r.Fired, r.Err)
	}
}
