package stoprule

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/controlplane/store"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/id"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor"
	"github.com/tetherhq/tether/supervisor/lease"
)

// Store key layout.
const (
	prefixAll   = "stoprules/"
	prefixRule  = "stoprules/rule/"  // stoprules/rule/<rule id> → tetherv1.StopRule
	prefixObs   = "stoprules/obs/"   // stoprules/obs/<node id> → tetherv1.StopRuleObservations (the stored counters)
	prefixSelf  = "stoprules/self/"  // stoprules/self/<node id> → tetherv1.ReportCountersResponse
	prefixFired = "stoprules/fired/" // stoprules/fired/<node id>/<rule id> → proposal id
	prefixNode  = "agents/node/"     // the supervisor's nodes (watched)
)

func ruleKey(id string) []byte            { return []byte(prefixRule + id) }
func obsKey(node string) []byte           { return []byte(prefixObs + node) }
func selfKey(node string) []byte          { return []byte(prefixSelf + node) }
func firedPrefix(node string) []byte      { return []byte(prefixFired + node + "/") }
func firedKey(node, rule string) []byte   { return []byte(prefixFired + node + "/" + rule) }
func isUnder(key []byte, p string) bool   { return strings.HasPrefix(string(key), p) }
func tail(key []byte, p string) string    { return string(key[len(p):]) }
func keyNode(key []byte, p string) string { n, _, _ := strings.Cut(tail(key, p), "/"); return n }

// LeaseLister is the lease coordinator as the rules read it.
type LeaseLister interface {
	List(ctx context.Context, holder, after string, limit int) ([]lease.Lease, string, error)
}

// Rules is the stop-rule shell: it stores rules, keeps each node's
// observed counters (as the supervisor's Observer), stores self-reported
// counters, and (Run) evaluates the rules in effect at a node whenever
// what they read changes, filing one stop proposal per rule and node.
type Rules struct {
	Store      store.Store
	Clock      clock.Clock
	Supervisor *supervisor.Supervisor
	// Policy decides the proposals rules file (supervisor.ProposalPolicy).
	Policy supervisor.ProposalPolicy
	Leases LeaseLister             // nil: no lease observations
	Grants supervisor.GrantRevoker // nil: no revocation observations
	Log    *slog.Logger
	// Tick is how often rules that read the clock (observed.age_seconds),
	// the leases or the revocations are evaluated again; zero means
	// DefaultTick.
	Tick time.Duration
	// Fault, when set, is called at "before-file" (a rule is true and its
	// proposal is about to be written) and "after-file" (written); its
	// error stops Run as a crash would. Tests only.
	Fault func(point string) error

	compiledMu sync.Mutex
	compiled   map[string]*Compiled // by expression
	stats      Stats
	poke       chan struct{}
	pokeOnce   sync.Once
}

// Stats count the evaluator's work (for the benchmark).
type Stats struct {
	Evaluations, Nodes, Fired atomic.Int64
	EvalNanos                 atomic.Int64
}

// Stats returns the evaluator's counters.
func (r *Rules) Stats() *Stats { return &r.stats }

func (r *Rules) compile(expression string) (*Compiled, error) {
	r.compiledMu.Lock()
	defer r.compiledMu.Unlock()
	if c, ok := r.compiled[expression]; ok {
		return c, nil
	}
	c, err := Compile(expression)
	if err != nil {
		return nil, err
	}
	if r.compiled == nil || len(r.compiled) > 4096 {
		r.compiled = map[string]*Compiled{}
	}
	r.compiled[expression] = c
	return c, nil
}

// Add validates, compiles and stores a rule for actor. The rule's
// node_id or selector, name, expression, action, severity, labels and
// description are taken from in; the rest is set here.
func (r *Rules) Add(ctx context.Context, a Actor, in *tetherv1.StopRule) (*tetherv1.StopRule, *Compiled, error) {
	rule := &tetherv1.StopRule{
		RuleId: id.New(id.StopRule), Name: in.Name, Expression: in.Expression, Action: in.Action,
		SetBy: a.ID, NodeId: in.NodeId, Selector: in.Selector, Severity: in.Severity, Labels: in.Labels,
		Description: in.Description, CreatedAt: timestamppb.New(r.Clock.Now()),
	}
	if rule.NodeId != "" {
		if err := id.Check(id.Node, "node_id", rule.NodeId); err != nil {
			return nil, nil, fmt.Errorf("%w: %v", ErrInvalidRule, err)
		}
	}
	if err := Validate(rule); err != nil {
		return nil, nil, err
	}
	if rule.Action == "" {
		rule.Action = ActionPropose
	}
	c, err := r.compile(rule.Expression)
	if err != nil {
		return nil, nil, err
	}
	err = r.Store.Update(ctx, func(tx store.Txn) error {
		var target *tetherv1.Node
		if rule.NodeId != "" {
			n, err := supervisor.GetNodeIn(tx, rule.NodeId)
			if err != nil {
				return err
			}
			target = n
		}
		if err := CheckAttach(a, target); err != nil {
			return err
		}
		all, err := allRules(tx)
		if err != nil {
			return err
		}
		attached := 0
		var inEffect []*tetherv1.StopRule
		for _, o := range all {
			if o.NodeId == rule.NodeId && (rule.NodeId != "" || len(o.Selector) > 0) {
				attached++
			}
			switch {
			case target != nil && Applies(o, target):
				inEffect = append(inEffect, o)
			case target == nil && (o.Name == rule.Name):
				inEffect = append(inEffect, o) // selector rules share one namespace with all
			}
		}
		if attached >= MaxRulesPerNode {
			return fmt.Errorf("%w: at most %d rules per node (and %d selector rules)", ErrLimit, MaxRulesPerNode, MaxRulesPerNode)
		}
		if err := CheckName(inEffect, rule.Name); err != nil {
			return err
		}
		return putProto(tx, ruleKey(rule.RuleId), rule)
	})
	if err != nil {
		return nil, nil, err
	}
	return rule, c, nil
}

