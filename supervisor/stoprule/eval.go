package stoprule

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/google/cel-go/common/ast"
	"github.com/google/cel-go/common/operators"
	"github.com/google/cel-go/common/types"

	"github.com/tetherhq/tether/supervisor"
)

// Result is one evaluation of a rule against one node's snapshot.
type Result struct {
	// Fired: the expression evaluated to true.
	Fired bool
	// Values the expression read, from the same snapshot: set when the
	// rule fired (ValuesOf reads them otherwise).
	Values []supervisor.StopRuleValue
	// Cost is what the evaluation cost, in CEL cost units.
	Cost uint64
	// Err is why the evaluation failed (a missing map key, the cost limit);
	// a rule whose evaluation fails does not fire.
	Err error
}

// SelfReported reports whether any value the rule read was self-reported.
func (r Result) SelfReported() bool {
	for _, v := range r.Values {
		if v.SelfReported {
			return true
		}
	}
	return false
}

// Evaluate runs the rule against a snapshot of the node: what the control
// plane observed, and the counters the agent reported. It is pure and
// bounded: evaluation stops at CostBudget. subtree_reported reads as
// empty here (the shell's evaluator reads it from the store).
func (c *Compiled) Evaluate(observed *Observations, selfReported map[string]float64) Result {
	return c.evaluate(observed, selfReported, nil)
}

// evaluate is Evaluate with subtree_reported.
func (c *Compiled) evaluate(observed *Observations, selfReported map[string]float64, subtree *reportedSums) Result {
	if observed == nil {
		observed = &Observations{}
	}
	if selfReported == nil {
		selfReported = map[string]float64{}
	}
	out, details, err := c.program.Eval(map[string]any{VarObserved: observed, VarSelfReported: selfReported, VarSubtreeReported: subtree.celValue()})
	var r Result
	if details != nil && details.ActualCost() != nil {
		r.Cost = *details.ActualCost()
	}
	if err != nil {
		r.Err = err
		return r
	}
	r.Fired = out == types.True
	if r.Fired {
		r.Values = c.values(observed, selfReported, subtree)
	}
	return r
}

// ValuesOf reads the values the expression reads from a snapshot, as a
// firing would report them (for TestStopRule, whether or not it fires).
func (c *Compiled) ValuesOf(observed *Observations, selfReported map[string]float64) []supervisor.StopRuleValue {
	if observed == nil {
		observed = &Observations{}
	}
	return c.values(observed, selfReported, nil)
}

// ref is one value an expression reads: a field of `observed` or a key of
// `self_reported`, with a constant map key when it has one.
type ref struct {
	variable, field, key string
	hasKey               bool
}

func (r ref) name() string {
	switch {
	case r.variable != VarObserved && r.hasKey:
		return r.variable + "." + r.key
	case r.variable != VarObserved:
		return r.variable
	case r.hasKey:
		return fmt.Sprintf("%s.%s[%s]", VarObserved, r.field, strconv.Quote(r.key))
	}
	return VarObserved + "." + r.field
}

// references finds the values an expression reads, in a stable order.
func references(a *ast.AST) []ref {
	var refs []ref
	keyed := map[int64]bool{} // operands already named with their key
	// observedField returns the field when e is `observed.<field>`.
	observedField := func(e ast.Expr) (string, bool) {
		if e.Kind() != ast.SelectKind {
			return "", false
		}
		s := e.AsSelect()
		// has(observed.f) reads f too (a proto3 scalar is present when
		// it is not zero).
		if s.Operand().Kind() == ast.IdentKind && s.Operand().AsIdent() == VarObserved {
			return s.FieldName(), true
		}
		return "", false
	}
	// selfVar names the self-reported map e is, if it is one.
	selfVar := func(e ast.Expr) (string, bool) {
		if e.Kind() != ast.IdentKind || (e.AsIdent() != VarSelfReported && e.AsIdent() != VarSubtreeReported) {
			return "", false
		}
		return e.AsIdent(), true
	}
	isObserved := func(e ast.Expr) bool { return e.Kind() == ast.IdentKind && e.AsIdent() == VarObserved }
	constKey := func(e ast.Expr) (string, bool) {
		if e.Kind() != ast.LiteralKind {
			return "", false
		}
		s, ok := e.AsLiteral().(types.String)
		return string(s), ok
	}
	visit := func(e ast.Expr) {
		switch e.Kind() {
		case ast.CallKind:
			call := e.AsCall()
			fn := call.FunctionName()
			if (fn != operators.Index && fn != operators.OptIndex && fn != operators.OptSelect) || len(call.Args()) != 2 {
				return
			}
			operand, key := call.Args()[0], call.Args()[1]
			k, ok := constKey(key)
			if !ok {
				return
			}
			if f, ok := observedField(operand); ok {
				refs = append(refs, ref{variable: VarObserved, field: f, key: k, hasKey: true})
				keyed[operand.ID()] = true
			} else if fn == operators.OptSelect && isObserved(operand) {
				// observed.?field: the field, whole.
				refs = append(refs, ref{variable: VarObserved, field: k})
			} else if v, ok := selfVar(operand); ok {
				refs = append(refs, ref{variable: v, key: k, hasKey: true})
				keyed[operand.ID()] = true
			}
		case ast.SelectKind:
			s := e.AsSelect()
			if v, ok := selfVar(s.Operand()); ok {
				refs = append(refs, ref{variable: v, key: s.FieldName(), hasKey: true})
				keyed[s.Operand().ID()] = true
			}
		}
	}
	ast.PreOrderVisit(a.Expr(), ast.NewExprVisitor(visit))
	// Whole values: a field or the map read other than by a constant key.
	wholes := func(e ast.Expr) {
		if keyed[e.ID()] {
			return
		}
		if f, ok := observedField(e); ok {
			refs = append(refs, ref{variable: VarObserved, field: f})
		} else if v, ok := selfVar(e); ok {
			refs = append(refs, ref{variable: v})
		}
	}
	ast.PreOrderVisit(a.Expr(), ast.NewExprVisitor(wholes))
	sort.Slice(refs, func(i, j int) bool { return refs[i].name() < refs[j].name() })
	out := refs[:0]
	for i, r := range refs {
		if i == 0 || r.name() != refs[i-1].name() {
			out = append(out, r)
		}
	}
	return out
}

