package stoprule_test

import (
	"errors"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/tetherhq/tether/supervisor/stoprule"
	"github.com/tetherhq/tether/supervisor/tree"
)

func TestCompileRefusesWithPositions(t *testing.T) {
	for _, tc := range []struct {
		expression string
		sentinel   error
		want       string
	}{
		{`observed.calls >`, stoprule.ErrInvalidRule, "1:17: Syntax error"},
		{"observed.calls > 1 &&\n  observed.nope", stoprule.ErrInvalidRule, "2:11: undefined field 'nope'"},
		{`observed.calls + "x" > 1`, stoprule.ErrInvalidRule, "1:16: found no matching overload for '_+_'"},
		{`unknown_var > 1`, stoprule.ErrInvalidRule, "1:1: undeclared reference to 'unknown_var'"},
		{`observed.calls`, stoprule.ErrInvalidRule, "of type int, want bool"},
		{`  `, stoprule.ErrInvalidRule, "expression is required"},
		{strings.Repeat("(", 40) + "true" + strings.Repeat(")", 40), stoprule.ErrInvalidRule, "1:"},
		// Every comprehension's position is named: they are what costs.
		{`observed.calls_by_tool.all(a, observed.calls_by_tool.all(b, observed.calls_by_tool.all(c, a + b + c != "")))`, stoprule.ErrOverBudget, "loops at 1:27, 1:57, 1:87"},
		{`self_reported.exists(k, self_reported.exists(j, observed.node_labels.exists(l, k + j + l == "x")))`, stoprule.ErrOverBudget, "more than the budget of 10000"},
		// A match costs its compiled program, not its text; a computed
		// pattern's program is unknown.
		{`observed.node_labels.exists(k, observed.node_labels[k].matches("(?:[a-z]{0,100}){0,10}b"))`, stoprule.ErrOverBudget, "more than the budget of 10000; loops at 1:28"},
		{`observed.node_name.matches(observed.node_labels[?"p"].orValue("x"))`, stoprule.ErrInvalidRule, "1:27: matches() takes a literal pattern"},
	} {
		_, err := stoprule.Compile(tc.expression)
		if !errors.Is(err, tc.sentinel) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %v mentioning %q", tc.expression, err, tc.sentinel, tc.want)
		}
	}
}

func TestCompiledRulesStayWithinTheirBudget(t *testing.T) {
	// The worst case the estimate allows, evaluated: every map at its bound.
	full := &stoprule.Observations{CallsByTool: map[string]int64{}, FailuresByTool: map[string]int64{}, NodeLabels: map[string]string{}}
	self := map[string]float64{}
	for i := range stoprule.MaxTools + 1 {
		name := strings.Repeat("t", 60) + string(rune('A'+i%26)) + string(rune('a'+i/26))
		full.CallsByTool[name], full.FailuresByTool[name] = int64(i), int64(i)
	}
	for i := range stoprule.MaxCounters {
		self[strings.Repeat("c", 10)+string(rune('a'+i))] = float64(i)
	}
	for i := range 32 {
		full.NodeLabels[strings.Repeat("k", 60)+string(rune('a'+i))] = strings.Repeat("a", 63)
	}
	full.NodeName = strings.Repeat("a", 63)
	for _, e := range []string{
		`observed.calls_by_tool.exists(t, observed.failures_by_tool[?t].orValue(0) * 2 > observed.calls_by_tool[t])`,
		`observed.calls_by_tool.filter(t, observed.calls_by_tool[t] > 10).size() > 3 && observed.node_labels.all(k, k != "")`,
		`self_reported.exists(k, self_reported[k] > 100.0)`,
		`observed.node_name.matches("^w[a-z]*$") || observed.node_labels.exists(k, observed.node_labels[k].matches("^[a-z]{0,8}b"))`,
		`observed.node_labels.exists(k, observed.node_labels[k].matches("\\p{Greek}\\p{Greek}\\p{Greek}\\p{Greek}\\p{Greek}\\p{Greek}"))`,
	} {
		c, err := stoprule.Compile(e)
		if err != nil {
			t.Fatalf("%s: %v", e, err)
		}
		r := c.Evaluate(full, self)
		if r.Err != nil || r.Cost > c.Cost || c.Cost > stoprule.CostBudget {
			t.Errorf("%s: cost %d of an estimate %d (budget %d), err %v", e, r.Cost, c.Cost, stoprule.CostBudget, r.Err)
		}
	}
}

