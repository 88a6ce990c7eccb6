package stoprule

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/tetherhq/tether/internal/fault"
	"github.com/tetherhq/tether/supervisor/tree"
)

// Errors of attaching and removing rules.
var (
	ErrDenied       = fault.New(fault.Denied, "stoprule: not allowed")
	ErrRuleNotFound = fault.New(fault.NotFound, "stoprule: rule not found")
	ErrDuplicate    = fault.New(fault.Exists, "stoprule: rule name already in effect")
	ErrLimit        = fault.New(fault.Exhausted, "stoprule: limit exceeded")
	// errNodeTerminated: a rule is attached to a node not yet terminated
	// (a failed precondition at the edge, by its kind).
	errNodeTerminated = fault.New(fault.Precondition, "stoprule: node is terminated")
)

// Actor is who attaches, removes or reads a rule.
type Actor struct {
	// ID is the principal id: "agent:<node id>" or "operator:<name>".
	ID string
	// NodeID is the agent's node; empty for an operator.
	NodeID string
}

// IsAgent reports whether the actor is an agent of the tree.
func (a Actor) IsAgent() bool { return a.NodeID != "" }

// Actions a rule may suggest. The hint sets the mode the proposal
// suggests; the operator's policy decides.
const (
	ActionPropose = "propose"
	ActionDrain   = "drain"
	ActionAbort   = "abort"
)

