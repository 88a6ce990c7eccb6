package stoprule

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/storecodec"
	"github.com/tetherhq/tether/supervisor"
	"github.com/tetherhq/tether/supervisor/internal/kv"
	"github.com/tetherhq/tether/supervisor/lease"
	"github.com/tetherhq/tether/supervisor/ledger"
	"github.com/tetherhq/tether/supervisor/tree"
)

// Store key layout.
const (
	prefixAll     = "stoprules/"
	prefixRule    = "stoprules/rule/"    // stoprules/rule/<rule id> → Rule (as tether.v1.StopRule)
	prefixObs     = "stoprules/obs/"     // stoprules/obs/<node id> → Observations (as tether.v1.StopRuleObservations): the stored counters
	prefixGrow    = "stoprules/grow/"    // stoprules/grow/<ancestor id>/<shard> → growth: the spawns below the ancestor under parents of that shard
	prefixSub     = "stoprules/sub/"     // stoprules/sub/<ancestor id>/<shard> → subtotal: the calls of the ancestor's descendants of that shard
	prefixSubTool = "stoprules/subtool/" // stoprules/subtool/<ancestor id>/<shard>/<tool> → toolCount: their calls of one tool
	prefixSubSelf = "stoprules/subself/" // stoprules/subself/<ancestor id>/<shard> → subReported: the reported counters of the ancestor's descendants of that shard
	prefixSelf    = "stoprules/self/"    // stoprules/self/<node id> → reported (as tether.v1.ReportCountersResponse)
	prefixFired   = "stoprules/fired/"   // stoprules/fired/<node id>/<rule id> → proposal id
	prefixOn      = "stoprules/on/"      // stoprules/on/<node id>/<rule id> → "" rules attached to the node
	prefixSel     = "stoprules/sel/"     // stoprules/sel/<rule id> → "" selector rules
	// prefixSubOpen indexed, in the thirty-fourth pass, every call open
	// below an ancestor by its begin time; only the calls open across the
	// upgrade are still there (a shard's legacy calls, subtotal.legacy).
	// Outside prefixAll: the evaluator's watch never carries it (a call's
	// begin and end already wake it through prefixSub).
	prefixSubOpen = "stoprulesopen/" // stoprulesopen/<ancestor id>/<begin, Unix ms, 16 hex digits>/<node id>/<call id> → ""
	// prefixShardOpen lists the calls open below an ancestor, by shard
	// and begin time, that its shard's record does not hold in its slot
	// (subtotal.list); outside prefixAll too.
	prefixShardOpen = "stoprulesopen/s/" // stoprulesopen/s/<ancestor id>/<shard>/<begin, Unix ms, 16 hex digits>/<node id>/<call id> → ""
	// prefixPeak holds the highest subtree_calls_in_flight_max the
	// evaluator counted at a node (peak.go), written by the evaluator as
	// it rises; outside prefixAll, so its watch never carries its own
	// writes.
	prefixPeak = "stoprulespeak/" // stoprulespeak/<node id> → uvarint
	// progressKey is the evaluator's own mark under prefixAll, written
	// after it read a count's snapshot ahead of its watch (the revision,
	// a uvarint): its watch handing the mark back has handed every change
	// the snapshot holds (startPeaks).
	progressKey = "stoprules/progress" // → uvarint
)

func peakKey(node string) []byte { return []byte(prefixPeak + node) }

func subOpenPrefix(anc string) []byte { return []byte(prefixSubOpen + anc + "/") }
func subOpenKey(anc string, beginMs uint64, node, call string) []byte {
	return fmt.Appendf(nil, "%s%s/%016x/%s/%s", prefixSubOpen, anc, beginMs, node, call)
}
func shardOpenPrefix(anc string, shard uint32) []byte {
	return append(shardKey(prefixShardOpen, anc, shard, 1), '/')
}
func shardOpenKey(anc string, shard uint32, beginMs uint64, node, call string) []byte {
	return fmt.Appendf(shardOpenPrefix(anc, shard), "%016x/%s/%s", beginMs, node, call)
}

func ruleKey(id string) []byte       { return []byte(prefixRule + id) }
func onKey(node, rule string) []byte { return []byte(prefixOn + node + "/" + rule) }
func selKey(rule string) []byte      { return []byte(prefixSel + rule) }

// indexKey is where a rule is listed by what it is attached to.
func indexKey(r *Rule) []byte {
	if r.NodeID != "" {
		return onKey(r.NodeID, r.RuleID)
	}
	return selKey(r.RuleID)
}
func obsKey(node string) []byte               { return []byte(prefixObs + node) }
func growPrefix(node string) []byte           { return []byte(prefixGrow + node + "/") }
func growKey(anc string, shard uint32) []byte { return shardKey(prefixGrow, anc, shard, 0) }
func subPrefix(node string) []byte            { return []byte(prefixSub + node + "/") }
func subKey(anc string, shard uint32) []byte  { return shardKey(prefixSub, anc, shard, 0) }
func subToolPrefix(node string) []byte        { return []byte(prefixSubTool + node + "/") }
func subToolKey(anc string, shard uint32, tool string) []byte {
	return append(append(shardKey(prefixSubTool, anc, shard, 1+len(tool)), '/'), tool...)
}
func subSelfPrefix(node string) []byte           { return []byte(prefixSubSelf + node + "/") }
func subSelfKey(anc string, shard uint32) []byte { return shardKey(prefixSubSelf, anc, shard, 0) }
func selfKey(node string) []byte                 { return []byte(prefixSelf + node) }
func firedPrefix(node string) []byte             { return []byte(prefixFired + node + "/") }
func firedKey(node, rule string) []byte          { return []byte(prefixFired + node + "/" + rule) }
func isUnder(key []byte, p string) bool          { return len(key) >= len(p) && string(key[:len(p)]) == p }
func tail(key []byte, p string) string           { return string(key[len(p):]) }
func keyNode(key []byte, p string) string        { n, _, _ := strings.Cut(tail(key, p), "/"); return n }

// shardKey is prefix, anc, '/' and shard in two or more lowercase hex
// digits (fmt's %02x), with room for spare more bytes: the key of one
// shard of an ancestor's counters. Built by hand: every spawn builds one
// per ancestor on the committer, and fmt.Appendf cost about half a
// microsecond each (TestShardKeysAreFmts compares them).
func shardKey(prefix, anc string, shard uint32, spare int) []byte {
	b := make([]byte, 0, len(prefix)+len(anc)+4+spare)
	b = append(append(append(b, prefix...), anc...), '/')
	if shard < 0x10 {
		b = append(b, '0')
	}
	return strconv.AppendUint(b, uint64(shard), 16)
}

// LeaseCounter is the lease coordinator as the rules read it: every lease
// a node holds, counted by state.
type LeaseCounter interface {
	CountHeldBy(ctx context.Context, holder string) (map[lease.State]int, error)
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
	Leases LeaseCounter            // nil: no lease observations
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
	// debts are the trees' debts (what they overspent of their turns) when
	// Run's last pass ended, by root, for the next pass to keep: Run's
	// passes run one at a time.
	debts map[string]int64
	// peaks are the counts of the subtrees' calls in flight when Run's
	// last pass ended, for the next pass's scan to go on from
	// (subtreePeak.carry).
	peaks map[string]*subtreePeak
}

// Stats count the evaluator's work (for the benchmark).
type Stats struct {
	Evaluations, Nodes, Fired atomic.Int64
	EvalNanos                 atomic.Int64
}

// Stats returns the evaluator's counters.
func (r *Rules) Stats() *Stats { return &r.stats }

// compile compiles a stored rule's expression, or returns it from the
// cache of compiled expressions it keeps.
func (r *Rules) compile(expression string) (*Compiled, error) {
	return r.compileKept(expression, true)
}

// compileKept compiles expression, or returns it from the cache; keep
// says whether a fresh compile joins the cache. Only stored rules'
// expressions do (bounded by MaxRulesPerNode at each node, which its
// lineage paid for): a compiled expression holds tens of KiB, and a
// tested one is the caller's to choose afresh every time, so keeping them
// let a caller fill the server's memory with thousands of them.
func (r *Rules) compileKept(expression string, keep bool) (*Compiled, error) {
	r.compiledMu.Lock()
	c, ok := r.compiled[expression]
	r.compiledMu.Unlock()
	if ok {
		return c, nil
	}
	// Compiled outside the lock: a compile takes up to tens of
	// milliseconds, and callers' expressions (TestStopRule's included)
	// must not queue the evaluator's, nor each other's, behind it.
	c, err := Compile(expression)
	if err != nil || !keep {
		return c, err
	}
	return r.keepCompiled(c), nil
}

// isCompiled says whether expression is in the cache of compiled ones.
func (r *Rules) isCompiled(expression string) bool {
	r.compiledMu.Lock()
	defer r.compiledMu.Unlock()
	_, ok := r.compiled[expression]
	return ok
}