// Remove removes a rule, if actor may (CheckRemove).
func (r *Rules) Remove(ctx context.Context, a Actor, ruleID string) (*tetherv1.StopRule, error) {
	if err := id.Check(id.StopRule, "rule_id", ruleID); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidRule, err)
	}
	var rule *tetherv1.StopRule
	err := r.Store.Update(ctx, func(tx store.Txn) error {
		rule = &tetherv1.StopRule{}
		if err := getProto(tx, ruleKey(ruleID), rule); err != nil {
			if errors.Is(err, store.ErrNotFound) {
				return fmt.Errorf("%w: rule_id %s", ErrRuleNotFound, ruleID)
			}
			return err
		}
		var setter *tetherv1.Node
		if n := SetterNode(rule); n != "" {
			s, err := supervisor.GetNodeIn(tx, n)
			if err != nil && !errors.Is(err, supervisor.ErrNodeNotFound) {
				return err
			}
			setter = s
		}
		if err := CheckRemove(a, rule, setter); err != nil {
			return err
		}
		return tx.Delete(ruleKey(ruleID))
	})
	return rule, err
}

// List returns the rules in effect at nodeID (its own, inherited and
// selector rules matching it), or every rule when nodeID is empty
// (operators only).
func (r *Rules) List(ctx context.Context, a Actor, nodeID string) ([]*tetherv1.StopRule, error) {
	if nodeID == "" && a.IsAgent() {
		return nil, fmt.Errorf("%w: agent %s must name a node_id of its subtree", ErrDenied, a.NodeID)
	}
	var out []*tetherv1.StopRule
	err := r.Store.View(ctx, func(tx store.ReadTxn) error {
		all, err := allRules(tx)
		if err != nil || nodeID == "" {
			out = all
			return err
		}
		n, err := r.readable(tx, a, nodeID)
		if err != nil {
			return err
		}
		out = InEffect(all, n)
		return nil
	})
	return out, err
}

func (r *Rules) readable(tx store.ReadTxn, a Actor, nodeID string) (*tetherv1.Node, error) {
	if err := id.Check(id.Node, "node_id", nodeID); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidRule, err)
	}
	n, err := supervisor.GetNodeIn(tx, nodeID)
	if err != nil {
		return nil, err
	}
	return n, CheckRead(a, n)
}

// TestResult is what Test answers.
type TestResult struct {
	Result
	Observed     *tetherv1.StopRuleObservations
	SelfReported map[string]float64
}

// Test evaluates an expression (or a stored rule's) against the node's
// current observations, without acting.
func (r *Rules) Test(ctx context.Context, a Actor, nodeID, expression, ruleID string) (TestResult, error) {
	if ruleID != "" {
		if err := id.Check(id.StopRule, "rule_id", ruleID); err != nil {
			return TestResult{}, fmt.Errorf("%w: %v", ErrInvalidRule, err)
		}
	}
	var n *tetherv1.Node
	var stored *tetherv1.StopRuleObservations
	var self map[string]float64
	err := r.Store.View(ctx, func(tx store.ReadTxn) error {
		var err error
		if n, err = r.readable(tx, a, nodeID); err != nil {
			return err
		}
		if ruleID != "" {
			rule := &tetherv1.StopRule{}
			if err := getProto(tx, ruleKey(ruleID), rule); err != nil {
				if errors.Is(err, store.ErrNotFound) {
					return fmt.Errorf("%w: rule_id %s", ErrRuleNotFound, ruleID)
				}
				return err
			}
			expression = rule.Expression
		}
		stored, self, err = readNode(tx, nodeID)
		return err
	})
	if err != nil {
		return TestResult{}, err
	}
	c, err := r.compile(expression)
	if err != nil {
		return TestResult{}, err
	}
	observed, err := r.snapshot(ctx, n, stored, c.UsesLeases, c.UsesRevocations)
	if err != nil {
		return TestResult{}, err
	}
	res := c.Evaluate(observed, self)
	res.Values = c.ValuesOf(observed, self)
	return TestResult{Result: res, Observed: observed, SelfReported: self}, nil
}

