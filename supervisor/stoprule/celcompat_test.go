package stoprule

import (
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"google.golang.org/protobuf/reflect/protoreflect"
	"pgregory.net/rapid"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor"
)

// The rules were written against the generated tether.v1 message; the
// environment now reads Observations through its own CEL type (cel.go).
// These tests hold it to the previous environment, built here as it was
// (the message registered with cel.Types): every expression compiles or is
// refused alike, with the same cost estimate, and evaluates to the same
// result, error and actual cost, and reads the same values, on any
// observations.

// protoEnv is the previous environment.
func protoEnv(t testing.TB) *cel.Env {
	e, err := cel.NewEnv(
		cel.Types(&tetherv1.StopRuleObservations{}),
		cel.Variable(VarObserved, cel.ObjectType("tether.v1.StopRuleObservations")),
		cel.Variable(VarSelfReported, cel.MapType(cel.StringType, cel.DoubleType)),
		cel.OptionalTypes(),
		cel.CrossTypeNumericComparisons(true),
		cel.ParserExpressionSizeLimit(MaxExpressionBytes),
		cel.ParserRecursionLimit(32),
	)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// compiled is one expression as an environment takes it.
type compiled struct {
	refused  string // the issues, when refused
	min, max uint64
	program  cel.Program
}

func compileIn(e *cel.Env, expression string) compiled {
	checked, issues := e.Compile(expression)
	if issues != nil && issues.Err() != nil {
		return compiled{refused: positions(issues)}
	}
	est, err := e.EstimateCost(checked, sizes{})
	if err != nil {
		return compiled{refused: "cost: " + err.Error()}
	}
	prg, err := e.Program(checked, cel.CostLimit(CostBudget), cel.EvalOptions(cel.OptOptimize))
	if err != nil {
		return compiled{refused: "program: " + err.Error()}
	}
	return compiled{min: est.Min, max: est.Max, program: prg}
}

type outcome struct {
	value, err string
	cost       uint64
}

func evalIn(c compiled, observed any, self map[string]float64) outcome {
	out, details, err := c.program.Eval(map[string]any{VarObserved: observed, VarSelfReported: self})
	var o outcome
	if details != nil && details.ActualCost() != nil {
		o.cost = *details.ActualCost()
	}
	if err != nil {
		o.err = err.Error()
		return o
	}
	o.value = fmt.Sprint(out.Value())
	switch x := out.Value().(type) {
	case *Observations:
		o.value = "observations " + toProto(x).String()
	case *tetherv1.StopRuleObservations:
		o.value = "observations " + x.String()
	}
	if out.Type() == types.TypeType {
		o.value = "type " + out.(interface{ TypeName() string }).TypeName()
	}
	return o
}

// compatExpressions exercise every field, presence, optional access,
// missing keys, comprehensions, types, equality and construction.
var compatExpressions = []string{
	`observed.calls >= 2`,
	`observed.calls_by_tool[?"shell"].orValue(0) >= 3`,
	`observed.failures >= 2 && observed.failures * 2 >= observed.calls`,
	`self_reported.?cost_usd.orValue(0.0) > 5.0`,
	`observed.call_seconds_max > 30.0`,
	`observed.subtree_size >= 3 && observed.subtree_depth >= 2`,
	`observed.depth > 10 || observed.spawns > 3`,
	`observed.calls_by_tool["shell"] > 1`,
	`observed.calls_by_outcome["failed"] >= 1`,
	`observed.failures_by_tool.exists(t, observed.failures_by_tool[t] > 1)`,
	`observed.calls_by_tool.all(t, observed.calls_by_tool[t] < 5)`,
	`observed.calls_by_tool.exists(t, observed.failures_by_tool[?t].orValue(0) * 2 > observed.calls_by_tool[t])`,
	`observed.calls_by_tool.filter(t, observed.calls_by_tool[t] > 1).size() > 0`,
	`observed.calls_by_tool.map(t, t).size() > 1`,
	`size(observed.calls_by_tool) + size(observed.leases_by_state) > 2`,
	`"shell" in observed.calls_by_tool`,
	`has(observed.calls)`, `has(observed.call_seconds_total)`, `has(observed.calls_by_tool)`,
	`has(observed.node_name)`, `has(observed.node_labels)`, `has(observed.age_seconds)`,
	`observed.?calls.orValue(7) == 7`, `observed.?node_labels.hasValue()`,
	`observed.?calls_by_tool[?"http"].orValue(-1) >= 0`,
	`observed.calls_in_flight > 0 && observed.call_seconds_total / double(observed.calls_in_flight) > 1.5`,
	`observed.calls_in_flight_max > observed.calls_in_flight && has(observed.calls_in_flight_max)`,
	`observed.call_seconds_total / 0.0 > 1.0`,
	`observed.calls / observed.failures > 1`,
	`observed.calls * 4611686018427387904 > 0`,
	`observed.age_seconds > 3600.0 && observed.leases_held > 0`,
	`observed.leases_by_state[?"active"].orValue(0) > 1 || observed.revocations > 0`,
	`observed.node_name.startsWith("worker") && observed.node_labels[?"team"].orValue("") == "a"`,
	`observed.node_name.matches("^w[a-z]*$")`,
	`observed.node_labels.exists(k, k.size() > 2 && observed.node_labels[k] != "")`,
	`observed.node_labels["team"] == "a"`,
	`observed.calls > 1.5`, `observed.calls_by_tool[?"shell"].orValue(0) > 0.5`,
	`self_reported.exists(k, self_reported[k] > 100.0)`, `self_reported["cost_usd"] > 1.0`,
	`type(observed) == tether.v1.StopRuleObservations`, `string(type(observed)) == "tether.v1.StopRuleObservations"`,
	`observed == observed`, `observed != tether.v1.StopRuleObservations{}`,
	`tether.v1.StopRuleObservations{calls: 3}.calls == 3`,
	`tether.v1.StopRuleObservations{calls: observed.calls, failures: observed.failures} == observed`,
	`tether.v1.StopRuleObservations{calls_by_tool: {"a": 1}}.calls_by_tool["a"] == 1`,
	`has(tether.v1.StopRuleObservations{node_name: "x"}.node_name)`,
	`dyn(observed).calls > 1`, `dyn(observed).nope > 1`, `has(dyn(observed).calls)`,
	`observed.nope > 1`, `observed.calls + "x" > 1`, `observed`, `observed.calls`,
	`observed.calls_by_tool[1] > 0`, `observed.calls_by_tool[dyn(1)] > 0`,
	`observed.calls_by_tool.all(a, observed.calls_by_tool.all(b, observed.calls_by_tool.all(c, a + b + c != "")))`,
}

func drawCounts(t *rapid.T, label string) map[string]int64 {
	if rapid.Bool().Draw(t, label+" nil") {
		return nil
	}
	return rapid.MapOfN(rapid.SampledFrom([]string{"shell", "http", "sql", "other", "active", "failed"}), rapid.Int64Range(-2, 6), 0, 3).Draw(t, label)
}

func drawObservations(t *rapid.T) *Observations {
	small := func(l string) int64 { return rapid.Int64Range(-1, 6).Draw(t, l) }
	double := func(l string) float64 {
		return rapid.SampledFrom([]float64{0, 0.5, 1.5, 31, 3600.5, -1}).Draw(t, l)
	}
	o := &Observations{
		Calls: small("calls"), CallsByTool: drawCounts(t, "calls_by_tool"), CallsByOutcome: drawCounts(t, "calls_by_outcome"),
		Failures: small("failures"), FailuresByTool: drawCounts(t, "failures_by_tool"), CallsInFlight: small("in_flight"), CallsInFlightMax: small("in_flight_max"),
		CallSecondsTotal: double("total"), CallSecondsMax: double("max"), Spawns: small("spawns"),
		SubtreeSize: small("subtree_size"), SubtreeDepth: small("subtree_depth"), Depth: small("depth"),
		AgeSeconds: double("age"), LeasesHeld: small("leases_held"), LeasesByState: drawCounts(t, "leases_by_state"),
		Revocations: small("revocations"), NodeName: rapid.SampledFrom([]string{"", "worker", "wx", "planner"}).Draw(t, "name"),
	}
	if !rapid.Bool().Draw(t, "labels nil") {
		o.NodeLabels = rapid.MapOfN(rapid.SampledFrom([]string{"team", "t", "tier"}), rapid.SampledFrom([]string{"", "a", "b"}), 0, 2).Draw(t, "labels")
	}
	return o
}

// toProto is the edge's conversion (controlplane/wire), which this
// package cannot import.
func toProto(o *Observations) *tetherv1.StopRuleObservations {
	return &tetherv1.StopRuleObservations{
		Calls: o.Calls, CallsByTool: o.CallsByTool, CallsByOutcome: o.CallsByOutcome, Failures: o.Failures,
		FailuresByTool: o.FailuresByTool, CallsInFlight: o.CallsInFlight, CallSecondsTotal: o.CallSecondsTotal,
		CallSecondsMax: o.CallSecondsMax, Spawns: o.Spawns, SubtreeSize: o.SubtreeSize, SubtreeDepth: o.SubtreeDepth,
		Depth: o.Depth, AgeSeconds: o.AgeSeconds, LeasesHeld: o.LeasesHeld, LeasesByState: o.LeasesByState,
		Revocations: o.Revocations, NodeName: o.NodeName, NodeLabels: o.NodeLabels, CallsInFlightMax: o.CallsInFlightMax,
	}
}

// orderFree: no map holds two entries, so a comprehension visits its
// entries in one order and costs the same in both environments.
func orderFree(o *Observations) bool {
	for _, n := range []int{len(o.CallsByTool), len(o.CallsByOutcome), len(o.FailuresByTool), len(o.LeasesByState), len(o.NodeLabels)} {
		if n > 1 {
			return false
		}
	}
	return true
}

func TestObservationsEvaluateAsTheProtoMessageDid(t *testing.T) {
	old, cur := protoEnv(t), mustEnv(t)
	type pair struct {
		expression string
		old, cur   compiled
		refs       *Compiled
	}
	var pairs []pair
	for _, e := range compatExpressions {
		p := pair{expression: e, old: compileIn(old, e), cur: compileIn(cur, e)}
		if p.old.refused != p.cur.refused || p.old.min != p.cur.min || p.old.max != p.cur.max {
			t.Fatalf("%s: compiles as %+v, the proto environment as %+v", e, p.cur, p.old)
		}
		if p.cur.refused == "" {
			p.refs, _ = Compile(e) // nil when it is not a bool or over the budget
		}
		pairs = append(pairs, p)
	}
	rapid.Check(t, func(t *rapid.T) {
		o := drawObservations(t)
		self := rapid.MapOfN(rapid.SampledFrom([]string{"cost_usd", "tokens"}), rapid.Float64Range(0, 10), 0, 2).Draw(t, "self")
		m := toProto(o)
		for _, p := range pairs {
			if p.cur.refused != "" {
				continue
			}
			got, want := evalIn(p.cur, o, self), evalIn(p.old, m, self)
			if !orderFree(o) {
				got.cost, want.cost = 0, 0
			}
			if got != want {
				t.Fatalf("%s on %+v: %+v, the proto environment %+v", p.expression, o, got, want)
			}
			if p.refs == nil {
				continue
			}
			if got, want := p.refs.ValuesOf(o, self), protoValues(p.refs, m, self); !reflect.DeepEqual(got, want) {
				t.Fatalf("%s: values %v, read from the message %v", p.expression, got, want)
			}
		}
	})
}

func mustEnv(t testing.TB) *cel.Env {
	e, err := Env()
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// protoValues is how the previous version read the values a rule read:
// from the message, by reflection.
func protoValues(c *Compiled, observed *tetherv1.StopRuleObservations, selfReported map[string]float64) []supervisor.StopRuleValue {
	format := func(v protoreflect.Value) string {
		switch x := v.Interface().(type) {
		case float64:
			return formatFloat(x)
		case string:
			return strconv.Quote(x)
		default:
			return fmt.Sprint(x)
		}
	}
	out := make([]supervisor.StopRuleValue, 0, len(c.refs))
	m := observed.ProtoReflect()
	for _, r := range c.refs {
		v := supervisor.StopRuleValue{Name: r.name(), SelfReported: r.variable == VarSelfReported}
		switch {
		case r.variable == VarSelfReported && r.hasKey:
			if x, ok := selfReported[r.key]; ok {
				v.Value = formatFloat(x)
			} else {
				v.Value = "absent"
			}
		case r.variable == VarSelfReported:
			parts := []string{}
			for k, x := range selfReported {
				parts = append(parts, strconv.Quote(k)+": "+formatFloat(x))
			}
			sort.Strings(parts)
			v.Value = "{" + strings.Join(parts, ", ") + "}"
		default:
			fd := m.Descriptor().Fields().ByName(protoreflect.Name(r.field))
			if fd == nil {
				continue
			}
			val := m.Get(fd)
			switch {
			case fd.IsMap() && r.hasKey:
				k := protoreflect.ValueOfString(r.key).MapKey()
				if !val.Map().Has(k) {
					v.Value = "absent"
				} else {
					v.Value = format(val.Map().Get(k))
				}
			case fd.IsMap():
				var parts []string
				val.Map().Range(func(k protoreflect.MapKey, x protoreflect.Value) bool {
					parts = append(parts, strconv.Quote(k.String())+": "+format(x))
					return true
				})
				sort.Strings(parts)
				v.Value = "{" + strings.Join(parts, ", ") + "}"
			default:
				v.Value = format(val)
			}
		}
		out = append(out, v)
	}
	return out
}

// BenchmarkEnvironments runs BenchmarkEvaluate's rules in the previous
// environment (the message) and the current one (Observations), for a
// ratio measured in the same run.
func BenchmarkEnvironments(b *testing.B) {
	o := &Observations{
		Calls: 120, Failures: 9, CallsByTool: map[string]int64{"shell": 70, "http": 40, "sql": 10},
		FailuresByTool: map[string]int64{"http": 9}, SubtreeSize: 12,
	}
	self := map[string]float64{"cost_usd": 3.5}
	for _, env := range []struct {
		name     string
		e        *cel.Env
		observed any
	}{{"proto", protoEnv(b), toProto(o)}, {"native", mustEnv(b), o}} {
		for _, tc := range []struct{ name, expression string }{
			{"lookup", `observed.calls_by_tool[?"shell"].orValue(0) > 1000000`},
			{"arithmetic", `observed.failures >= 100000 && observed.failures * 2 >= observed.calls`},
			{"comprehension", `observed.calls_by_tool.exists(t, observed.failures_by_tool[?t].orValue(0) > 100000)`},
			{"self-reported", `self_reported.?cost_usd.orValue(0.0) > 1e9 || observed.subtree_size > 1000000`},
		} {
			c := compileIn(env.e, tc.expression)
			if c.refused != "" {
				b.Fatal(c.refused)
			}
			vars := map[string]any{VarObserved: env.observed, VarSelfReported: self}
			b.Run(env.name+"/"+tc.name, func(b *testing.B) {
				for b.Loop() {
					if out, _, err := c.program.Eval(vars); err != nil || out != types.False {
						b.Fatal(out, err)
					}
				}
			})
		}
	}
}
