package stoprule

import (
	"context"
	"testing"
	"time"

	"github.com/tetherhq/tether/supervisor/ledger"
	"github.com/tetherhq/tether/supervisor/tree"
)

// The thirty-fourth hostile pass, stop rules: the rogue hides one call
// held open for long among short ones, so that the subtree's longest open
// call reads short.

// TestRogue34DShortCallsKeptOpenBesideALongOneDoNotHideIt: the rogue's
// child keeps one call open for 1,000 s and then opens 255 more (the most
// a gate lets it keep open), churning them so that they stay young. A
// rule on the rogue's subtree_call_seconds_max bounding a call at 300 s
// fires, and reads the long call's age exactly. Before, the subtree read
// the oldest mean age of a shard's open calls: (1,000 + 255·0)/256, about
// 4 s, and the rule never fired while the call stayed open.
func TestRogue34DShortCallsKeptOpenBesideALongOneDoNotHideIt(t *testing.T) {
	g := newRogue31cRig(t)
	rogue := g.spawn(nil, "rogue")
	kid := g.spawn(rogue, "kid")
	g.openCall(kid)
	g.clk.Advance(1000 * time.Second)
	var short []*ledger.ToolCall
	for range ledger.MaxOpenCallsPerNode - 1 {
		short = append(short, g.openCall(kid))
	}
	g.clk.Advance(time.Second)
	// The rogue churns: it ends its short calls and opens fresh ones.
	for _, c := range short[:16] {
		g.endCall(c)
		g.openCall(kid)
	}
	const rule = `observed.subtree_call_seconds_max > 300.0`
	if res := judge34(g, rogue, rule); res.Err != nil || !res.Fired {
		t.Errorf("%s at the rogue: %v (%v); values %v", rule, res.Fired, res.Err, res.Values)
	}
	if res := judge34(g, rogue, `observed.subtree_call_seconds_max == 1001.0`); res.Err != nil || !res.Fired {
		t.Errorf("the long call's age at the rogue: %v (%v); values %v", res.Fired, res.Err, res.Values)
	}
}

// TestRogue34DAnOlderCallEndedDoesNotHideTheLongOne: the rogue opens a
// decoy first, then its long call in a grandchild, then ends the decoy and
// keeps many short calls open in the same shard: the subtree's longest
// open call is the long one's, whatever ended before it. Its end leaves
// the next oldest (exact, never more: an honest subtree whose oldest
// call ended is not judged on it).
func TestRogue34DAnOlderCallEndedDoesNotHideTheLongOne(t *testing.T) {
	rogue34dOlderCallEnded(t, newRogue31cRig(t))
}

// TestRogue34DAnOlderCallEndedDoesNotHideTheLongOneOnEtcd is the same on
// etcd: the listing's first key read by a scan stopped at it.
func TestRogue34DAnOlderCallEndedDoesNotHideTheLongOneOnEtcd(t *testing.T) {
	rogue34dOlderCallEnded(t, newRogue35kEtcdRig(t))
}

func rogue34dOlderCallEnded(t *testing.T, g *rogue31cRig) {
	rogue := g.spawn(nil, "rogue")
	kid := g.spawn(rogue, "kid")
	grand := g.spawn(kid, "grand")
	decoy := g.openCall(grand)
	g.clk.Advance(10 * time.Second)
	long := g.openCall(grand)
	g.clk.Advance(10 * time.Second)
	g.endCall(decoy)
	g.clk.Advance(500 * time.Second)
	for range 100 {
		g.openCall(grand)
	}
	g.clk.Advance(100 * time.Second)
	for _, tc := range []struct {
		node       *tree.Node
		expression string
	}{
		{rogue, `observed.subtree_call_seconds_max == 610.0`},
		{kid, `observed.subtree_call_seconds_max == 610.0`},
	} {
		if res := judge34(g, tc.node, tc.expression); res.Err != nil || !res.Fired {
			t.Errorf("%s at %s: %v (%v); values %v", tc.expression, tc.node.Name, res.Fired, res.Err, res.Values)
		}
	}
	g.endCall(long)
	// Ended: the decoy (20 s) and the long call (610 s); open: the short
	// ones, 100 s each.
	if res := judge34(g, rogue, `observed.subtree_call_seconds_max == 610.0 && observed.subtree_call_seconds_total == 10630.0`); res.Err != nil || !res.Fired {
		t.Errorf("after the long call ended: %v (%v); values %v", res.Fired, res.Err, res.Values)
	}
	g.clk.Advance(1000 * time.Second)
	if res := judge34(g, rogue, `observed.subtree_call_seconds_max == 1100.0 && observed.subtree_call_seconds_total == 110630.0`); res.Err != nil || !res.Fired {
		t.Errorf("the short calls, 1,100 s open: %v (%v); values %v", res.Fired, res.Err, res.Values)
	}
}

// judge34 judges n on expression as Rules.Test does (an operator testing
// the rule on it): its own and its subtree's open calls read as the
// evaluator reads them.
func judge34(g *rogue31cRig, n *tree.Node, expression string) Result {
	g.t.Helper()
	res, err := g.rules.Test(context.Background(), Actor{ID: "agent:" + n.NodeID, NodeID: n.NodeID}, n.NodeID, expression, "")
	if err != nil {
		g.t.Fatal(err)
	}
	return res.Result
}