func TestEvaluateTreatsMissingKeysAsNotFiring(t *testing.T) {
	c, err := stoprule.Compile(`observed.calls_by_tool["shell"] > 1`)
	if err != nil {
		t.Fatal(err)
	}
	r := c.Evaluate(&stoprule.Observations{}, nil)
	if r.Fired || r.Err == nil || r.Values != nil {
		t.Fatalf("%+v, want an error and not fired", r)
	}
	if v := c.ValuesOf(nil, nil); len(v) != 1 || v[0].Value != "absent" {
		t.Fatalf("values %v, want the key absent", v)
	}
}

// FuzzCompile: any text is either refused with the package's sentinels or
// compiles to a rule whose estimate is within the budget and whose
// evaluation on an empty snapshot stays within it.
func FuzzCompile(f *testing.F) {
	for _, s := range []string{`observed.calls > 3`, `self_reported.?cost.orValue(0.0) > 1.5`, `observed.calls_by_tool.exists(t, t == "shell")`, `(`, `"\xff"`, `observed.calls_by_tool.map(t, t).size() > 2`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, expression string) {
		c, err := stoprule.Compile(expression)
		if err != nil {
			if !errors.Is(err, stoprule.ErrInvalidRule) && !errors.Is(err, stoprule.ErrOverBudget) {
				t.Fatalf("%q: %v wraps neither sentinel", expression, err)
			}
			return
		}
		if c.Cost > stoprule.CostBudget {
			t.Fatalf("%q compiled at cost %d", expression, c.Cost)
		}
		if r := c.Evaluate(nil, nil); r.Cost > stoprule.CostBudget {
			t.Fatalf("%q evaluated at cost %d", expression, r.Cost)
		}
	})
}

// TestInEffectMatchesATreeWalk: a rule is in effect at a node exactly when
// it is attached to the node or to a node on the path from the root to it
// (walked by parent links), or is a selector rule matching its labels.
func TestInEffectMatchesATreeWalk(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 30).Draw(t, "nodes")
		nodes := make([]*tree.Node, n)
		parent := make([]int, n)
		for i := range n {
			nodes[i] = &tree.Node{NodeID: "n" + string(rune('a'+i)), Labels: map[string]string{}}
			parent[i] = -1
			if i > 0 && rapid.Bool().Draw(t, "child") {
				parent[i] = rapid.IntRange(0, i-1).Draw(t, "parent")
				p := nodes[parent[i]]
				nodes[i].Ancestors = append(append([]string(nil), p.Ancestors...), p.NodeID)
			}
			if rapid.Bool().Draw(t, "labelled") {
				nodes[i].Labels["team"] = "x"
			}
		}
		var rules []*stoprule.Rule
		for i := range rapid.IntRange(0, 10).Draw(t, "rules") {
			r := &stoprule.Rule{Name: "r" + string(rune('a'+i))}
			if rapid.Bool().Draw(t, "selector") {
				r.Selector = map[string]string{"team": "x"}
			} else {
				r.NodeID = nodes[rapid.IntRange(0, n-1).Draw(t, "on")].NodeID
			}
			rules = append(rules, r)
		}
		for i, node := range nodes {
			want := map[string]bool{}
			for _, r := range rules {
				if r.NodeID == "" {
					want[r.Name] = node.Labels["team"] == "x"
					continue
				}
				for j := i; j >= 0; j = parent[j] {
					if nodes[j].NodeID == r.NodeID {
						want[r.Name] = true
					}
				}
			}
			got := map[string]bool{}
			for _, r := range stoprule.InEffect(rules, node) {
				got[r.Name] = true
			}
			for _, r := range rules {
				if got[r.Name] != want[r.Name] {
					t.Fatalf("rule %s at node %s: in effect %v, the tree walk says %v", r.Name, node.NodeID, got[r.Name], want[r.Name])
				}
			}
		}
	})
}