var (
	ruleName     = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)
	severityName = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,31}$`)
)

// MaxRulesPerNode bounds the rules an agent attaches to its own node, and
// apart from them those its ancestors attach to it, and those operators
// attach (and the selector rules in total), so a runaway agent cannot make
// evaluation unbounded, nor use up the room its ancestors' or an
// operator's rule needs.
const MaxRulesPerNode = 64

// MaxAgentRuleCostPerNode bounds the worst-case costs of the rules agents
// attach to one node, added up: the evaluator (one for the cluster) runs
// every rule in effect at a node each time the node reports its counters,
// so without it 64 rules each within CostBudget made one report of a
// rogue's cost the evaluator 64 near-budget evaluations. The node's own
// rules, its ancestors' on it and operators' count apart, as they do
// against MaxRulesPerNode (a node's agents' rules may cost two budgets).
const MaxAgentRuleCostPerNode = CostBudget

// Validate checks a rule's fields other than its expression.
func Validate(r *Rule) error {
	switch {
	case !ruleName.MatchString(r.Name):
		return fmt.Errorf("%w: name must be 1-63 characters of letters, digits, '.', '_' or '-', starting with a letter or digit", ErrInvalidRule)
	case r.NodeID == "" && len(r.Selector) == 0:
		return fmt.Errorf("%w: node_id or label_selector is required", ErrInvalidRule)
	case r.NodeID != "" && len(r.Selector) > 0:
		return fmt.Errorf("%w: node_id and label_selector are exclusive", ErrInvalidRule)
	case r.Severity != "" && !severityName.MatchString(r.Severity):
		return fmt.Errorf("%w: severity must be 1-32 of a-z, 0-9, '_' and '-'", ErrInvalidRule)
	case len(r.Labels) > 16:
		return fmt.Errorf("%w: labels: at most 16", ErrInvalidRule)
	case len(r.Description) > 512:
		return fmt.Errorf("%w: description is longer than 512 bytes", ErrInvalidRule)
	}
	switch r.Action {
	case "", ActionPropose, ActionDrain, ActionAbort:
	default:
		return fmt.Errorf("%w: action %q: want propose, drain or abort", ErrInvalidRule, clip(r.Action))
	}
	for k, v := range r.Labels {
		if !ruleName.MatchString(k) || len(v) > 63 || strings.ContainsAny(v, ",= \n") {
			return fmt.Errorf("%w: labels: %q is not a label (k=v, letters, digits, '.', '_', '-')", ErrInvalidRule, clip(k))
		}
	}
	return nil
}

// CheckAttach is the attenuation rule for attaching: an operator attaches
// a rule to any subtree, or by label selector; an agent attaches rules to
// its own node and its descendants only, never by selector (a selector
// reaches beyond its subtree). target is nil for a selector rule.
func CheckAttach(a Actor, target *tree.Node) error {
	if !a.IsAgent() {
		return nil
	}
	if target == nil {
		return fmt.Errorf("%w: agent %s may attach rules only to its own subtree, not by label selector", ErrDenied, a.NodeID)
	}
	if target.NodeID != a.NodeID && !tree.IsAncestor(target, a.NodeID) {
		return fmt.Errorf("%w: agent %s may attach rules only to itself and its descendants, not node_id %s", ErrDenied, a.NodeID, target.NodeID)
	}
	return nil
}

// CheckRemove is the attenuation rule for removing: an operator removes any
// rule; an agent removes a rule only when it set the rule itself or a
// descendant of it did. A rule an operator or an ancestor set is never
// removed (so never loosened: rules cannot be edited, only added and
// removed). setter is the setting agent's node, nil when an operator set
// the rule.
func CheckRemove(a Actor, r *Rule, setter *tree.Node) error {
	if !a.IsAgent() || r.SetBy == a.ID {
		return nil
	}
	if setter != nil && tree.IsAncestor(setter, a.NodeID) {
		return nil
	}
	return fmt.Errorf("%w: agent %s may not remove rule %q (%s): it was set by %s, and an agent removes only rules it or its descendants set", ErrDenied, a.NodeID, r.Name, r.RuleID, r.SetBy)
}

// errRemoveUnreadable is CheckRemove's refusal for a selector rule (an
// operator's, which an agent's node may be under): it names only the id
// the agent gave, not the rule's name nor its setter. A rule attached
// outside the agent's own node, ancestors and descendants is answered as
// one that does not exist (Rules.Remove).
func errRemoveUnreadable(a Actor, ruleID string) error {
	return fmt.Errorf("%w: agent %s may not remove rule %s: an agent removes only rules it or its descendants set", ErrDenied, a.NodeID, ruleID)
}

// readableBy reports whether agent a's own node, an ancestor of it or a
// descendant of it is the node the rule is attached to: the rules an
// agent can see by listing its subtree's rules (caller is its node, nil
// when unknown).
func readableBy(a Actor, caller, attached *tree.Node) bool {
	if caller == nil || attached == nil {
		return false
	}
	return attached.NodeID == a.NodeID || tree.IsAncestor(attached, a.NodeID) || tree.IsAncestor(caller, attached.NodeID)
}

// CheckRead: operators read every node's rules; an agent reads those of
// its own node and its descendants.
func CheckRead(a Actor, target *tree.Node) error {
	if !a.IsAgent() || target.NodeID == a.NodeID || tree.IsAncestor(target, a.NodeID) {
		return nil
	}
	return fmt.Errorf("%w: agent %s may read the rules of its own subtree only, not node_id %s", ErrDenied, a.NodeID, target.NodeID)
}

// SetterNode is the node of the agent that set a rule ("" for an operator).
func SetterNode(r *Rule) string {
	if n, ok := strings.CutPrefix(r.SetBy, "agent:"); ok {
		return n
	}
	return ""
}

// Applies reports whether rule r is in effect at node n: attached to n or
// to an ancestor of n (inherited), or a selector rule matching the labels
// of n or of one of ancestors, n's ancestor nodes (inherited likewise: the
// children of a node the rule matches live under it whatever labels their
// parent gives them, so an agent cannot spawn its way out of an operator's
// selector rule).
func Applies(r *Rule, n *tree.Node, ancestors ...*tree.Node) bool {
	if r.NodeID != "" {
		return r.NodeID == n.NodeID || tree.IsAncestor(n, r.NodeID)
	}
	if len(r.Selector) == 0 {
		return false
	}
	if tree.MatchLabels(n.Labels, r.Selector) {
		return true
	}
	for _, a := range ancestors {
		if a != nil && tree.MatchLabels(a.Labels, r.Selector) {
			return true
		}
	}
	return false
}

// InEffect returns the rules of all that are in effect at n (whose
// ancestor nodes are ancestors), each a copy marked inherited unless
// attached to n itself.
func InEffect(all []*Rule, n *tree.Node, ancestors ...*tree.Node) []*Rule {
	var out []*Rule
	for _, r := range all {
		if Applies(r, n, ancestors...) {
			c := r.clone()
			c.Inherited = r.NodeID != n.NodeID
			out = append(out, c)
		}
	}
	return out
}

// CheckName refuses a name already in effect at the target: a descendant
// cannot shadow an inherited rule with a looser one of the same name.
// (Rules.Add passes an operator only the operators' rules: an agent cannot
// keep an operator from a name by taking it first.)
func CheckName(inEffect []*Rule, name string) error {
	for _, r := range inEffect {
		if r.Name == name {
			where := "node " + r.NodeID
			if r.NodeID == "" {
				where = "a label selector"
			}
			return fmt.Errorf("%w: rule %q is already in effect here (set by %s on %s); rules only add, none is replaced", ErrDuplicate, name, r.SetBy, where)
		}
	}
	return nil
}
