package stoprule

import (
	"fmt"
	"regexp"
	"regexp/syntax"
	"sort"
	"strings"
	"sync"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/checker"
	"github.com/google/cel-go/common/ast"
	"github.com/google/cel-go/common/overloads"
	"github.com/google/cel-go/common/types"

	"github.com/tetherhq/tether/internal/fault"
)

// Errors of the pure core. Messages reach clients: they name the rule's
// field and, for expressions, the line and column.
var (
	ErrInvalidRule = fault.New(fault.Invalid, "stoprule: invalid rule")
	ErrOverBudget  = fault.New(fault.Invalid, "stoprule: rule over the cost budget")
)

// Bounds of a rule. The environment's maps are bounded too (MaxTools,
// MaxCounters), so that the worst case of every expression is finite and
// known when the rule is attached.
const (
	// MaxExpressionBytes bounds the expression text.
	MaxExpressionBytes = 2048
	// CostBudget is the most an expression may cost in the worst case, in
	// CEL cost units (roughly one per operation). A rule over it is
	// refused when attached; evaluation is also stopped at it.
	CostBudget = 10_000
	// MaxTools bounds the tools tracked per node; calls of further tools
	// are counted under the tool name OtherTool.
	MaxTools = 64
	// MaxCounters bounds the self-reported counters per node.
	MaxCounters = 32
	// MaxLabels is the most labels a node may have for the cost estimate
	// (observed.node_labels): a tree allowing more (tree.Limits.MaxLabels)
	// would let a rule accepted within the budget cost past it, and fail
	// without firing, on a node with more labels; controlplane.New refuses
	// such a tree.
	MaxLabels = 32
	// OtherTool collects the calls of tools past MaxTools.
	OtherTool = "other"
)

// The variables of every rule.
const (
	// VarObserved is the control plane's own observations of the node
	// (Observations, of CEL type tether.v1.StopRuleObservations).
	VarObserved = "observed"
	// VarSelfReported is the agent's own counters (map of string to
	// double). Values read from it are labelled self-reported.
	VarSelfReported = "self_reported"
	// VarSubtreeReported is the agents' own counters added up over the
	// node's subtree (map of string to double): each counter of the node
	// and of every descendant it ever had, a negative one counted as 0.
	// Values read from it are labelled self-reported.
	VarSubtreeReported = "subtree_reported"
)

var (
	envOnce sync.Once
	env     *cel.Env
	envErr  error
)

// Env is the CEL environment rules are compiled in: `observed` and
// `self_reported`, the standard library, optional values (`.?key`,
// `orValue`) and numeric comparisons across int and double.
func Env() (*cel.Env, error) {
	envOnce.Do(func() {
		env, envErr = cel.NewEnv(
			cel.Types(observationsType{}),
			cel.Variable(VarObserved, cel.ObjectType(ObservationsType)),
			cel.Variable(VarSelfReported, cel.MapType(cel.StringType, cel.DoubleType)),
			cel.Variable(VarSubtreeReported, cel.MapType(cel.StringType, cel.DoubleType)),
			cel.OptionalTypes(),
			cel.CrossTypeNumericComparisons(true),
			cel.ParserExpressionSizeLimit(MaxExpressionBytes),
			cel.ParserRecursionLimit(32),
		)
	})
	return env, envErr
}

// Compiled is a rule's expression, type-checked and cost-checked, ready to
// evaluate. It is immutable and safe for concurrent use.
type Compiled struct {
	Expression string
	// Cost is the worst-case cost estimate.
	Cost    uint64
	program cel.Program
	// refs are the values the expression reads, for the record.
	refs []ref
	// UsesTime: the expression reads observed.age_seconds, which changes
	// with the clock alone.
	UsesTime bool
	// UsesLeases, UsesRevocations: the expression reads observations the
	// shell fetches only for rules that need them.
	UsesLeases, UsesRevocations bool
	// UsesSubtree: the expression reads the subtree's totals (its calls,
	// their outcomes and time, its reported counters), which every call
	// or report of a descendant changes: the evaluator judges an
	// ancestor again on its descendants' calls and reports only for such
	// rules.
	UsesSubtree bool
	// UsesSubtreeTools: the expression reads the subtree's counts by tool
	// (subtree_calls_by_tool, subtree_failures_by_tool), which only such
	// rules' evaluations decode from the records, each charged by their
	// size (subtreeToolsBytesPerRead).
	UsesSubtreeTools bool
	// UsesSubtreeReported: the expression reads subtree_reported, which
	// only such rules' evaluations decode from the records, charged by
	// their size as UsesSubtreeTools.
	UsesSubtreeReported bool
	// UsesCallTime: the expression reads how long calls took
	// (call_seconds_total, call_seconds_max and their subtree_ forms),
	// which counts the calls still open up to the instant it is judged:
	// the evaluator judges a node with calls open in its subtree again
	// every tick for such rules, and reads the node's own open calls for
	// them alone.
	UsesCallTime bool
	// UsesSubtreePeak: the expression reads subtree_calls_in_flight_max,
	// for which the evaluator counts the subtree's calls in flight from
	// each change of its totals (subtreePeak).
	UsesSubtreePeak bool
}

