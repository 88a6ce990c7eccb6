package controlplane_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/stoprule"
)

// TestRogue43QAddingARuleAfterTheCacheIsClearedPaysForTheAllotment: an
// agent's AddStopRule is checked against the worst-case cost of the rules
// of its allotment at the node, each compiled again when the replica does
// not hold it compiled, and the add was priced as the new rule's
// expression alone. The cache of compiled expressions holds
// stoprule.MaxCompiledKept (4,096) and is cleared when full: a rogue that
// had it cycled (more stored rules than it holds, tested by id or added
// across its lineage) and then added (and removed) a rule at a node
// holding its allotment had each add compile the allotment again, up to
// 63 expressions of 2 KiB, for one rule's price. Each attached rule not
// held compiled is now priced as its expression before it is compiled; a
// rule held compiled costs nothing more, so an add at a node whose rules
// are held costs what it did.
func TestRogue43QAddingARuleAfterTheCacheIsClearedPaysForTheAllotment(t *testing.T) {
	const rate, burst = 1000, 2000
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) { cfg.RateLimit, cfg.RateBurst = rate, burst })
	admin := srv.AdminClients()
	ctx := context.Background()
	root := register(t, admin, "rogue")
	rogue := srv.Clients(root.Credential)
	refill := func() { clk.Advance(2 * burst / rate * time.Second) }

	// long is an expression of close to 1 KiB, a different one for each i,
	// never true at the node.
	long := func(i int) string {
		var b strings.Builder
		b.WriteString("observed.spawns > " + strconv.Itoa(100000+i))
		for j := 0; b.Len() < 960; j++ {
			b.WriteString(" || observed.calls > " + strconv.Itoa(100000+j))
		}
		return b.String()
	}
	// The rogue's allotment at its own node, on its own budget.
	const attached = 40
	for i := range attached {
		if _, err := rogue.StopRule.AddStopRule(ctx, connect.NewRequest(&tetherv1.AddStopRuleRequest{NodeId: root.Node.NodeId, Name: "long-" + strconv.Itoa(i), Expression: long(i)})); err != nil {
			t.Fatalf("the rogue's rule %d of %d bytes: %v", i, len(long(i)), err)
		}
	}

	// More stored rules than the cache holds, each compiled once when
	// stored, after the rogue's: the cache is cleared and the rogue's
	// rules are no longer held compiled. (Stored by an operator on its own
	// budget here, on nodes of other trees; a rogue's lineage may store
	// as many on the children it spawns.)
	nodes := stoprule.MaxCompiledKept/(stoprule.MaxRulesPerNode-1) + 1
	stored := 0
	for n := range nodes {
		other := register(t, admin, "filler-"+strconv.Itoa(n))
		for i := range stoprule.MaxRulesPerNode - 1 {
			if _, err := admin.StopRule.AddStopRule(ctx, connect.NewRequest(&tetherv1.AddStopRuleRequest{NodeId: other.Node.NodeId, Name: "r" + strconv.Itoa(i), Expression: "observed.spawns > " + strconv.Itoa(1000000+stored)})); err != nil {
				t.Fatalf("filler rule %d: %v", stored, err)
			}
			if stored++; stored%(burst/2) == 0 {
				refill()
			}
		}
	}
	if stored <= stoprule.MaxCompiledKept {
		t.Fatalf("stored %d filler rules, want more than %d", stored, stoprule.MaxCompiledKept)
	}
	refill()

	// The rogue adds a short rule, removes it, and adds it again: the
	// first add compiles its allotment again, the second finds it held.
	add := func() string {
		resp, err := rogue.StopRule.AddStopRule(ctx, connect.NewRequest(&tetherv1.AddStopRuleRequest{NodeId: root.Node.NodeId, Name: "short", Expression: "observed.spawns > 7777"}))
		if err != nil {
			t.Fatalf("the rogue's short rule: %v", err)
		}
		return resp.Msg.Rule.RuleId
	}
	ruleID := add()
	if _, err := rogue.StopRule.RemoveStopRule(ctx, connect.NewRequest(&tetherv1.RemoveStopRuleRequest{RuleId: ruleID})); err != nil {
		t.Fatal(err)
	}
	add()
	// What is left of the budget, a request at a time.
	left := 0
	for ; left <= burst; left++ {
		if _, err := rogue.StopRule.TestStopRule(ctx, connect.NewRequest(&tetherv1.TestStopRuleRequest{NodeId: root.Node.NodeId, Expression: "observed.spawns > 1"})); err != nil {
			wantLimit(t, "the budget spent", err, connect.CodeResourceExhausted, "rate limit")
			break
		}
	}
	spent := burst - left
	want := 3 + attached*(len(long(0))/controlplane.RuleBytesPerRequest)
	if spent != want {
		t.Fatalf("an add, a remove and an add again at a node holding %d rules of %d bytes no longer held compiled cost %d requests, want %d (the three calls and the %d rules' compiles, once)", attached, len(long(0)), spent, want, attached)
	}
}
