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
	ctx := context.Background()
	// The first server's evaluator waits at its first firing (the gate
	// tree's rule, true at once), then stops there as a crash would:
	// everything written meanwhile is stored but not evaluated, until the
	// second server's evaluator starts and marks every node.
	crashed, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	srv := testserver.StartIn(t, dir, func(cfg *controlplane.Config) {
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
	gateRule := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: gate.Node.NodeId, Name: "gate", Expression: `observed.calls >= 0`})
	select {
	case <-crashed:
	case <-time.After(time.Minute): // a guard, not a synchronisation
		t.Fatal("the gate rule never reached its crash point")
	}

	labels := map[string]string{}
	for i := range 32 {
		labels[fmt.Sprintf("l%02d", i)] = strings.Repeat("v", 60)
	}
	const chain, leaves = 4, 100
	rogue := register(t, admin, "rogue")
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
	if _, err := parentClients.Agent.SpawnBatch(ctx, connect.NewRequest(&tetherv1.SpawnBatchRequest{ParentNodeId: parent, Children: children})); err != nil {
		t.Fatal(err)
	}
	victim := register(t, admin, "victim")
	victimRule := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: victim.Node.NodeId, Name: "operators-stop", Expression: `observed.calls >= 0`})
	close(release)
	srv.Stop()

	// The second server: at each firing, how many nodes the evaluator had
	// evaluated (the firing node included).
	var (
		mu      sync.Mutex
		counts  []int64
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
			counts = append(counts, again.StopRuleStats().Nodes.Load())
			mu.Unlock()
			return nil
		}
	})
	close(started)
	waitRuleProposal(t, again, gateRule.RuleId)
	waitRuleProposal(t, again, victimRule.RuleId)
	mu.Lock()
	got := append([]int64(nil), counts...)
	mu.Unlock()
	t.Logf("nodes evaluated at each firing: %v (of %d marked: the rogue's %d, the gate, the victim)", got, chain+leaves+2, chain+leaves)
	if len(got) != 2 {
		t.Fatalf("%d firings, want the gate's and the victim's", len(got))
	}
	// A turn each: at most two of the rogue's nodes (its chain's nodes
	// cost less than a turn), the gate's, the victim's.
	for _, n := range got {
		if n > 4 {
			t.Fatalf("an operator's rule on another tree filed after %d nodes were evaluated (at firings: %v); want it within the first turn of each tree (at most 4)", n, got)
		}
	}
}
