package controlplane_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The sixteenth rogue pass, against the termination protocol's promises:
// what the agent being stopped, and its descendants, can do to delay its
// stop or another tree's, fake its record or dodge it. Each test plays one
// rogue through the real server (Badger on disk, real HTTP/2, real JWTs).

// TestARoguesRulesDoNotDelayAnotherTreesOperatorRule: the stop-rule
// evaluator is one for the cluster. A rogue spawns a chain of descendants,
// each carrying agents' rules near the cost budget (the sum each node
// allows), and a hundred leaves below the chain: every leaf's evaluation
// runs the whole chain's rules, four budgets. With the leaves marked for
// evaluation (their reports; here the evaluator's restart, which marks
// every node at once), the evaluator served the marked nodes in no order
// by tree: an operator's rule that had come true on another tree waited
// behind, on average, half of the rogue's leaves — the rogue's spending,
// not a budget of evaluator time, decided when another tree's rule filed
// its proposal. The evaluator now serves the trees in turn, each tree's
// marked nodes in the order they were marked, and charges each tree what
// its evaluations cost (CEL cost units, and a snapshot read per node):
// a tree that overspent its turn sits out until its turns have paid for
// it. The other trees' operator rules file their proposals after at most
// one turn of the rogue's (here one leaf: four budgets is more than a
// turn). (Fails with the victim's rule filed after tens of the rogue's
// leaves evaluated.)
func TestARoguesRulesDoNotDelayAnotherTreesOperatorRule(t *testing.T) {
	dir := t.TempDir()
	srv, gateRule, crash := startStalled(t, dir)
	const chain, leaves = 4, 100
	rogueChain(t, srv, chain, leaves)
	victim := register(t, srv.AdminClients(), "victim")
	victimRule := addRule(t, srv.AdminClients(), &tetherv1.AddStopRuleRequest{NodeId: victim.Node.NodeId, Name: "operators-stop", Expression: `observed.calls >= 0`})
	crash()

	again, counts := restartCounting(t, dir)
	waitRuleProposal(t, again, gateRule)
	waitRuleProposal(t, again, victimRule.RuleId)
	got := counts()
	t.Logf("nodes evaluated at each firing: %v (of %d marked: the rogue's %d, the gate, the victim)", got, chain+leaves+2, chain+leaves)
	if len(got) != 2 {
		t.Fatalf("%d firings, want the gate's and the victim's", len(got))
	}
	// A turn each: at most two of the rogue's nodes (its root, whose one
	// label makes its rules cheap, and one more, which overruns the
	// turn), the gate's, the victim's.
	for _, n := range got {
		if n > 4 {
			t.Fatalf("an operator's rule on another tree filed after %d nodes were evaluated (at firings: %v); want it within the first turn of each tree (at most 4)", n, got)
		}
	}
}

// TestARoguesRulesDoNotDelayItsOperatorsRuleOnItsOwnTree: the same rogue,
// alone with its operator. Its tree's turns pay for its spending, but its
// tree's marked nodes were served in one order, operators' rules and its
// own together: an operator's rule that had come true on one of the
// rogue's leaves waited behind the rogue's other marked nodes, each
// costing the evaluator the chain's agents' rules (four budgets a leaf) —
// the rogue's own rules delayed its own stop, by as long as it has
// leaves. Within a tree, the operators' rules of the marked nodes are now
// evaluated first (with the node's agents' rules in the same snapshot when
// they cost little in the worst case); the agents' rules that cost more
// are evaluated after, in the tree's turns. The operator's rule files its
// proposal before any of the rogue's expensive rules is evaluated.
// (Fails with the operator's rule filed after tens of the rogue's nodes.)
func TestARoguesRulesDoNotDelayItsOperatorsRuleOnItsOwnTree(t *testing.T) {
	dir := t.TempDir()
	srv, gateRule, crash := startStalled(t, dir)
	const chain, leaves = 4, 100
	ids := rogueChain(t, srv, chain, leaves)
	opRule := addRule(t, srv.AdminClients(), &tetherv1.AddStopRuleRequest{NodeId: ids[len(ids)-1], Name: "operators-stop", Expression: `observed.calls >= 0`})
	crash()

	again, counts := restartCounting(t, dir)
	waitRuleProposal(t, again, gateRule)
	waitRuleProposal(t, again, opRule.RuleId)
	got := counts()
	t.Logf("nodes evaluated at each firing: %v (of %d marked: the rogue's %d, the gate)", got, chain+leaves+1, chain+leaves)
	if len(got) != 2 {
		t.Fatalf("%d firings, want the gate's and the operator's on the rogue's leaf", len(got))
	}
	// The rogue's tree's turn evaluates its operators' rules first (the
	// leaf), then its agents' rules on at most two nodes (its root, whose
	// rules are cheap, and one that overruns the turn); the gate's turn
	// its one node. Whichever tree's turn comes first, the first firing
	// is within 2 nodes evaluated and the second within 4.
	if min(got[0], got[1]) > 2 || max(got[0], got[1]) > 4 {
		t.Fatalf("nodes evaluated at the two firings: %v; want the first within 2 and the second within 4 (the rogue's tree's operators' rules first)", got)
	}
}

