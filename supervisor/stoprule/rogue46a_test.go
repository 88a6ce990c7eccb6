package stoprule

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/tree"
)

// ruleReads counts what a view reads of the stored rules' records
// (stoprules/rule/<id>): each record, by a scan or a get, and its bytes.
type ruleReads struct {
	store.Store
	records, bytes *int
}

func (s ruleReads) View(ctx context.Context, fn func(tx store.ReadTxn) error) error {
	return s.Store.View(ctx, func(tx store.ReadTxn) error { return fn(ruleReadsTxn{tx, s}) })
}

type ruleReadsTxn struct {
	store.ReadTxn
	s ruleReads
}

func (t ruleReadsTxn) count(k, v []byte) {
	if bytes.HasPrefix(k, []byte(prefixRule)) {
		*t.s.records++
		*t.s.bytes += len(v)
	}
}

func (t ruleReadsTxn) Scan(prefix, start []byte, fn func(k, v []byte) error) error {
	return t.ReadTxn.Scan(prefix, start, func(k, v []byte) error {
		t.count(k, v)
		return fn(k, v)
	})
}

func (t ruleReadsTxn) Get(key []byte) ([]byte, error) {
	v, err := t.ReadTxn.Get(key)
	if err == nil {
		t.count(key, v)
	}
	return v, err
}

// TestRogue46AAStartDoesNotReadTheRulesOfEndedSubtrees: the evaluator,
// each time it starts (a restart, a leader change, and each rescan after
// its watch fell behind, which a rogue flooding the store can force), read
// and decoded every rule ever stored before it judged any rule of any
// tree: since the thirty-sixth pass it compiled only the rules of subtrees
// with a node still judged, but it still read them all to learn which.
// Rules stay stored when their subtree ends, and each carries up to 512
// bytes of description and 16 labels its setter chooses: a rogue that gave
// each child it spawned and ended its allotment of such rules (64 the
// child's own, 64 its ancestors') made every start read some 128 records
// of 2–3 KiB per child it ever had, held in memory at once, for one
// request each. A start now reads the records of the rules that can be in
// effect at a judged node only (its index of rules by node tells which).
func TestRogue46AAStartDoesNotReadTheRulesOfEndedSubtrees(t *testing.T) {
	rogue46aStartReadsLiveRulesOnly(t, newRogue31cRig(t))
}

// TestRogue46AAStartDoesNotReadTheRulesOfEndedSubtreesOnEtcd is the same
// on etcd.
func TestRogue46AAStartDoesNotReadTheRulesOfEndedSubtreesOnEtcd(t *testing.T) {
	rogue46aStartReadsLiveRulesOnly(t, newRogue35kEtcdRig(t))
}

func rogue46aStartReadsLiveRulesOnly(t *testing.T, g *rogue31cRig) {
	ctx := context.Background()
	planner := g.spawn(nil, "planner")
	rogue := g.spawn(planner, "rogue")
	as := func(n *tree.Node) Actor { return Actor{ID: capability.AgentPrefix + n.NodeID, NodeID: n.NodeID} }
	// The largest rule an agent may attach for the request it pays: a
	// short expression, the description and the labels at their bounds.
	labels := map[string]string{}
	for i := range 16 {
		labels[fmt.Sprintf("k%02d-%s", i, strings.Repeat("k", 59))] = strings.Repeat("v", 63)
	}
	description := strings.Repeat("d", 512)
	add := func(by, on *tree.Node, name string, n int) *Rule {
		t.Helper()
		r, _, err := g.rules.Add(ctx, as(by), &Rule{NodeID: on.NodeID, Name: name,
			Expression: fmt.Sprintf("observed.calls > %d", n), Labels: labels, Description: description})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// Rules still in effect: the planner's on the rogue, the rogue's on a
	// child it keeps, and on a child that ended while its own child runs.
	kept := map[string]bool{add(planner, rogue, "planners", 1000).RuleID: true}
	live := g.spawn(rogue, "live")
	kept[add(rogue, live, "live", 1001).RuleID] = true
	parent := g.spawn(rogue, "parent")
	g.spawn(parent, "grand")
	kept[add(rogue, parent, "parent", 1002).RuleID] = true
	rogue36fTerminate(t, g, parent)
	// The rogue's churn: each child given its allotment, then ended.
	const kids, each = 4, 64
	for i := range kids {
		kid := g.spawn(rogue, fmt.Sprintf("kid%d", i))
		for j := range each {
			add(rogue, kid, fmt.Sprintf("r%d", j), 2000+j)
			add(kid, kid, fmt.Sprintf("own%d", j), 3000+j)
		}
		rogue36fTerminate(t, g, kid)
	}

	// The evaluator starts (a restart, a leader change, a rescan).
	records, read := 0, 0
	stored := g.rules.Store
	g.rules.Store = ruleReads{Store: stored, records: &records, bytes: &read}
	ix, err := g.rules.load(ctx)
	g.rules.Store = stored
	if err != nil {
		t.Fatal(err)
	}
	for id := range kept {
		if _, ok := ix.byID[id]; !ok {
			t.Errorf("rule %s on a subtree still judged was not loaded", id)
		}
	}
	t.Logf("a start read %d rule records (%d bytes); %d rules are in effect at a judged node, %d stored", records, read, len(kept), len(kept)+kids*each*2)
	if records > len(kept) {
		t.Fatalf("a start read %d rule records (%d bytes), want at most the %d of the rules in effect at a judged node", records, read, len(kept))
	}
}