// Compile parses, type-checks and cost-checks an expression. Errors wrap
// ErrInvalidRule or ErrOverBudget and name the position (line:column).
func Compile(expression string) (*Compiled, error) {
	if strings.TrimSpace(expression) == "" {
		return nil, fmt.Errorf("%w: expression is required", ErrInvalidRule)
	}
	if len(expression) > MaxExpressionBytes {
		return nil, fmt.Errorf("%w: expression is %d bytes, more than %d", ErrInvalidRule, len(expression), MaxExpressionBytes)
	}
	e, err := Env()
	if err != nil {
		return nil, err
	}
	checked, issues := e.Compile(expression)
	if issues != nil && issues.Err() != nil {
		return nil, fmt.Errorf("%w: %s", ErrInvalidRule, positions(issues))
	}
	if !checked.OutputType().IsExactType(cel.BoolType) {
		return nil, fmt.Errorf("%w: 1:1: the expression is of type %s, want bool", ErrInvalidRule, checked.OutputType())
	}
	if err := literalPatterns(checked.NativeRep()); err != nil {
		return nil, err
	}
	estimate, err := e.EstimateCost(checked, sizes{})
	if err != nil {
		return nil, fmt.Errorf("%w: cost: %v", ErrInvalidRule, err)
	}
	native := checked.NativeRep()
	if estimate.Max > CostBudget {
		return nil, fmt.Errorf("%w: the expression may cost %d, more than the budget of %d%s", ErrOverBudget, estimate.Max, CostBudget, loopPositions(native))
	}
	prg, err := e.Program(checked, cel.CostLimit(CostBudget), cel.EvalOptions(cel.OptOptimize))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidRule, err)
	}
	c := &Compiled{Expression: expression, Cost: estimate.Max, program: prg, refs: references(native)}
	for _, r := range c.refs {
		switch r.field {
		case "age_seconds":
			c.UsesTime = true
		case "leases_held", "leases_by_state":
			c.UsesLeases = true
		case "revocations":
			c.UsesRevocations = true
		case "subtree_calls", "subtree_failures", "subtree_calls_by_outcome", "subtree_calls_in_flight":
			c.UsesSubtree = true
		case "subtree_calls_in_flight_max":
			c.UsesSubtree, c.UsesSubtreePeak = true, true
		case "subtree_call_seconds_total", "subtree_call_seconds_max":
			c.UsesSubtree, c.UsesCallTime = true, true
		case "call_seconds_total", "call_seconds_max":
			c.UsesCallTime = true
		case "subtree_calls_by_tool", "subtree_failures_by_tool":
			c.UsesSubtree, c.UsesSubtreeTools = true, true
		}
		if r.variable == VarSubtreeReported {
			c.UsesSubtree, c.UsesSubtreeReported = true, true
		}
	}
	if readsObservedOpaquely(native) {
		c.UsesTime, c.UsesLeases, c.UsesRevocations, c.UsesSubtree, c.UsesSubtreeTools, c.UsesCallTime = true, true, true, true, true, true
		c.UsesSubtreePeak = true
	}
	return c, nil
}

// positions renders CEL's issues as "line:column: message; ...".
func positions(issues *cel.Issues) string {
	var parts []string
	for _, e := range issues.Errors() {
		loc := e.Location
		parts = append(parts, fmt.Sprintf("%d:%d: %s", loc.Line(), loc.Column()+1, e.Message))
	}
	return strings.Join(parts, "; ")
}

// loopPositions names where the expression's comprehensions (all, exists,
// map, filter, ...) start: they are what makes a bounded expression cost
// more than the budget.
func loopPositions(a *ast.AST) string {
	var locs []string
	info := a.SourceInfo()
	seen := map[string]bool{}
	visit := func(e ast.Expr) {
		if e.Kind() != ast.ComprehensionKind {
			return
		}
		loc := info.GetStartLocation(e.ID())
		s := fmt.Sprintf("%d:%d", loc.Line(), loc.Column()+1)
		if !seen[s] {
			seen[s] = true
			locs = append(locs, s)
		}
	}
	ast.PostOrderVisit(a.Expr(), ast.NewExprVisitor(visit))
	if len(locs) == 0 {
		return " (1:1)"
	}
	sort.Strings(locs)
	return "; loops at " + strings.Join(locs, ", ")
}

var counterName = regexp.MustCompile(`^[a-z][a-z0-9_]{0,62}$`)

// CheckCounters validates self-reported counters.
func CheckCounters(counters map[string]float64) error {
	if len(counters) > MaxCounters {
		return fmt.Errorf("%w: counters: at most %d", ErrInvalidRule, MaxCounters)
	}
	for k, v := range counters {
		if !counterName.MatchString(k) {
			return fmt.Errorf("%w: counters: %q is not a counter name (1-63 of a-z, 0-9 and _, starting with a letter)", ErrInvalidRule, clip(k))
		}
		if v != v || v > 1e300 || v < -1e300 {
			return fmt.Errorf("%w: counters[%s]: not a finite number", ErrInvalidRule, k)
		}
	}
	return nil
}