// Report records counters an agent reports about its own node: each value
// replaces the counter's earlier one.
func (r *Rules) Report(ctx context.Context, a Actor, nodeID string, counters map[string]float64) (map[string]float64, error) {
	if nodeID == "" {
		nodeID = a.NodeID
	}
	if !a.IsAgent() || nodeID != a.NodeID {
		return nil, fmt.Errorf("%w: counters are reported by the agent about itself only (node_id %s)", ErrDenied, nodeID)
	}
	if err := CheckCounters(counters); err != nil {
		return nil, err
	}
	var out map[string]float64
	err := r.Store.Update(ctx, func(tx store.Txn) error {
		if _, err := supervisor.GetNodeIn(tx, nodeID); err != nil {
			return err
		}
		cur := &tetherv1.ReportCountersResponse{}
		if err := getProto(tx, selfKey(nodeID), cur); err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		if cur.Counters == nil {
			cur.Counters = map[string]float64{}
		}
		maps.Copy(cur.Counters, counters)
		if len(cur.Counters) > MaxCounters {
			return fmt.Errorf("%w: counters: at most %d per node", ErrInvalidRule, MaxCounters)
		}
		out = cur.Counters
		return putProto(tx, selfKey(nodeID), cur)
	})
	return out, err
}

// ObserveCall implements supervisor.Observer: it folds the call into its
// node's counters inside the ledger's transaction.
func (r *Rules) ObserveCall(tx store.Txn, before, after *tetherv1.ToolCall) error {
	o, err := storedObs(tx, after.NodeId)
	if err != nil {
		return err
	}
	ApplyCall(o, before, after)
	return putProto(tx, obsKey(after.NodeId), o)
}

// ObserveSpawn implements supervisor.Observer: the parent's spawns and
// every ancestor's subtree size and depth, in the spawn's transaction.
func (r *Rules) ObserveSpawn(tx store.Txn, child *tetherv1.Node) error {
	loaded := map[string]*tetherv1.StopRuleObservations{}
	var firstErr error
	ApplySpawn(child, func(nodeID string) *tetherv1.StopRuleObservations {
		o, err := storedObs(tx, nodeID)
		if err != nil && firstErr == nil {
			firstErr = err
		}
		loaded[nodeID] = o
		return o
	})
	if firstErr != nil {
		return firstErr
	}
	for nodeID, o := range loaded {
		if err := putProto(tx, obsKey(nodeID), o); err != nil {
			return err
		}
	}
	return nil
}

// snapshot completes the stored counters with the node, the clock, and
// (when asked) the leases and revocations.
func (r *Rules) snapshot(ctx context.Context, n *tetherv1.Node, stored *tetherv1.StopRuleObservations, leases, revocations bool) (*tetherv1.StopRuleObservations, error) {
	o := Snapshot(stored, n, r.Clock.Now())
	if leases && r.Leases != nil {
		ls, _, err := r.Leases.List(ctx, n.NodeId, "", 1000)
		if err != nil {
			return nil, fmt.Errorf("stoprule: read the leases of %s: %w", n.NodeId, err)
		}
		for _, l := range ls {
			bump(&o.LeasesByState, strings.ToLower(l.State.String()), 1)
			if l.State == lease.StateOffered || l.State == lease.StateActive {
				o.LeasesHeld++
			}
		}
	}
	if revocations && r.Grants != nil {
		held, err := r.Grants.HeldBy(ctx, []string{n.NodeId})
		if err != nil {
			return nil, fmt.Errorf("stoprule: read the grants of %s: %w", n.NodeId, err)
		}
		for _, g := range held {
			if g.Outcome == supervisor.OutcomeRevoked {
				o.Revocations++
			}
		}
	}
	return o, nil
}

func allRules(tx store.ReadTxn) ([]*tetherv1.StopRule, error) {
	var out []*tetherv1.StopRule
	err := tx.Scan([]byte(prefixRule), nil, func(_, v []byte) error {
		rule := &tetherv1.StopRule{}
		if err := proto.Unmarshal(v, rule); err != nil {
			return err
		}
		out = append(out, rule)
		return nil
	})
	return out, err
}

// readNode reads a node's stored counters and self-reported counters.
func readNode(tx store.ReadTxn, nodeID string) (*tetherv1.StopRuleObservations, map[string]float64, error) {
	o, err := storedObs(tx, nodeID)
	if err != nil {
		return nil, nil, err
	}
	self := &tetherv1.ReportCountersResponse{}
	if err := getProto(tx, selfKey(nodeID), self); err != nil && !errors.Is(err, store.ErrNotFound) {
		return nil, nil, err
	}
	return o, self.Counters, nil
}

func storedObs(tx store.ReadTxn, nodeID string) (*tetherv1.StopRuleObservations, error) {
	o := &tetherv1.StopRuleObservations{}
	if err := getProto(tx, obsKey(nodeID), o); err != nil && !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	return o, nil
}

func putProto(tx store.Txn, key []byte, m proto.Message) error {
	b, err := proto.Marshal(m)
	if err != nil {
		return err
	}
	return tx.Put(key, b)
}

func getProto(tx store.ReadTxn, key []byte, m proto.Message) error {
	b, err := tx.Get(key)
	if err != nil {
		return err
	}
	return proto.Unmarshal(b, m)
}