// startStalled starts a server on dir whose stop-rule evaluator waits at
// its first firing (the gate tree's operator rule, true at once), then
// stops there as a crash would when crash is called: everything written
// meanwhile is stored but not evaluated, until a server restarted on dir
// marks every node. crash stops the server.
func startStalled(t *testing.T, dir string) (srv *testserver.Server, gateRule string, crash func()) {
	t.Helper()
	crashed, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	srv = testserver.StartIn(t, dir, func(cfg *controlplane.Config) {
		cfg.StopRuleFault = func(p string) error {
			if p != "before-file" {
				return nil
			}
			once.Do(func() { close(crashed) })
			<-release
			return errors.New("crash")
		}
	})
	admin := srv.AdminClients()
	gate := register(t, admin, "gate")
	rule := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: gate.Node.NodeId, Name: "gate", Expression: `observed.calls >= 0`})
	select {
	case <-crashed:
	case <-time.After(time.Minute): // a guard, not a synchronisation
		t.Fatal("the gate rule never reached its crash point")
	}
	return srv, rule.RuleId, func() {
		close(release)
		srv.Stop()
	}
}

// rogueChain registers a rogue whose chain of descendants each attach an
// agent's rule near the budget (loops over their 32 long labels, never
// true), and spawns leaves under the chain's last node: each leaf's
// evaluation runs the whole chain's rules. It returns the leaves' ids.
func rogueChain(t *testing.T, srv *testserver.Server, chain, leaves int) []string {
	t.Helper()
	labels := map[string]string{}
	for i := range 32 {
		labels[fmt.Sprintf("l%02d", i)] = strings.Repeat("v", 60)
	}
	rogue := register(t, srv.AdminClients(), "rogue")
	parent, parentClients := rogue.Node.NodeId, srv.Clients(rogue.Credential)
	for depth := range chain {
		addRule(t, parentClients, &tetherv1.AddStopRuleRequest{NodeId: parent, Name: fmt.Sprintf("slow-%d", depth), Expression: slowRule(36)})
		if depth == chain-1 {
			break
		}
		child := spawnLabelled(t, parentClients, parent, fmt.Sprintf("link-%d", depth), labels)
		parent, parentClients = child.Node.NodeId, srv.Clients(child.Credential)
	}
	children := make([]*tetherv1.SpawnBatchChild, leaves)
	for i := range children {
		children[i] = &tetherv1.SpawnBatchChild{Name: fmt.Sprintf("leaf-%03d", i), Labels: labels}
	}
	resp, err := parentClients.Agent.SpawnBatch(context.Background(), connect.NewRequest(&tetherv1.SpawnBatchRequest{ParentNodeId: parent, Children: children}))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, c := range resp.Msg.Spawned {
		ids = append(ids, c.Node.NodeId)
	}
	return ids
}

// restartCounting starts a server on dir that notes, at each firing of a
// rule, how many nodes its evaluator had evaluated (the firing node
// included); counts returns the notes so far.
func restartCounting(t *testing.T, dir string) (*testserver.Server, func() []int64) {
	t.Helper()
	var (
		mu      sync.Mutex
		notes   []int64
		started = make(chan struct{})
		again   *testserver.Server
	)
	again = testserver.StartIn(t, dir, func(cfg *controlplane.Config) {
		cfg.StopRuleFault = func(p string) error {
			if p != "before-file" {
				return nil
			}
			<-started // the server is published
			mu.Lock()
			notes = append(notes, again.StopRuleStats().Nodes.Load())
			mu.Unlock()
			return nil
		}
	})
	close(started)
	return again, func() []int64 {
		mu.Lock()
		defer mu.Unlock()
		return append([]int64(nil), notes...)
	}
}