// MaxCompiledKept bounds the cache of stored rules' compiled expressions
// (40–70 KiB each): past it the cache is cleared, so a stored rule is not
// always held compiled, and a test of it by id is priced as its compile
// (TestPriced), as is its compile when an agent's add is checked against
// it (AddPriced).
const MaxCompiledKept = 4096

// keepCompiled puts a stored rule's compiled expression in the cache and
// returns the one kept (an equal one compiled concurrently may be there).
func (r *Rules) keepCompiled(c *Compiled) *Compiled {
	r.compiledMu.Lock()
	defer r.compiledMu.Unlock()
	if kept, ok := r.compiled[c.Expression]; ok {
		return kept
	}
	if r.compiled == nil || len(r.compiled) > MaxCompiledKept {
		r.compiled = map[string]*Compiled{}
	}
	r.compiled[c.Expression] = c
	return c
}

// Add validates, compiles and stores a rule for actor. The rule's
// node_id or selector, name, expression, action, severity, labels and
// description are taken from in; the rest is set here.
func (r *Rules) Add(ctx context.Context, a Actor, in *Rule) (*Rule, *Compiled, error) {
	return r.AddPriced(ctx, a, in, nil)
}

// AddPriced is Add that calls price, when set, with the expression of
// each rule an agent's new one is checked against (its allotment at the
// node, checkAgentCost) that is not held compiled, before it is compiled:
// its error refuses the rule. The cache of compiled expressions holds
// MaxCompiledKept and is cleared when full, and the new rule's price paid
// for its own compile alone: a rogue that cycled the cache and removed
// and re-added a rule at a node holding its allotment had each add
// compile the allotment again for one rule's price (rogue43q).
func (r *Rules) AddPriced(ctx context.Context, a Actor, in *Rule, price func(expression string) error) (*Rule, *Compiled, error) {
	rule := &Rule{
		RuleID: id.New(id.StopRule), Name: in.Name, Expression: in.Expression, Action: in.Action,
		SetBy: a.ID, NodeID: in.NodeID, Selector: in.Selector, Severity: in.Severity, Labels: in.Labels,
		Description: in.Description, CreatedAt: r.Clock.Now(),
	}
	if rule.NodeID != "" {
		if err := id.Check(id.Node, "node_id", rule.NodeID); err != nil {
			return nil, nil, fmt.Errorf("%w: %v", ErrInvalidRule, err)
		}
	}
	if err := Validate(rule); err != nil {
		return nil, nil, err
	}
	if rule.Action == "" {
		rule.Action = ActionPropose
	}
	// Kept only once the rule is stored: a refused one is not a rule.
	c, err := r.compileKept(rule.Expression, false)
	if err != nil {
		return nil, nil, err
	}
	priced := map[string]bool{} // by rule id, once should the transaction run again
	err = r.Store.Update(ctx, func(tx store.Txn) error {
		var target *tree.Node
		if rule.NodeID != "" {
			// An agent naming an id that names nothing is refused as for
			// another tree's node (tree.GetAuthorizedIn).
			n, err := tree.GetAuthorizedIn(tx, rule.NodeID, func(n *tree.Node) error { return CheckAttach(a, n) })
			if err != nil {
				return err
			}
			if n.State == tree.NodeStateTerminated {
				// Never judged again, nor any node below it: a rogue
				// attaching rules to the children it ended had them
				// stored, and compiled at each start of the evaluator.
				return fmt.Errorf("%w: node_id %s is terminated: a rule attached to it would never be judged", errNodeTerminated, rule.NodeID)
			}
			target = n
		} else if err := CheckAttach(a, nil); err != nil {
			return err
		}
		// Only the rules that can matter are read: those attached to the
		// target and its ancestors, and the selector rules (each set at
		// most MaxRulesPerNode), never every rule.
		own, err := rulesIndexed(tx, prefixOn+rule.NodeID+"/")
		if rule.NodeID == "" {
			own, err = rulesIndexed(tx, prefixSel)
		}
		if err != nil {
			return err
		}
		inEffect := own
		if target != nil {
			inEffect, err = rulesInEffect(tx, target)
			if err != nil {
				return err
			}
		}
		// The bounds count the rules of the actor's side at the node, and
		// of the agents' the node's own apart from its ancestors' (each
		// part MaxRulesPerNode, MaxAgentRuleCostPerNode): a rogue worker
		// filling its node with rules never true, or costing the whole
		// sum, cannot have its planner's rule on it refused.
		mine := sameSide(a, own)
		if a.IsAgent() && target != nil {
			mine = allotment(a, target, mine)
		}
		if attached := len(mine); attached >= MaxRulesPerNode {
			return fmt.Errorf("%w: at most %d rules per node (and %d selector rules)", ErrLimit, MaxRulesPerNode, MaxRulesPerNode)
		}
		if a.IsAgent() {
			if err := r.checkAgentCost(mine, c, price, priced); err != nil {
				return err
			}
		}
		if !a.IsAgent() {
			// An operator's rule is never blocked by the workload's: an
			// agent's rule of the same name shadows nothing an operator
			// adds (rules only add), so an agent cannot squat a name.
			inEffect = sameSide(a, inEffect)
		} else if target != nil {
			// Nor is an agent's rule blocked by its descendants': a name
			// is kept from a descendant so that it cannot shadow what is
			// inherited, and a descendant's rule shadows nothing its
			// ancestor adds. Otherwise a rogue child named a rule of its
			// own like its parent's standard rule, first, and its parent's
			// rule on it was refused.
			inEffect = notBelow(a, target, inEffect)
		}
		if err := CheckName(inEffect, rule.Name); err != nil {
			return err
		}
		if err := tx.Put(indexKey(rule), nil); err != nil {
			return err
		}
		return kv.Put(tx, ruleKey(rule.RuleID), rule)
	})
	if err != nil {
		return nil, nil, err
	}
	return rule, r.keepCompiled(c), nil
}

// checkAgentCost refuses a rule of an agent whose worst-case cost, added
// to that of the rules it counts against (attached: allotment's part of
// the agents' rules on its node), would pass MaxAgentRuleCostPerNode.
// Each attached rule not held compiled is priced (price, when set; once
// per rule id in priced) before it is compiled again.
func (r *Rules) checkAgentCost(attached []*Rule, c *Compiled, price func(expression string) error, priced map[string]bool) error {
	total := c.Cost
	for _, o := range attached {
		if price != nil && !priced[o.RuleID] && !r.isCompiled(o.Expression) {
			priced[o.RuleID] = true
			if err := price(o.Expression); err != nil {
				return err
			}
		}
		oc, err := r.compile(o.Expression)
		if err != nil {
			continue // a stored rule that no longer compiles is never evaluated
		}
		total += oc.Cost
	}
	if total > MaxAgentRuleCostPerNode {
		return fmt.Errorf("%w: the rules a node's agent attaches to it, and apart those its ancestors attach, may cost %d together in the worst case; those attached cost %d and this one %d (remove one, or write a cheaper expression)", ErrLimit, MaxAgentRuleCostPerNode, total-c.Cost, c.Cost)
	}
	return nil
}

// notBelow drops from inEffect (the rules in effect at target, which is
// in the agent a's subtree) those set by a strict descendant of a. Such a
// rule is attached to target or one of its ancestors, and its setter is
// that node or an ancestor of it (agents attach to themselves and their
// descendants only), so the setter is in target's lineage: below a when it
// comes after a there.
func notBelow(a Actor, target *tree.Node, inEffect []*Rule) []*Rule {
	lineage := append(append([]string(nil), target.Ancestors...), target.NodeID)
	at := slices.Index(lineage, a.NodeID)
	if at < 0 {
		return inEffect
	}
	below := lineage[at+1:]
	var out []*Rule
	for _, r := range inEffect {
		if n := SetterNode(r); n != "" && slices.Contains(below, n) {
			continue
		}
		out = append(out, r)
	}
	return out
}

// allotment keeps, of the agents' rules attached to target, those that
// count against agent a's next one there: the node's own when a is the
// node, else its ancestors' (an agent attaches to itself and its
// descendants only, so these are the two kinds of agents' rules on a
// node). A node filling its own part never refuses its ancestors' rules
// on it; an ancestor refused at a node below a rogue ancestor that filled
// that node's part attaches at the rogue instead, where the rule is as
// much in effect.
func allotment(a Actor, target *tree.Node, rules []*Rule) []*Rule {
	var out []*Rule
	for _, r := range rules {
		if (SetterNode(r) == target.NodeID) == (a.NodeID == target.NodeID) {
			out = append(out, r)
		}
	}
	return out
}

// sameSide keeps the rules set by the actor's side: operators' rules for an
// operator, agents' for an agent. Each side has its own MaxRulesPerNode
// at a node, so agents filling a node's rules never block an operator's.
func sameSide(a Actor, rules []*Rule) []*Rule {
	var out []*Rule
	for _, r := range rules {
		if (SetterNode(r) != "") == a.IsAgent() {
			out = append(out, r)
		}
	}
	return out
}

// Remove removes a rule, if actor may (CheckRemove).
func (r *Rules) Remove(ctx context.Context, a Actor, ruleID string) (*Rule, error) {
	if err := id.Check(id.StopRule, "rule_id", ruleID); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidRule, err)
	}
	var rule *Rule
	err := r.Store.Update(ctx, func(tx store.Txn) error {
		rule = &Rule{}
		if err := kv.Get(tx, ruleKey(ruleID), rule); err != nil {
			if errors.Is(err, store.ErrNotFound) {
				return fmt.Errorf("%w: rule_id %s", ErrRuleNotFound, ruleID)
			}
			return err
		}
		var setter *tree.Node
		if n := SetterNode(rule); n != "" {
			s, err := tree.GetNodeIn(tx, n)
			if err != nil && !errors.Is(err, tree.ErrNodeNotFound) {
				return err
			}
			setter = s
		}
		if err := CheckRemove(a, rule, setter); err != nil {
			if a.IsAgent() && !readableBy(a, nodeOrNil(tx, a.NodeID), nodeOrNil(tx, rule.NodeID)) {
				if rule.NodeID != "" {
					// As for a rule that does not exist (Test's rule_id
					// answers so): an agent learns nothing of another
					// tree's rules by naming their ids, not even that
					// one exists (rogue42N test).
					return fmt.Errorf("%w: rule_id %s", ErrRuleNotFound, ruleID)
				}
				return errRemoveUnreadable(a, ruleID)
			}
			return err
		}
		if err := tx.Delete(indexKey(rule)); err != nil {
			return err
		}
		return tx.Delete(ruleKey(ruleID))
	})
	return rule, err
}

// nodeOrNil reads a node, nil when there is none (or no id).
func nodeOrNil(tx store.ReadTxn, nodeID string) *tree.Node {
	if nodeID == "" {
		return nil
	}
	n, err := tree.GetNodeIn(tx, nodeID)
	if err != nil {
		return nil
	}
	return n
}

// List returns the rules in effect at nodeID (its own, inherited and
// selector rules matching it), or every rule when nodeID is empty
// (operators only).
func (r *Rules) List(ctx context.Context, a Actor, nodeID string) ([]*Rule, error) {
	if nodeID == "" && a.IsAgent() {
		return nil, fmt.Errorf("%w: agent %s must name a node_id of its subtree", ErrDenied, a.NodeID)
	}
	var out []*Rule
	err := r.Store.View(ctx, func(tx store.ReadTxn) error {
		if nodeID == "" {
			var err error
			out, err = allRules(tx)
			return err
		}
		n, err := r.readable(tx, a, nodeID)
		if err != nil {
			return err
		}
		rules, err := rulesInEffect(tx, n) // only those in effect
		for _, r := range rules {
			c := r.clone()
			c.Inherited = r.NodeID != n.NodeID
			out = append(out, c)
		}
		return err
	})
	return out, err
}

// MaxListPage is the most rules a ListPage answers: a rule is up to some
// 5 KB (a 2 KiB expression, a 512-byte description, 16 labels of 63
// characters each side), so a page stays under the 4 MiB the control
// plane pages its long answers to stay under. Until the forty-seventh
// pass every rule was answered at once, and a rogue that filled its
// chain's nodes with its allotments had one request buy a listing of
// thousands (rogue47e tests).
const MaxListPage = 500

// ListPage is List a page at a time: at most pageSize rules (0, or more
// than MaxListPage, means MaxListPage), from after pageToken (the next
// token of the previous page about the same node; empty for the first),
// and the next page's token, empty when no rule follows. Every rule
// (nodeID empty, operators only) is listed by rule id; a node's rules in
// effect in List's order: the selector rules in effect by rule id, then
// the rules attached to each node of its lineage, root first, each by
// rule id. A page reads the records it answers, one more to learn whether
// any follows, and the selector rules (at most MaxRulesPerNode) to judge
// which are in effect; never the rest of the listing.
func (r *Rules) ListPage(ctx context.Context, a Actor, nodeID, pageToken string, pageSize int) ([]*Rule, string, error) {
	if nodeID == "" && a.IsAgent() {
		return nil, "", fmt.Errorf("%w: agent %s must name a node_id of its subtree", ErrDenied, a.NodeID)
	}
	if pageSize <= 0 || pageSize > MaxListPage {
		pageSize = MaxListPage
	}
	var out []*Rule
	var next string
	err := r.Store.View(ctx, func(tx store.ReadTxn) error {
		out, next = nil, ""
		if nodeID == "" {
			var start []byte
			if pageToken != "" {
				if err := id.Check(id.StopRule, "page_token", pageToken); err != nil {
					return fmt.Errorf("%w: %v", ErrInvalidRule, err)
				}
				start = append(ruleKey(pageToken), 0)
			}
			return tx.Scan([]byte(prefixRule), start, func(_, v []byte) error {
				if len(out) == pageSize {
					next = out[len(out)-1].RuleID
					return store.ErrStopScan
				}
				rule := &Rule{}
				if err := storecodec.Unmarshal(v, rule); err != nil {
					return err
				}
				out = append(out, rule)
				return nil
			})
		}
		n, err := r.readable(tx, a, nodeID)
		if err != nil {
			return err
		}
		out, next, err = rulesInEffectPage(tx, n, pageToken, pageSize)
		return err
	})
	return out, next, err
}

// rulesInEffectPage is a page of rulesInEffect's rules, each a copy
// marked inherited unless attached to n: the index's keys are read in
// order, from pageToken (the last listed rule's index key, past
// prefixAll), and only the records of the rules answered.
func rulesInEffectPage(tx store.ReadTxn, n *tree.Node, pageToken string, pageSize int) ([]*Rule, string, error) {
	prefixes := []string{prefixSel}
	for _, id := range append(append([]string(nil), n.Ancestors...), n.NodeID) {
		prefixes = append(prefixes, prefixOn+id+"/")
	}
	from, start := 0, []byte(nil)
	if pageToken != "" {
		key := prefixAll + pageToken
		from = -1
		for i, p := range prefixes {
			if strings.HasPrefix(key, p) && id.Check(id.StopRule, "page_token", key[len(p):]) == nil {
				from, start = i, append([]byte(key), 0)
				break
			}
		}
		if from < 0 {
			return nil, "", fmt.Errorf("%w: page_token is not a rule in effect at node %s", ErrInvalidRule, n.NodeID)
		}
	}
	type listed struct {
		key  string
		rule *Rule
	}
	var page []listed
	var ancestors []*tree.Node
	read := false
	for i := from; i < len(prefixes) && len(page) <= pageSize; i++ {
		p := prefixes[i]
		var keys []string
		if err := tx.Scan([]byte(p), start, func(k, _ []byte) error {
			// Every selector rule from start (at most MaxRulesPerNode),
			// to judge which apply; of a node's, every one applies.
			if i > 0 && len(page)+len(keys) > pageSize {
				return store.ErrStopScan
			}
			keys = append(keys, string(k))
			return nil
		}); err != nil {
			return nil, "", err
		}
		start = nil
		ids := make([]string, len(keys))
		for j, k := range keys {
			ids[j] = k[len(p):]
		}
		rules, err := rulesByID(tx, ids)
		if err != nil {
			return nil, "", err
		}
		for j, rule := range rules {
			if i == 0 && !tree.MatchLabels(n.Labels, rule.Selector) && !read {
				// A selector rule not matching n may be inherited.
				if ancestors, err = ancestorNodes(tx, n); err != nil {
					return nil, "", err
				}
				read = true
			}
			if !Applies(rule, n, ancestors...) || len(page) > pageSize {
				continue
			}
			c := rule.clone()
			c.Inherited = rule.NodeID != n.NodeID
			page = append(page, listed{keys[j], c})
		}
	}
	next := ""
	if len(page) > pageSize {
		page = page[:pageSize]
		next = strings.TrimPrefix(page[pageSize-1].key, prefixAll)
	}
	out := make([]*Rule, len(page))
	for i, l := range page {
		out[i] = l.rule
	}
	return out, next, nil
}

func (r *Rules) readable(tx store.ReadTxn, a Actor, nodeID string) (*tree.Node, error) {
	if err := id.Check(id.Node, "node_id", nodeID); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidRule, err)
	}
	n, err := tree.GetNodeIn(tx, nodeID)
	if err != nil {
		return nil, err
	}
	if CheckRead(a, n) != nil {
		// Answered as a node that does not exist (the tree's own
		// not-found), so an agent cannot learn by its id whether a node
		// outside its subtree exists.
		return nil, fmt.Errorf("%w: %s", tree.ErrNodeNotFound, nodeID)
	}
	return n, nil
}

// testable reports whether a may test the stored rule against n: an
// operator any rule; an agent a rule in effect at n (attached to n or an
// ancestor, or a selector rule matching n or an ancestor) or attached in
// its own subtree, as ListStopRules shows it.
func testable(tx store.ReadTxn, a Actor, rule *Rule, n *tree.Node) (bool, error) {
	if !a.IsAgent() {
		return true, nil
	}
	if rule.NodeID != "" {
		if Applies(rule, n) {
			return true, nil
		}
		at, err := tree.GetNodeIn(tx, rule.NodeID)
		if errors.Is(err, tree.ErrNodeNotFound) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		return CheckRead(a, at) == nil, nil
	}
	ancestors := make([]*tree.Node, 0, len(n.Ancestors))
	for _, id := range n.Ancestors {
		anc, err := tree.GetNodeIn(tx, id)
		if err != nil && !errors.Is(err, tree.ErrNodeNotFound) {
			return false, err
		}
		ancestors = append(ancestors, anc)
	}
	return Applies(rule, n, ancestors...), nil
}

// TestResult is what Test answers.
type TestResult struct {
	Result
	Observed     *Observations
	SelfReported map[string]float64
	// DecodedBytes is the size of the subtree's records the test decoded
	// (counts by tool, reported counters: for an expression that reads
	// them; the growth and call totals past their first 4 KiB; the node's
	// own open calls, 128 bytes each, for an expression on call time; the
	// grants the node holds, 1 KiB each, for an expression on
	// revocations): the caller's price.
	DecodedBytes int
}

// Test evaluates an expression (or a stored rule's) against the node's
// current observations, without acting.
func (r *Rules) Test(ctx context.Context, a Actor, nodeID, expression, ruleID string) (TestResult, error) {
	return r.TestPriced(ctx, a, nodeID, expression, ruleID, nil)
}

// TestPriced is Test that calls price, when set, with a stored rule's
// expression (the rule named by ruleID) once a may test it and before it
// is compiled: its error refuses the test. The caller prices the compile
// whether or not the expression is in the cache of compiled ones, which
// holds MaxCompiledKept and is cleared when full: a rogue that cycled
// through more stored rules than that, testing each by id, had every
// test compile its expression for the call alone (rogue43d).
func (r *Rules) TestPriced(ctx context.Context, a Actor, nodeID, expression, ruleID string, price func(expression string) error) (TestResult, error) {
	if ruleID != "" {
		if err := id.Check(id.StopRule, "rule_id", ruleID); err != nil {
			return TestResult{}, fmt.Errorf("%w: %v", ErrInvalidRule, err)
		}
	}
	var n *tree.Node
	var stored *Observations
	var self map[string]float64
	var sums *reportedSums
	var c *Compiled
	var decoded int
	priced := false
	err := r.Store.View(ctx, func(tx store.ReadTxn) error {
		var err error
		if n, err = r.readable(tx, a, nodeID); err != nil {
			return err
		}
		if ruleID != "" {
			rule := &Rule{}
			if err := kv.Get(tx, ruleKey(ruleID), rule); err != nil {
				if errors.Is(err, store.ErrNotFound) {
					return fmt.Errorf("%w: rule_id %s", ErrRuleNotFound, ruleID)
				}
				return err
			}
			if ok, err := testable(tx, a, rule, n); err != nil || !ok {
				if err == nil {
					// As for a rule that does not exist: an agent learns
					// nothing of another tree's rules, not even that one
					// exists (nor, by trying its own counters against it,
					// its thresholds).
					err = fmt.Errorf("%w: rule_id %s", ErrRuleNotFound, ruleID)
				}
				return err
			}
			expression = rule.Expression
			if price != nil && !priced {
				// Once, should the transaction run again.
				priced = true
				if err := price(expression); err != nil {
					return err
				}
			}
		}
		// Compiled first: the subtree's counts by tool are decoded only
		// for an expression that reads them.
		if c, err = r.compileKept(expression, ruleID != ""); err != nil {
			return err
		}
		if stored, self, decoded, err = readNodeTools(tx, nodeID, c.UsesSubtreeTools); err != nil {
			return err
		}
		if c.UsesSubtreePeak {
			// The peak the evaluator counted and kept, not the level alone.
			if err := peakFloor(tx, nodeID, stored); err != nil {
				return err
			}
		}
		if c.UsesCallTime {
			// The node's own open calls, each a call record read: priced
			// as the evaluator charges them (openCallsPerRead to a read of
			// subtreeToolsBytesPerRead).
			n, err := readOwnOpenCalls(tx, nodeID, stored)
			if err != nil {
				return err
			}
			decoded += n * (subtreeToolsBytesPerRead / openCallsPerRead)
		}
		if !c.UsesSubtreeReported {
			return nil
		}
		var size int
		sums, size, err = readSubtreeReportedSize(tx, nodeID, self)
		decoded += size
		return err
	})
	if err != nil {
		return TestResult{}, err
	}
	observed, grants, err := r.snapshot(ctx, n, stored, c.UsesLeases, c.UsesRevocations)
	if err != nil {
		return TestResult{}, err
	}
	// The grants the node holds, each read with its chain for
	// observed.revocations: priced as the evaluator charges them
	// (grantsPerRead to a read of subtreeToolsBytesPerRead).
	decoded += grants * (subtreeToolsBytesPerRead / grantsPerRead)
	res := c.evaluate(observed, self, sums)
	res.Values = c.values(observed, self, sums)
	return TestResult{Result: res, Observed: observed, SelfReported: self, DecodedBytes: decoded}, nil
}

// Report records counters an agent reports about its own node: each value
// replaces the counter's earlier one. What the report changes is added,
// in the same transaction, to one record of each of the node's ancestors
// (subtree_reported), at most the tree's depth of them.
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
		if _, err := tree.GetNodeIn(tx, nodeID); err != nil {
			return err
		}
		cur := &reported{}
		if err := kv.Get(tx, selfKey(nodeID), cur); err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		if cur.Counters == nil {
			cur.Counters = map[string]float64{}
		}
		d := reportChange(cur.Counters, counters)
		maps.Copy(cur.Counters, counters)
		if len(cur.Counters) > MaxCounters {
			return fmt.Errorf("%w: counters: at most %d per node", ErrInvalidRule, MaxCounters)
		}
		out = cur.Counters
		if err := kv.Put(tx, selfKey(nodeID), cur); err != nil {
			return err
		}
		if len(d) == 0 {
			return nil
		}
		return reportToAncestors(tx, nodeID, d)
	})
	return out, err
}

// CallCount returns the calls the ledger holds begun by the node (its
// stored counter; refusals while it stopped are not counted), for the
// supervisor's proposal conditions (supervisor.Supervisor.CallCount).
func (r *Rules) CallCount(tx store.ReadTxn, nodeID string) (int64, error) {
	o, err := storedObs(tx, nodeID)
	if err != nil {
		return 0, err
	}
	return o.Calls, nil
}

// ObservedKeys implements ledger.KeyedObserver: ObserveCall reads, for a
// call's end, the node's observations, its node (for its ancestors) and
// the node's shard of each ancestor's subtree totals (addToAncestors; a
// failed end reads the shard's count of the tool too, not fetched here:
// few ends fail, and every end would fetch it).
func (r *Rules) ObservedKeys(nodeID string, ancestors []string) [][]byte {
	keys := make([][]byte, 0, 2+len(ancestors))
	keys = append(keys, obsKey(nodeID), tree.NodeKey(nodeID))
	shard := growShard(nodeID)
	for _, a := range ancestors {
		keys = append(keys, subKey(a, shard))
	}
	return keys
}

// ObserveCall implements ledger.Observer: it folds the call into its
// node's counters inside the ledger's transaction.
//
// A call begun, or ended failed, also counts itself into the subtree
// totals of each of the node's ancestors (subtree_calls,
// subtree_failures), in a record of each ancestor chosen by the node
// (subShards of them): a rule judging an ancestor on its subtree sees the
// calls however they are split among its descendants. The work is one
// record per ancestor (at most the tree's depth), never a walk of a
// subtree; a node's calls share its records with its own counters' key
// anyway, and calls of different nodes share none but by a hash
// collision, so the root's records are not one hot key.
func (r *Rules) ObserveCall(tx store.Txn, before, after *ledger.ToolCall) error {
	o, err := storedObs(tx, after.NodeID)
	if err != nil {
		return err
	}
	calls, failures := o.Calls, o.Failures
	ApplyCall(o, before, after)
	if err := kv.Put(tx, obsKey(after.NodeID), o); err != nil {
		return err
	}
	// The change, of after's tool: a call begins or fails once, so the
	// change is one call or one failure of it; a call ends once, so it
	// adds one outcome and its duration.
	d := subtotal{calls: uint64(o.Calls - calls), failures: uint64(o.Failures - failures)}
	if end, ok := callEnd(before, after); ok {
		d.addEnd(end)
	}
	// A call open counts its time at its ancestors while it stays open
	// (the shard's open calls and their begin times); its end takes it
	// out. A call begun and ended at once, or refused, was never open.
	switch {
	case before == nil && after.State != ledger.CallStateEnded && after.Resolution != ledger.CallResolutionRejectedDraining:
		d.open, d.openMs = 1, callMillis(after.BegunAt)
	case before != nil && before.State != ledger.CallStateEnded && after.State == ledger.CallStateEnded:
		d.closed, d.closedMs = 1, callMillis(before.BegunAt)
	}
	if d == (subtotal{}) {
		return nil
	}
	return addToAncestors(tx, after.NodeID, d, after.Tool, after.CallID)
}

// addToAncestors adds d, a change of tool's calls, to the subtree records
// of node's ancestors (the node's shard of each): the shard's totals, and,
// when d begins or fails a call, the shard's count of the tool, a record
// of its own, so that a call writes a few dozen bytes per ancestor
// whatever other tools the shard counts (a rogue that filled its shards
// with MaxTools long names does not make each later call rewrite them at
// every ancestor). A call's end writes the totals alone (its outcome and
// duration), and a failed end the tool's count too. A shard tracks at
// most MaxTools tools (subtotal.tracked); a further tool is counted under
// OtherTool, as is every later call of it (the shard stays full).
//
// A call's begin also lists it at each ancestor by its begin time
// (subOpenKey), and its end takes it out: the subtree's longest open call
// is the first call listed, exact however many short calls are kept open
// beside it (the shard's count and begin times added up gave only their
// mean, which a rogue lowered at will).
func addToAncestors(tx store.Txn, nodeID string, d subtotal, tool, callID string) error {
	byTool := d.calls > 0 || d.failures > 0
	keysOf := func(anc string, shard uint32) [][]byte {
		if !byTool {
			return [][]byte{subKey(anc, shard)}
		}
		return [][]byte{subKey(anc, shard), subToolKey(anc, shard, tool), subToolKey(anc, shard, OtherTool)}
	}
	return eachAncestorRecord(tx, nodeID, keysOf, func(anc string, keys [][]byte) error {
		s, err := getSubtotal(tx, keys[0])
		if err != nil {
			return err
		}
		if err := s.list(tx, anc, growShard(nodeID), d, nodeID, callID); err != nil {
			return err
		}
		s.add(d)
		if held := s.held(); s.open < held {
			// The shard's count went below the calls it holds past a
			// call open from before the records counted open calls
			// (subtotal.add): those it holds are still open.
			s.open, s.openMs = held, s.slotMs+s.listedSum
		}
		if !byTool {
			return tx.Put(keys[0], s.append(nil))
		}
		key := keys[1]
		c, err := getToolCount(tx, key)
		switch {
		case errors.Is(err, store.ErrNotFound) && tool != OtherTool && s.tracked < MaxTools:
			s.tracked++
			err = nil
		case errors.Is(err, store.ErrNotFound):
			key = keys[2]
			c, err = getToolCount(tx, key)
			if errors.Is(err, store.ErrNotFound) {
				err = nil
			}
		}
		if err != nil {
			return err
		}
		c.calls += d.calls
		c.failures += d.failures
		if err := tx.Put(key, c.append(nil)); err != nil {
			return err
		}
		return tx.Put(keys[0], s.append(nil))
	})
}

// list keeps the ancestor anc's account of the call callID of nodeID
// that d begins open or ends (s is the record of the node's shard at
// anc): a call begun in a shard whose slot is free takes the slot, held
// in the record itself; any other is listed under the shard's
// shardOpenPrefix at anc, and the record keeps how many are listed, their
// begin times added up and the earliest (listedLow). Its end frees the
// slot or deletes its listing; when it was the earliest listed, the next
// is the only one left (their begin times added up) or the first key of
// the shard's listing after it, each listing deleted so stepped over once
// by the end of the call listed before it, in that call's transaction.
// Every call open below anc is so either a slot's or listed, and the
// subtree's oldest open call is the oldest of its shards' slots and
// earliest listed, read from the records alone: exact, and no scan of a
// listing a rogue filled with ended calls. A call alone in its shard (a
// worker calling one tool at a time, a chain of agents each calling in
// turn) writes no key but the record it writes anyway.
func (s *subtotal) list(tx store.Txn, anc string, shard uint32, d subtotal, nodeID, callID string) error {
	switch {
	case d.open > 0 && s.slotCall == "":
		s.slotMs, s.slotCall = d.openMs, callID
	case d.open > 0:
		if s.listed == 0 || d.openMs < s.listedLow {
			s.listedLow = d.openMs
		}
		s.listed++
		s.listedSum += d.openMs
		return tx.Put(shardOpenKey(anc, shard, d.openMs, nodeID, callID), nil)
	case d.closed > 0 && s.slotCall == callID:
		s.slotMs, s.slotCall = 0, ""
	case d.closed > 0:
		key := shardOpenKey(anc, shard, d.closedMs, nodeID, callID)
		if s.legacy() > 0 {
			// Listed by the thirty-fourth pass, or by this one?
			_, err := tx.Get(key)
			if errors.Is(err, store.ErrNotFound) {
				return tx.Delete(subOpenKey(anc, d.closedMs, nodeID, callID))
			}
			if err != nil {
				return err
			}
		}
		if s.listed == 0 {
			return nil // a call that was open before the records counted them
		}
		if err := tx.Delete(key); err != nil {
			return err
		}
		s.listed--
		s.listedSum -= min(s.listedSum, d.closedMs)
		switch {
		case s.listed == 0:
			s.listedLow, s.listedSum = 0, 0
		case s.listed == 1:
			s.listedLow = s.listedSum
		case d.closedMs <= s.listedLow:
			// The earliest ended: the next is the first listed from its
			// begin time on (another may have begun in the same
			// millisecond and sort before it), itself deleted.
			s.listedLow = d.closedMs
			prefix := shardOpenPrefix(anc, shard)
			err := tx.Scan(prefix, fmt.Appendf(prefix, "%016x", d.closedMs), func(k, _ []byte) error {
				if bytes.Equal(k, key) {
					return nil
				}
				ms, err := openKeyMillis(k, len(prefix))
				if err != nil {
					return err
				}
				s.listedLow = ms
				return store.ErrStopScan
			})
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// openKeyMillis reads the begin time of a listing key whose prefix is
// the first n bytes.
func openKeyMillis(k []byte, n int) (uint64, error) {
	rest := k[n:]
	if len(rest) < 16 {
		return 0, fmt.Errorf("stoprule: corrupt open call key %q", k)
	}
	ms, err := strconv.ParseUint(string(rest[:16]), 16, 64)
	if err != nil {
		return 0, fmt.Errorf("stoprule: corrupt open call key %q", k)
	}
	return ms, nil
}

// reportToAncestors adds the change d of node's reported counters to the
// subtree records of its ancestors (the node's shard of each).
func reportToAncestors(tx store.Txn, nodeID string, d map[string]float64) error {
	keysOf := func(anc string, shard uint32) [][]byte { return [][]byte{subSelfKey(anc, shard)} }
	return eachAncestorRecord(tx, nodeID, keysOf, func(_ string, keys [][]byte) error {
		key := keys[0]
		rec := &subReported{}
		if err := kv.Get(tx, key, rec); err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		rec.add(d)
		return kv.Put(tx, key, rec)
	})
}

// eachAncestorRecord calls add with the keys of node's records (its
// shard's, keysOf) at each of its ancestors, all read together first: at
// most the tree's depth of them, never a walk of a subtree. A node not
// stored has none (a call of no stored node: the ledger refuses those).
func eachAncestorRecord(tx store.Txn, nodeID string, keysOf func(anc string, shard uint32) [][]byte, add func(anc string, keys [][]byte) error) error {
	n, err := tree.GetNodeIn(tx, nodeID)
	if errors.Is(err, tree.ErrNodeNotFound) {
		return nil
	}
	if err != nil || len(n.Ancestors) == 0 {
		return err
	}
	shard := growShard(nodeID)
	each := make([][][]byte, len(n.Ancestors))
	var all [][]byte
	for i, a := range n.Ancestors {
		each[i] = keysOf(a, shard)
		all = append(all, each[i]...)
	}
	if err := store.Prefetch(tx, all, nil); err != nil {
		return err
	}
	for i, keys := range each {
		if err := add(n.Ancestors[i], keys); err != nil {
			return err
		}
	}
	return nil
}

// subtotal is one record of an ancestor's subtree totals: the calls begun
// by its descendants of one shard, those that ended failed, how many tools
// the shard counts apart (its toolCount records, at most MaxTools), the
// calls that ended by each of the other outcomes (subtreeOutcomes), and
// the nanoseconds the ended calls took, in total and the longest. Stored
// as those uvarints in that order, cut after the failures or the tracked
// tools when the rest are 0: a record an earlier version wrote, the two
// totals alone or with the tracked tools, counts no tool, outcome or time.
type subtotal struct {
	calls, failures, tracked uint64
	ended                    [len(subtreeOutcomes)]uint64
	nanos, maxNanos          uint64
	// open counts the calls of the shard's descendants still open, and
	// openMs their begin times added up (Unix milliseconds): stored after
	// maxNanos while a call is open (a record of an earlier version has
	// none). closed and closedMs are a change's alone, never stored: a
	// call's end taking it out.
	open, openMs     uint64
	closed, closedMs uint64
	// slotCall is the id of one call of the shard still open that is not
	// listed, and slotMs its begin time; listed counts the shard's calls
	// open listed under shardOpenPrefix, listedSum their begin times added
	// up and listedLow the earliest (subtotal.list). Stored after openMs
	// while the shard holds a call so (slotMs, the id's length, the id,
	// listed, listedLow, listedSum); a record without them counts calls
	// open only as earlier versions did (legacy).
	slotMs                       uint64
	slotCall                     string
	listed, listedLow, listedSum uint64
}

// held is how many of s's open calls it holds in its slot or listed.
func (s subtotal) held() uint64 {
	n := s.listed
	if s.slotCall != "" {
		n++
	}
	return n
}

// legacy is how many of s's open calls it neither holds in its slot nor
// lists: calls begun by an earlier version (the thirty-fourth listed them
// under subOpenPrefix).
func (s subtotal) legacy() uint64 { return s.open - min(s.open, s.held()) }

// subtreeOutcomes are the outcomes a subtotal counts, in its stored order,
// besides failed (its failures).
var subtreeOutcomes = [...]ledger.CallResolution{
	ledger.CallResolutionCompleted, ledger.CallResolutionCancelledAcked,
	ledger.CallResolutionCancelUnacknowledged, ledger.CallResolutionRejectedDraining,
}

// addEnd counts a call's end: its outcome and how long it took.
func (s *subtotal) addEnd(e callEnding) {
	if i := slices.Index(subtreeOutcomes[:], e.resolution); i >= 0 {
		s.ended[i]++
	}
	if e.took > 0 {
		s.nanos = addSaturating(s.nanos, uint64(e.took))
		s.maxNanos = max(s.maxNanos, uint64(e.took))
	}
}

// addSaturating is a+b, or the largest uint64 past it: call time added up
// over a subtree's calls never wraps to read as little.
func addSaturating(a, b uint64) uint64 {
	if a > math.MaxUint64-b {
		return math.MaxUint64
	}
	return a + b
}

// add folds the change d into s (its tracked tools apart).
func (s *subtotal) add(d subtotal) {
	s.calls += d.calls
	s.failures += d.failures
	for i, n := range d.ended {
		s.ended[i] += n
	}
	s.nanos = addSaturating(s.nanos, d.nanos)
	s.maxNanos = max(s.maxNanos, d.maxNanos)
	s.open += d.open
	s.openMs += d.openMs
	if d.closed > 0 {
		// A call open before the records counted open calls (an earlier
		// version) ends uncounted: the count never goes below 0, and none
		// open means no begin times.
		if s.open >= d.closed && s.openMs >= d.closedMs {
			s.open -= d.closed
			s.openMs -= d.closedMs
		} else {
			s.open = 0
		}
		if s.open == 0 {
			s.openMs = 0
		}
	}
}

// ends reports whether s counts any outcome or time.
func (s subtotal) ends() bool {
	return s.ended != [len(subtreeOutcomes)]uint64{} || s.nanos != 0 || s.maxNanos != 0
}

// opens reports whether s counts calls open.
func (s subtotal) opens() bool { return s.open != 0 || s.openMs != 0 || s.held() != 0 }

func (s subtotal) append(b []byte) []byte {
	b = binary.AppendUvarint(binary.AppendUvarint(b, s.calls), s.failures)
	if s.tracked == 0 && !s.ends() && !s.opens() {
		return b
	}
	b = binary.AppendUvarint(b, s.tracked)
	if !s.ends() && !s.opens() {
		return b
	}
	for _, n := range s.ended {
		b = binary.AppendUvarint(b, n)
	}
	b = binary.AppendUvarint(binary.AppendUvarint(b, s.nanos), s.maxNanos)
	if !s.opens() {
		return b
	}
	b = binary.AppendUvarint(binary.AppendUvarint(b, s.open), s.openMs)
	if s.held() == 0 {
		return b
	}
	b = binary.AppendUvarint(binary.AppendUvarint(b, s.slotMs), uint64(len(s.slotCall)))
	b = append(b, s.slotCall...)
	return binary.AppendUvarint(binary.AppendUvarint(binary.AppendUvarint(b, s.listed), s.listedLow), s.listedSum)
}

// maxSlotCall bounds the length of a stored slot's call id (the server's
// are 22 bytes).
const maxSlotCall = 64

func getSubtotal(tx store.ReadTxn, key []byte) (subtotal, error) {
	v, err := tx.Get(key)
	if errors.Is(err, store.ErrNotFound) {
		return subtotal{}, nil
	}
	if err != nil {
		return subtotal{}, err
	}
	return decodeSubtotal(v)
}

func decodeSubtotal(v []byte) (subtotal, error) {
	var s subtotal
	rest, err := readUvarints(v, "subtree", &s.calls, &s.failures)
	if err != nil || len(rest) == 0 {
		return s, err
	}
	if rest, err = readUvarints(rest, "subtree", &s.tracked); err != nil || len(rest) == 0 {
		return s, err
	}
	fields := []*uint64{}
	for i := range s.ended {
		fields = append(fields, &s.ended[i])
	}
	if rest, err = readUvarints(rest, "subtree", append(fields, &s.nanos, &s.maxNanos)...); err != nil || len(rest) == 0 {
		if err != nil {
			return subtotal{}, err
		}
		return s, nil
	}
	if rest, err = readUvarints(rest, "subtree", &s.open, &s.openMs); err != nil || len(rest) == 0 {
		if err != nil {
			return subtotal{}, err
		}
		return s, nil
	}
	var size uint64
	if rest, err = readUvarints(rest, "subtree", &s.slotMs, &size); err != nil {
		return subtotal{}, err
	}
	if size > maxSlotCall || uint64(len(rest)) < size {
		return subtotal{}, fmt.Errorf("stoprule: corrupt subtree record: slot of %d bytes", size)
	}
	s.slotCall, rest = string(rest[:size]), rest[size:]
	if err := decodeUvarints(rest, "subtree", &s.listed, &s.listedLow, &s.listedSum); err != nil {
		return subtotal{}, err
	}
	return s, nil
}

// toolCount is one shard's count of one tool at an ancestor: the calls of
// it begun by the ancestor's descendants of the shard, and those ended
// failed. Stored as the two uvarints.
type toolCount struct{ calls, failures uint64 }

func (c toolCount) append(b []byte) []byte {
	return binary.AppendUvarint(binary.AppendUvarint(b, c.calls), c.failures)
}

// getToolCount reads the count at key: store.ErrNotFound (and a zero
// count) when the shard does not count the tool apart.
func getToolCount(tx store.ReadTxn, key []byte) (toolCount, error) {
	v, err := tx.Get(key)
	if err != nil {
		return toolCount{}, err
	}
	var c toolCount
	if err := decodeUvarints(v, "subtree tool", &c.calls, &c.failures); err != nil {
		return toolCount{}, err
	}
	return c, nil
}

// decodeUvarints reads v, a record of what (the growth or subtree
// records), as exactly len(fields) uvarints into fields.
func decodeUvarints(v []byte, what string, fields ...*uint64) error {
	rest, err := readUvarints(v, what, fields...)
	if err != nil {
		return err
	}
	if len(rest) != 0 {
		return fmt.Errorf("stoprule: corrupt %s record: trailing bytes", what)
	}
	return nil
}

// readUvarints reads len(fields) uvarints of v, a record of what, into
// fields, and returns the bytes after them.
func readUvarints(v []byte, what string, fields ...*uint64) ([]byte, error) {
	size := len(v)
	for _, f := range fields {
		x, n := binary.Uvarint(v)
		if n <= 0 {
			return nil, fmt.Errorf("stoprule: corrupt %s record of %d bytes", what, size)
		}
		*f, v = x, v[n:]
	}
	return v, nil
}

// ObserveSpawn implements tree.Observer: the parent's spawns and
// every ancestor's subtree size and depth, in the spawn's transaction. The
// ancestors' spawn counters are kept in growShards records per ancestor,
// the record chosen by the spawn's parent, beside the counters the ledger
// writes: spawns under one parent share one record (they share the
// parent's child count anyway), and spawns under different parents share
// none but by a hash collision, so concurrent spawns across a tree do not
// all read and rewrite the root's counters (on etcd, 64 clients under one
// root had conflicted once per spawn). Readers add the records up
// (readNode); every spawn is in exactly one record of each ancestor.
func (r *Rules) ObserveSpawn(tx store.Txn, child *tree.Node) error {
	n := len(child.Ancestors)
	shard := growShard(child.ParentNodeID)
	for i, a := range child.Ancestors {
		key := growKey(a, shard)
		g, err := getGrowth(tx, key)
		if err != nil {
			return err
		}
		below := uint64(n - i)
		g.nodes++
		g.depth = max(g.depth, below)
		if below == 1 {
			g.children++
		}
		if err := tx.Put(key, g.append(nil)); err != nil {
			return err
		}
	}
	return nil
}

// growShards is how many growth records an ancestor's spawn counters are
// spread over: a reader adds up to this many small records.
const growShards = 256

func growShard(parentID string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(parentID))
	return h.Sum32() % growShards
}

// growth is one record of an ancestor's spawn counters: the nodes spawned
// below it (under parents of one shard), the deepest of them (levels
// below), and how many are its children.
type growth struct{ nodes, depth, children uint64 }

func (g growth) append(b []byte) []byte {
	return binary.AppendUvarint(binary.AppendUvarint(binary.AppendUvarint(b, g.nodes), g.depth), g.children)
}

func decodeGrowth(v []byte) (growth, error) {
	var g growth
	if err := decodeUvarints(v, "growth", &g.nodes, &g.depth, &g.children); err != nil {
		return growth{}, err
	}
	return g, nil
}

func getGrowth(tx store.ReadTxn, key []byte) (growth, error) {
	v, err := tx.Get(key)
	if errors.Is(err, store.ErrNotFound) {
		return growth{}, nil
	}
	if err != nil {
		return growth{}, err
	}
	return decodeGrowth(v)
}

// snapshot completes the stored counters with the node, the clock, and
// (when asked) the leases and revocations, and says how many grants it
// read for the revocations (each with its chain: the caller prices them,
// grantsPerRead to a read).
func (r *Rules) snapshot(ctx context.Context, n *tree.Node, stored *Observations, leases, revocations bool) (o *Observations, grants int, err error) {
	o = Snapshot(stored, n, r.Clock.Now())
	if leases && r.Leases != nil {
		// Every lease the node holds, counted: a page of them was those
		// whose job ids sort first, and a rogue coordinator chooses its
		// workers' job ids.
		counts, err := r.Leases.CountHeldBy(ctx, n.NodeID)
		if err != nil {
			return nil, 0, fmt.Errorf("stoprule: read the leases of %s: %w", n.NodeID, err)
		}
		for state, k := range counts {
			bump(&o.LeasesByState, strings.ToLower(state.String()), int64(k))
			if state == lease.StateOffered || state == lease.StateActive {
				o.LeasesHeld += int64(k)
			}
		}
	}
	if revocations && r.Grants != nil {
		held, err := r.Grants.HeldBy(ctx, []string{n.NodeID})
		if err != nil {
			return nil, 0, fmt.Errorf("stoprule: read the grants of %s: %w", n.NodeID, err)
		}
		grants = len(held)
		for _, g := range held {
			if g.Outcome == capability.OutcomeRevoked {
				o.Revocations++
			}
		}
	}
	return o, grants, nil
}

// rulesInEffect reads the rules in effect at n: attached to n or an
// ancestor, and the selector rules matching n or an ancestor.
func rulesInEffect(tx store.ReadTxn, n *tree.Node) ([]*Rule, error) {
	out, err := rulesIndexed(tx, prefixSel)
	if err != nil {
		return nil, err
	}
	for _, id := range append(append([]string(nil), n.Ancestors...), n.NodeID) {
		rs, err := rulesIndexed(tx, prefixOn+id+"/")
		if err != nil {
			return nil, err
		}
		out = append(out, rs...)
	}
	var ancestors []*tree.Node
	for _, r := range out {
		if r.NodeID == "" && !tree.MatchLabels(n.Labels, r.Selector) && len(n.Ancestors) > 0 {
			// A selector rule not matching n may be inherited.
			if ancestors, err = ancestorNodes(tx, n); err != nil {
				return nil, err
			}
			break
		}
	}
	kept := out[:0]
	for _, r := range out {
		if Applies(r, n, ancestors...) {
			kept = append(kept, r)
		}
	}
	return kept, nil
}

// ancestorNodes reads n's ancestors (for the selector rules they pass
// down); one that is gone is skipped.
func ancestorNodes(tx store.ReadTxn, n *tree.Node) ([]*tree.Node, error) {
	out := make([]*tree.Node, 0, len(n.Ancestors))
	for _, id := range n.Ancestors {
		a, err := tree.GetNodeIn(tx, id)
		if errors.Is(err, tree.ErrNodeNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, nil
}

// rulesIndexed reads the rules listed under an index prefix.
func rulesIndexed(tx store.ReadTxn, prefix string) ([]*Rule, error) {
	var ids []string
	if err := tx.Scan([]byte(prefix), nil, func(k, _ []byte) error {
		ids = append(ids, tail(k, prefix))
		return nil
	}); err != nil {
		return nil, err
	}
	return rulesByID(tx, ids)
}

// liveRules reads the selector rules and the rules attached to a node
// with a judged node below it (judgedBelow above 0): the index of rules
// by node is scanned, a key each, and only those rules' records are read.
func liveRules(tx store.ReadTxn, judgedBelow map[string]int) ([]*Rule, error) {
	out, err := rulesIndexed(tx, prefixSel)
	if err != nil {
		return nil, err
	}
	var ids []string
	if err := tx.Scan([]byte(prefixOn), nil, func(k, _ []byte) error {
		node, rule, ok := strings.Cut(tail(k, prefixOn), "/")
		if ok && judgedBelow[node] > 0 {
			ids = append(ids, rule)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	attached, err := rulesByID(tx, ids)
	return append(out, attached...), err
}

// rulesByID reads the rules of ids, each listed by an index.
func rulesByID(tx store.ReadTxn, ids []string) ([]*Rule, error) {
	if err := store.Prefetch(tx, store.KeysOf(ids, ruleKey), nil); err != nil {
		return nil, err
	}
	out := make([]*Rule, 0, len(ids))
	for _, id := range ids {
		r := &Rule{}
		if err := kv.Get(tx, ruleKey(id), r); err != nil {
			return nil, fmt.Errorf("stoprule: index names rule %s: %w", id, err)
		}
		out = append(out, r)
	}
	return out, nil
}

func allRules(tx store.ReadTxn) ([]*Rule, error) {
	var out []*Rule
	err := tx.Scan([]byte(prefixRule), nil, func(_, v []byte) error {
		rule := &Rule{}
		if err := storecodec.Unmarshal(v, rule); err != nil {
			return err
		}
		out = append(out, rule)
		return nil
	})
	return out, err
}

// readNode reads a node's stored counters and self-reported counters,
// without the subtree's counts by tool (readNodeTools).
func readNode(tx store.ReadTxn, nodeID string) (*Observations, map[string]float64, error) {
	o, self, _, err := readNodeTools(tx, nodeID, false)
	return o, self, err
}

// readNodeTools is readNode, with the subtree's counts by tool when tools
// is set, and the size of the records it read to be priced: the records'
// parts by tool it decoded (up to growShards records of 2·(MaxTools+1)
// names, which only the rules that read them pay for), and the growth and
// call totals past the first totalsBytesInRead (up to 2·growShards
// records, which every read of the node reads).
func readNodeTools(tx store.ReadTxn, nodeID string, tools bool) (*Observations, map[string]float64, int, error) {
	o, err := storedObs(tx, nodeID)
	if err != nil {
		return nil, nil, 0, err
	}
	// The spawns below, from the growth records (counters stored by an
	// older version, which folded spawns into o, are kept and added to).
	var nodes uint64
	totalsBytes := 0
	err = tx.Scan(growPrefix(nodeID), nil, func(k, v []byte) error {
		totalsBytes += len(k) + len(v)
		g, err := decodeGrowth(v)
		if err != nil {
			return err
		}
		nodes += g.nodes
		o.Spawns += int64(g.children)
		o.SubtreeDepth = max(o.SubtreeDepth, int64(g.depth))
		return nil
	})
	if err != nil {
		return nil, nil, 0, err
	}
	if nodes > 0 {
		o.SubtreeSize = max(o.SubtreeSize, 1) + int64(nodes)
	}
	// The calls of the subtree: the node's own and its descendants'.
	var sum subtotal
	err = tx.Scan(subPrefix(nodeID), nil, func(k, v []byte) error {
		totalsBytes += len(k) + len(v)
		s, err := decodeSubtotal(v)
		if err != nil {
			return err
		}
		sum.add(s)
		if s.open > 0 {
			// The shard's slot and earliest listed call are exact; calls
			// an earlier version began count by their mean begin time,
			// never later than the earliest of them, and the listing the
			// thirty-fourth pass kept (readSubOldest).
			oldest := uint64(math.MaxInt64)
			if s.slotCall != "" {
				oldest = s.slotMs
			}
			if s.listed > 0 {
				oldest = min(oldest, s.listedLow)
			}
			if n := s.legacy(); n > 0 {
				oldest = min(oldest, (s.openMs-min(s.openMs, s.slotMs+s.listedSum))/n)
				o.open.legacy = true
			}
			oldest = min(oldest, math.MaxInt64)
			if o.open.sub == 0 || int64(oldest) < o.open.subOldest {
				o.open.subOldest = int64(oldest)
			}
			o.open.sub += s.open
			o.open.subBegins += s.openMs
		}
		return nil
	})
	if err != nil {
		return nil, nil, 0, err
	}
	subtreeCalls(o, sum)
	toolBytes := max(totalsBytes-totalsBytesInRead, 0)
	if tools {
		// The counts by tool, each shard's apart (a shard's OtherTool
		// stands for the tools it does not track): keys in shard order.
		records := []*subTools{{Calls: o.CallsByTool, Failures: o.FailuresByTool}}
		prefix := subToolPrefix(nodeID)
		var shard string
		var rec *subTools
		err = tx.Scan(prefix, nil, func(k, v []byte) error {
			sh, tool, ok := strings.Cut(string(k[len(prefix):]), "/")
			if !ok {
				return fmt.Errorf("stoprule: corrupt subtree tool key %q", k)
			}
			var c toolCount
			if err := decodeUvarints(v, "subtree tool", &c.calls, &c.failures); err != nil {
				return err
			}
			toolBytes += len(k) + len(v)
			if rec == nil || sh != shard {
				shard, rec = sh, &subTools{}
				records = append(records, rec)
			}
			if c.calls > 0 {
				bump(&rec.Calls, tool, int64(c.calls))
			}
			if c.failures > 0 {
				bump(&rec.Failures, tool, int64(c.failures))
			}
			return nil
		})
		if err != nil {
			return nil, nil, 0, err
		}
		o.SubtreeCallsByTool, o.SubtreeFailuresByTool = sumTools(records)
	}
	self := &reported{}
	if err := kv.Get(tx, selfKey(nodeID), self); err != nil && !errors.Is(err, store.ErrNotFound) {
		return nil, nil, 0, err
	}
	return o, self.Counters, toolBytes, nil
}

// readOwnOpenCalls reads the node's own calls still open from the ledger
// into o (Snapshot counts their time at the instant it judges the node),
// and returns how many call records it read: at most MaxOpenCallsPerNode
// per gate. When its subtree records count descendants' calls open that
// an earlier version began (read first, by readNodeTools), it reads the
// oldest of those too: the first key of the node's subOpenPrefix, which
// only such calls are listed under (the records hold the others' oldest).
//
// The node's count of open calls (ledger.OpenCount, which every begin and
// every close of its calls writes) answers for a node with none open or
// one: how many, and their begin times added up, which for one call is
// its begin time, when it agrees with the node's calls_in_flight
// (ownCountAnswers). Only a node with two calls open or more, or whose
// count does not add up their begin times or disagrees (calls an earlier
// version began or ended), has its open-call keys listed, for the oldest of its calls, which
// call_seconds_max reads and the count does not hold. Each key of a call
// the node ended stays deleted in the store until a compaction drops it,
// and a listing steps over every one: a rogue that churned calls while it
// kept one open made every evaluation of its node on call time step over
// all of them, every tick (thirty-sixth pass).
func readOwnOpenCalls(tx store.ReadTxn, nodeID string, o *Observations) (int, error) {
	if o.open.legacy {
		if err := readSubOldest(tx, nodeID, o); err != nil {
			return 0, err
		}
	}
	n, counted, err := ledger.OpenCountIn(tx, nodeID)
	if err != nil {
		return 0, err
	}
	if ownCountAnswers(n, counted, o) {
		if n.Calls == 1 {
			o.open.own, o.open.ownBegins, o.open.ownFirst = 1, float64(n.BegunMs), int64(min(n.BegunMs, math.MaxInt64))
		}
		return 0, nil
	}
	calls, err := ledger.OpenCallsIn(tx, nodeID)
	if err != nil {
		return 0, err
	}
	for _, c := range calls {
		if c.State == ledger.CallStateEnded {
			continue
		}
		ms := int64(callMillis(c.BegunAt))
		if o.open.own == 0 || ms < o.open.ownFirst {
			o.open.ownFirst = ms
		}
		o.open.own++
		o.open.ownBegins += float64(ms)
	}
	return len(calls), nil
}

// ownCountAnswers says whether the node's count of open calls n says all
// a rule reads of its own calls open: it has one, that agrees with the
// node's calls_in_flight (which every version keeps in the call's own
// transaction: a replica of an earlier version, during a rolling upgrade
// on etcd, begins and ends calls without the count), and that holds no
// call or one whose begin time it holds (the sum of one). Two calls or
// more need the listing for the oldest.
func ownCountAnswers(n ledger.OpenCount, counted bool, o *Observations) bool {
	return counted && n.Calls == uint64(max(o.CallsInFlight, 0)) && (n.Calls == 0 || n.Calls == 1 && n.Summed)
}

// readSubOldest lowers o's oldest begin of a descendant's open call to
// the first call the thirty-fourth pass listed under the node's
// subOpenPrefix (calls open across the upgrade): exact for those, where
// the shards' mean begin times of their legacy calls (what o holds when
// it is called) are only never later than the oldest. A call open since
// before the calls were listed is not listed: the means still count it.
func readSubOldest(tx store.ReadTxn, nodeID string, o *Observations) error {
	prefix := subOpenPrefix(nodeID)
	return tx.Scan(prefix, nil, func(k, _ []byte) error {
		ms, err := openKeyMillis(k, len(prefix))
		if err != nil {
			return err
		}
		o.open.subOldest = min(o.open.subOldest, int64(min(ms, math.MaxInt64)))
		return store.ErrStopScan
	})
}

// subtreeCalls sets o's subtree totals of the calls (SubtreeCalls and
// the fields beside it but the counts by tool) from its own counters and
// sum, its ancestor records added up.
func subtreeCalls(o *Observations, sum subtotal) {
	o.SubtreeCalls = o.Calls + int64(sum.calls)
	o.SubtreeFailures = o.Failures + int64(sum.failures)
	o.SubtreeCallsByOutcome = maps.Clone(o.CallsByOutcome)
	if sum.failures > 0 {
		bump(&o.SubtreeCallsByOutcome, outcomeName(ledger.CallResolutionFailed), int64(sum.failures))
	}
	for i, n := range sum.ended {
		if n > 0 {
			bump(&o.SubtreeCallsByOutcome, outcomeName(subtreeOutcomes[i]), int64(n))
		}
	}
	o.SubtreeCallSecondsTotal = o.CallSecondsTotal + float64(sum.nanos)/1e9
	o.SubtreeCallSecondsMax = max(o.CallSecondsMax, float64(sum.maxNanos)/1e9)
	o.SubtreeCallsInFlight = o.CallsInFlight + int64(min(sum.open, math.MaxInt64-uint64(max(o.CallsInFlight, 0))))
	o.SubtreeCallsInFlightMax = o.SubtreeCallsInFlight
}

// readSubtreeReported reads subtree_reported of a node whose own
// reported counters are own: its own and its descendants', from its
// records (at most growShards).
func readSubtreeReported(tx store.ReadTxn, nodeID string, own map[string]float64) (*reportedSums, error) {
	sums, _, err := readSubtreeReportedSize(tx, nodeID, own)
	return sums, err
}

// readSubtreeReportedSize is readSubtreeReported, with the size of the
// records it decoded.
func readSubtreeReportedSize(tx store.ReadTxn, nodeID string, own map[string]float64) (*reportedSums, int, error) {
	var records []*subReported
	size := 0
	err := tx.Scan(subSelfPrefix(nodeID), nil, func(_, v []byte) error {
		rec := &subReported{}
		if err := storecodec.Unmarshal(v, rec); err != nil {
			return err
		}
		size += len(v)
		records = append(records, rec)
		return nil
	})
	if err != nil {
		return nil, 0, err
	}
	return sumReported(own, records), size, nil
}

// storedObs reads a node's stored counters alone, without the growth
// records (readNode adds them): what is written back.
func storedObs(tx store.ReadTxn, nodeID string) (*Observations, error) {
	o := &Observations{}
	if err := kv.Get(tx, obsKey(nodeID), o); err != nil && !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	return o, nil
}