// sizes bounds the environment's maps for the cost estimate.
type sizes struct{}

func (sizes) EstimateSize(n checker.AstNode) *checker.SizeEstimate {
	path := n.Path()
	if len(path) == 0 {
		return nil
	}
	var max uint64
	switch {
	case path[0] == VarSelfReported:
		max = MaxCounters
	case path[0] == VarSubtreeReported:
		max = maxSubtreeCounters
	case path[0] == VarObserved && len(path) >= 2:
		switch path[1] {
		case "calls_by_tool", "failures_by_tool":
			max = MaxTools + 1
		case "subtree_calls_by_tool", "subtree_failures_by_tool":
			max = maxSubtreeTools
		case "calls_by_outcome", "subtree_calls_by_outcome", "leases_by_state":
			max = 8
		case "node_labels":
			max = MaxLabels
		case "node_name":
			max = 63
		default:
			return nil
		}
		if len(path) > 2 { // a key or a value: a name
			max = 128
		}
	default:
		return nil
	}
	if (path[0] == VarSelfReported || path[0] == VarSubtreeReported) && len(path) > 1 {
		max = 63
	}
	return &checker.SizeEstimate{Min: 0, Max: max}
}

// EstimateCallCost costs a regular expression match by the size of the
// pattern's compiled program, not of its text: CEL's own estimate guesses
// four characters of pattern per state, which a counted repetition breaks
// ("[a-z]{0,1000}" is 13 characters and a thousand states), and RE2's
// work is the text's length times the states. A rogue's rule estimated at
// a quarter of the budget took 15 ms an evaluation, and the evaluator
// (one for the cluster) runs every rule in effect at a node each time the
// node's counters change. Patterns are literals (literalPatterns).
func (sizes) EstimateCallCost(_, overloadID string, target *checker.AstNode, args []checker.AstNode) *checker.CallEstimate {
	var text, pattern checker.AstNode
	switch {
	case overloadID == overloads.MatchesString && target != nil && len(args) == 1:
		text, pattern = *target, args[0]
	case overloadID == overloads.Matches && target == nil && len(args) == 2:
		text, pattern = args[0], args[1]
	default:
		return nil
	}
	states, ok := patternStates(pattern.Expr())
	if !ok {
		return nil // refused by literalPatterns, or by the regexp's compiler
	}
	size := text.ComputedSize()
	if size == nil {
		size = sizes{}.EstimateSize(text)
	}
	if size == nil {
		return nil // unknown: CEL's estimate is then unbounded, and refused
	}
	// One step per character and state (CEL counts a character as 0.1),
	// and never less than CEL's own estimate, which its cost limit
	// charges at run time (a pattern's length over four).
	cost := (size.Max/10 + 1) * uint64(states)
	return &checker.CallEstimate{CostEstimate: checker.CostEstimate{Min: 1, Max: cost}}
}

// patternStates is the number of instructions of the compiled program of
// the literal pattern e, as RE2 (Go's regexp) runs it, and at least a
// quarter of its length (CEL's guess, which its run-time cost limit uses).
func patternStates(e ast.Expr) (int, bool) {
	if e.Kind() != ast.LiteralKind {
		return 0, false
	}
	p, ok := e.AsLiteral().(types.String)
	if !ok {
		return 0, false
	}
	byLength := (len(p) + 3) / 4
	re, err := syntax.Parse(string(p), syntax.Perl)
	if err != nil {
		return 0, false
	}
	prog, err := syntax.Compile(re.Simplify())
	if err != nil {
		return 0, false
	}
	return max(len(prog.Inst), byLength), true
}

// literalPatterns refuses a match against a pattern the expression
// computes (a label's value, say): its cost cannot be known when the rule
// is attached, only its text's length, and a pattern of a few characters
// can compile to thousands of states.
func literalPatterns(a *ast.AST) error {
	var bad []string
	info := a.SourceInfo()
	visit := func(e ast.Expr) {
		if e.Kind() != ast.CallKind || e.AsCall().FunctionName() != overloads.Matches {
			return
		}
		call := e.AsCall()
		args := call.Args()
		if len(args) == 0 {
			return
		}
		pattern := args[len(args)-1]
		if pattern.Kind() == ast.LiteralKind {
			return
		}
		loc := info.GetStartLocation(e.ID())
		bad = append(bad, fmt.Sprintf("%d:%d", loc.Line(), loc.Column()+1))
	}
	ast.PostOrderVisit(a.Expr(), ast.NewExprVisitor(visit))
	if len(bad) == 0 {
		return nil
	}
	sort.Strings(bad)
	return fmt.Errorf("%w: %s: matches() takes a literal pattern (a string in quotes): the cost of a computed one is not known when the rule is attached", ErrInvalidRule, strings.Join(bad, ", "))
}

func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}