// readsObservedOpaquely reports whether the expression reads `observed`
// other than by naming a field (`observed.f`, `observed.?f`): held in a
// list or a map, say, where references cannot tell which fields it reads.
// Such a rule is taken to read every field, the fetched and the polled
// ones included: a rule the evaluator took to read none of them read 0
// leases whatever the node held, and was never evaluated again on the
// clock alone.
func readsObservedOpaquely(a *ast.AST) bool {
	named := map[int64]bool{} // observed idents that name a field
	ast.PreOrderVisit(a.Expr(), ast.NewExprVisitor(func(e ast.Expr) {
		switch e.Kind() {
		case ast.SelectKind:
			if o := e.AsSelect().Operand(); o.Kind() == ast.IdentKind && o.AsIdent() == VarObserved {
				named[o.ID()] = true
			}
		case ast.CallKind:
			call := e.AsCall()
			if call.FunctionName() != operators.OptSelect || len(call.Args()) != 2 {
				return
			}
			o, field := call.Args()[0], call.Args()[1]
			if o.Kind() == ast.IdentKind && o.AsIdent() == VarObserved && field.Kind() == ast.LiteralKind {
				named[o.ID()] = true
			}
		}
	}))
	opaque := false
	ast.PreOrderVisit(a.Expr(), ast.NewExprVisitor(func(e ast.Expr) {
		if e.Kind() == ast.IdentKind && e.AsIdent() == VarObserved && !named[e.ID()] {
			opaque = true
		}
	}))
	return opaque
}

// values reads each reference from the snapshot.
func (c *Compiled) values(observed *Observations, selfReported map[string]float64, subtree *reportedSums) []supervisor.StopRuleValue {
	out := make([]supervisor.StopRuleValue, 0, len(c.refs))
	for _, r := range c.refs {
		v := supervisor.StopRuleValue{Name: r.name(), SelfReported: r.variable != VarObserved}
		switch {
		case r.variable == VarSubtreeReported && r.hasKey:
			if x, ok := subtree.lookup(r.key); ok {
				v.Value = formatFloat(x)
			} else {
				v.Value = "absent"
			}
		case r.variable == VarSubtreeReported:
			v.Value = formatEntry(subtree.values(), "", false)
		case r.variable == VarSelfReported && r.hasKey:
			if x, ok := selfReported[r.key]; ok {
				v.Value = formatFloat(x)
			} else {
				v.Value = "absent"
			}
		case r.variable == VarSelfReported:
			v.Value = formatEntry(selfReported, "", false)
		default:
			f, ok := observedByName[r.field]
			if !ok {
				continue
			}
			switch val := f.get(observed).(type) {
			case counts:
				v.Value = formatEntry(val, r.key, r.hasKey)
				if f.untracked != nil && r.hasKey && v.Value == "absent" {
					if n, ok := f.untracked(val, r.key); ok {
						v.Value = formatScalar(n) + " (counted under " + OtherTool + ")"
					}
				}
			case map[string]string:
				v.Value = formatEntry(val, r.key, r.hasKey)
			default:
				v.Value = formatScalar(val)
			}
		}
		out = append(out, v)
	}
	return out
}

func formatScalar(v any) string {
	switch x := v.(type) {
	case float64:
		return formatFloat(x)
	case string:
		return strconv.Quote(x)
	default:
		return fmt.Sprint(x)
	}
}

// formatEntry renders a map's entry under key (when hasKey) or the whole
// map, its entries in order.
func formatEntry[V any](m map[string]V, key string, hasKey bool) string {
	if hasKey {
		x, ok := m[key]
		if !ok {
			return "absent"
		}
		return formatScalar(x)
	}
	parts := make([]string, 0, len(m))
	for k, x := range m {
		parts = append(parts, strconv.Quote(k)+": "+formatScalar(x))
	}
	sort.Strings(parts)
	return "{" + strings.Join(parts, ", ") + "}"
}

func formatFloat(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }
