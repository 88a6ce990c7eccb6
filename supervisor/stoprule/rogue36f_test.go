package stoprule

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/capability/grantstore"
	"github.com/tetherhq/tether/internal/fault"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/tree"
)

// rogue36fGrantTree is the agent tree as grantstore reads it: the real
// tree, wired as controlplane wires it (treeview.go's grantTree).
type rogue36fGrantTree struct{ t *tree.Tree }

func (g rogue36fGrantTree) GetNodeIn(tx store.ReadTxn, nodeID string) (*grantstore.Node, error) {
	n, err := g.t.GetNodeIn(tx, nodeID)
	if err != nil {
		return nil, err
	}
	return &grantstore.Node{NodeID: n.NodeID, Ancestors: n.Ancestors, State: tree.StateName(n.State)}, nil
}

func (g rogue36fGrantTree) SubtreeIn(tx store.ReadTxn, rootID string) ([]*grantstore.Node, error) {
	nodes, err := g.t.SubtreeIn(tx, rootID)
	if err != nil {
		return nil, err
	}
	out := make([]*grantstore.Node, len(nodes))
	for i, n := range nodes {
		out[i] = &grantstore.Node{NodeID: n.NodeID, Ancestors: n.Ancestors, State: tree.StateName(n.State)}
	}
	return out, nil
}

func (g rogue36fGrantTree) NodeNotFound(err error) bool { return g.t.NodeNotFound(err) }

func (g rogue36fGrantTree) NoteHolderIn(tx store.Txn, nodeID string) error {
	return g.t.NoteHolderIn(tx, nodeID)
}

// rogue36fGrants is a real grant store on the rig's store and tree, set
// as the rules' source of revocations.
func rogue36fGrants(t *testing.T, g *rogue31cRig) *grantstore.Service {
	t.Helper()
	key, err := capability.NewSigningKey(nil, g.clk.Now(), g.clk.Now())
	if err != nil {
		t.Fatal(err)
	}
	ring := capability.KeyRing{Keys: []capability.SigningKey{key}}
	svc, err := grantstore.New(grantstore.Config{Store: g.st, Tree: rogue36fGrantTree{g.agents}, Clock: g.clk,
		Keys: func() capability.KeyRing { return ring }, Issuer: "tether"})
	if err != nil {
		t.Fatal(err)
	}
	g.rules.Grants = svc
	return svc
}

// TestRogue36FHoldingManyGrantsIsChargedToTheRogue: a rule reading
// observed.revocations reads every grant the node holds (up to
// grantstore.DefaultMaxPerNode live ones and as many dead) and each one's
// chain, every tick, at every node it is in effect at; that read was
// charged to the tree's turns as one read whatever the grants. A rogue
// that had its parent delegate it a couple of hundred grants was charged
// for its evaluations what a node holding one grant is, so its tree's
// turns bought many times the evaluator's work other trees' did.
func TestRogue36FHoldingManyGrantsIsChargedToTheRogue(t *testing.T) {
	rogue36fManyGrantsCharged(t, newRogue31cRig(t))
}

// TestRogue36FHoldingManyGrantsIsChargedToTheRogueOnEtcd is the same on
// etcd.
func TestRogue36FHoldingManyGrantsIsChargedToTheRogueOnEtcd(t *testing.T) {
	rogue36fManyGrantsCharged(t, newRogue35kEtcdRig(t))
}

func rogue36fManyGrantsCharged(t *testing.T, g *rogue31cRig) {
	ctx := context.Background()
	grants := rogue36fGrants(t, g)
	planner := g.spawn(nil, "planner")
	honest := g.spawn(planner, "honest")
	rogue := g.spawn(planner, "rogue")
	root, err := grants.IssueRoot(ctx, grantstore.Caller{Principal: "operator:alice"}, grantstore.RootRequest{HolderNodeID: planner.NodeID, Scopes: []string{"tools:*"}})
	if err != nil {
		t.Fatal(err)
	}
	delegate := func(to *tree.Node) {
		t.Helper()
		if _, err := grants.Delegate(ctx, grantstore.Caller{Principal: capability.AgentPrefix + planner.NodeID},
			grantstore.DelegateRequest{ParentGrantID: root.Grant.GrantID, HolderNodeID: to.NodeID, Scopes: []string{"tools:read"}}); err != nil {
			t.Fatal(err)
		}
	}
	delegate(honest)
	const many = 160
	for range many {
		delegate(rogue)
	}
	c, err := Compile(`observed.revocations > 1000`)
	if err != nil {
		t.Fatal(err)
	}
	evaluate := func(n *tree.Node) int64 {
		t.Helper()
		cost, err := g.rules.evaluateNode(ctx, n.NodeID, []*activeRule{{rule: &Rule{RuleID: "r", Name: "r", NodeID: planner.NodeID}, compiled: c}})
		if err != nil {
			t.Fatal(err)
		}
		return cost
	}
	// One grant: the node's snapshot and the grants' read, and the rule's
	// few units.
	if cost := evaluate(honest); cost >= 3*evaluationBaseCost {
		t.Fatalf("judging a node holding one grant was charged %d, want its two reads (%d) and the rule's few units", cost, 2*evaluationBaseCost)
	}
	// 160 grants, each read with its chain: a read more per
	// grantsPerRead of them.
	want := int64(2+many/grantsPerRead) * evaluationBaseCost
	if cost := evaluate(rogue); cost < want {
		t.Fatalf("judging a node holding %d grants was charged %d, want at least %d (a read more per %d grants)", many, cost, want, grantsPerRead)
	}
}

// rogue36fTerminate ends n as a termination's last chunk does
// (supervisor/chunks.go): its state written terminated.
func rogue36fTerminate(t *testing.T, g *rogue31cRig, n *tree.Node) *tree.Node {
	t.Helper()
	var cur *tree.Node
	err := g.st.Update(context.Background(), func(tx store.Txn) error {
		var err error
		if cur, err = tree.GetNodeIn(tx, n.NodeID); err != nil {
			return err
		}
		cur.State = tree.NodeStateTerminated
		return tree.PutNodeIn(tx, cur)
	})
	if err != nil {
		t.Fatal(err)
	}
	return cur
}

// TestRogue36FRulesOnTerminatedSubtreesAreNotCompiledAtEachStart: the
// evaluator compiled and held every rule ever stored each time it started
// (a restart, a leader change), those attached to nodes whose whole
// subtree had terminated included, though no node they could be in effect
// at would ever be judged again; and an agent could attach rules to its
// terminated descendants. A rogue that attached its rules' allotment to
// each child and ended it, child after child, had every later start of the
// evaluator compile them all, some 0.3 ms each, before any rule of any tree
// was evaluated, and each held in the leader's memory; a running evaluator
// held them too, from their attach on.
func TestRogue36FRulesOnTerminatedSubtreesAreNotCompiledAtEachStart(t *testing.T) {
	rogue36fTerminatedRulesNotLoaded(t, newRogue31cRig(t))
}

// TestRogue36FRulesOnTerminatedSubtreesAreNotCompiledAtEachStartOnEtcd is
// the same on etcd.
func TestRogue36FRulesOnTerminatedSubtreesAreNotCompiledAtEachStartOnEtcd(t *testing.T) {
	rogue36fTerminatedRulesNotLoaded(t, newRogue35kEtcdRig(t))
}

func rogue36fTerminatedRulesNotLoaded(t *testing.T, g *rogue31cRig) {
	ctx := context.Background()
	planner := g.spawn(nil, "planner")
	rogue := g.spawn(planner, "rogue")
	as := func(n *tree.Node) Actor { return Actor{ID: capability.AgentPrefix + n.NodeID, NodeID: n.NodeID} }
	add := func(by, on *tree.Node, name, expression string) (*Rule, error) {
		t.Helper()
		r, _, err := g.rules.Add(ctx, as(by), &Rule{NodeID: on.NodeID, Name: name, Expression: expression})
		return r, err
	}
	must := func(r *Rule, err error) *Rule {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// Rules still in effect: the planner's on the rogue, the rogue's on a
	// child it keeps, and the rogue's on a child that ended while its own
	// child runs on (a termination's chunks may end a node before its
	// descendants).
	kept := []*Rule{must(add(planner, rogue, "planners", "observed.calls > 1000"))}
	live := g.spawn(rogue, "live")
	kept = append(kept, must(add(rogue, live, "live", "observed.calls > 1001")))
	parent := g.spawn(rogue, "parent")
	grand := g.spawn(parent, "grand")
	kept = append(kept, must(add(rogue, parent, "parent", "observed.calls > 1002")))
	rogue36fTerminate(t, g, parent)
	// The rogue's churn: children given rules of their own, each
	// expression fresh, then ended.
	var gone []*Rule
	for i := range 4 {
		kid := g.spawn(rogue, fmt.Sprintf("kid%d", i))
		for j := range 4 {
			gone = append(gone, must(add(rogue, kid, fmt.Sprintf("r%d", j), fmt.Sprintf("observed.calls > %d", 2000+10*i+j))))
			gone = append(gone, must(add(kid, kid, fmt.Sprintf("own%d", j), fmt.Sprintf("observed.spawns > %d", 2000+10*i+j))))
		}
		rogue36fTerminate(t, g, kid)
	}
	// An ended child takes no rule more: it would never be judged.
	dead := g.spawn(rogue, "dead")
	rogue36fTerminate(t, g, dead)
	if _, err := add(rogue, dead, "late", "observed.calls > 3000"); err == nil || fault.KindOf(err) != fault.Precondition {
		t.Errorf("attaching a rule to a terminated child: %v, want a failed precondition", err)
	}
	rs, err := g.rules.List(ctx, Actor{ID: "operator:alice"}, dead.NodeID)
	if err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(rs, func(r *Rule) bool { return r.NodeID == dead.NodeID }) {
		t.Errorf("the terminated child holds a rule after a refused attach: %v", rs)
	}

	// The evaluator starts (a restart, a leader change).
	g.rules.compiledMu.Lock()
	g.rules.compiled = nil
	g.rules.compiledMu.Unlock()
	ix, err := g.rules.load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range kept {
		if _, ok := ix.byID[r.RuleID]; !ok {
			t.Errorf("rule %s on a subtree still judged was not loaded", r.Name)
		}
	}
	for _, r := range gone {
		if _, ok := ix.byID[r.RuleID]; ok {
			t.Errorf("rule %s on a terminated subtree was loaded and compiled", r.Name)
		}
	}
	g.rules.compiledMu.Lock()
	compiled := len(g.rules.compiled)
	g.rules.compiledMu.Unlock()
	if compiled != len(kept) {
		t.Errorf("the evaluator's start compiled %d expressions, want the %d of the rules still in effect", compiled, len(kept))
	}
	// The rule of the ended parent is still in effect at its running child.
	if !slices.ContainsFunc(ix.inEffect(grand.NodeID, ix.nodes[grand.NodeID]), func(a *activeRule) bool { return a.rule.Name == "parent" }) {
		t.Errorf("the ended parent's rule is not in effect at its running child")
	}

	// While the evaluator runs, as its watches hand it the changes: a
	// child given rules and then ended has them let go.
	late := g.spawn(rogue, "late")
	ix.putNode(late)
	lateRules := []*Rule{must(add(rogue, late, "late", "observed.calls > 4000")), must(add(late, late, "lateown", "observed.spawns > 4000"))}
	for _, r := range lateRules {
		g.rules.putRule(ix, r)
		if _, ok := ix.byID[r.RuleID]; !ok {
			t.Fatalf("rule %s on a running child was not taken", r.Name)
		}
	}
	ix.putNode(rogue36fTerminate(t, g, late))
	for _, r := range lateRules {
		if _, ok := ix.byID[r.RuleID]; ok {
			t.Errorf("rule %s is still held after its child's subtree terminated", r.Name)
		}
	}
	// The ended parent's rule goes once its running child ends too.
	ix.putNode(rogue36fTerminate(t, g, grand))
	if _, ok := ix.byID[kept[2].RuleID]; ok {
		t.Errorf("the ended parent's rule is still held after its last running descendant ended")
	}
	for _, r := range kept[:2] {
		if _, ok := ix.byID[r.RuleID]; !ok {
			t.Errorf("rule %s on a subtree still judged was let go", r.Name)
		}
	}
}
