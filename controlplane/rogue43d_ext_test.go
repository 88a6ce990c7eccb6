package controlplane_test

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue43DTestingAStoredRuleByIdPaysForItsCompile: TestStopRule
// prices an expression it is sent by its size (a request more per
// controlplane.RuleBytesPerRequest bytes, 33 in all for 2 KiB, about 8 ms
// of the server's CPU to compile), but a stored rule named by rule_id was
// tested for the call alone, on the ground that its author paid when it
// was added and its compiled expression is kept. The cache of compiled
// expressions holds stoprule.MaxCompiledKept (4,096) and is cleared when
// full: a rogue whose lineage stored more rules than that (4,097 of 2 KiB
// are some fourteen seconds of the default budget, 10,000 requests a
// second; rules on the children it ended stay stored and testable, and no
// evaluator holds them) and tested them by id in turn
// had every test compile up to 2 KiB for one request, 33 times what the
// same compile costs sent as an expression. A test by id is now priced
// as its expression, before it is compiled, whether or not the replica
// holds it compiled (so the price tells nothing of the cache); a short
// stored rule still costs one request; a rule the caller may not test is
// not found, before any price.
func TestRogue43DTestingAStoredRuleByIdPaysForItsCompile(t *testing.T) {
	const burst = 200
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) { cfg.RateLimit, cfg.RateBurst = 1, burst })
	admin := srv.AdminClients()
	ctx := context.Background()
	root := register(t, admin, "rogue")
	other := register(t, admin, "neighbour")
	rogue := srv.Clients(root.Credential)

	// long is an expression of close to 2 KiB, a different one for each i,
	// never true at the node (its age is 0 on the test's clock).
	long := func(i int) string {
		var b strings.Builder
		b.WriteString("observed.age_seconds > " + strconv.Itoa(1000+i) + ".0")
		for j := 0; b.Len() < 2000; j++ {
			b.WriteString(" || self_reported.?k" + strconv.Itoa(j) + ".orValue(0.0) > " + strconv.Itoa(1000+j) + ".0")
		}
		return b.String()
	}
	// Stored by an operator on the rogue's node, on the operator's own
	// budget: in effect there, so the rogue may test them (and list them).
	const stored = 4
	var ids []string
	for i := range stored {
		resp, err := admin.StopRule.AddStopRule(ctx, connect.NewRequest(&tetherv1.AddStopRuleRequest{NodeId: root.Node.NodeId, Name: "long-" + strconv.Itoa(i), Expression: long(i)}))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, resp.Msg.Rule.RuleId)
	}
	short, err := admin.StopRule.AddStopRule(ctx, connect.NewRequest(&tetherv1.AddStopRuleRequest{NodeId: root.Node.NodeId, Name: "short", Expression: "observed.spawns > 1000"}))
	if err != nil {
		t.Fatal(err)
	}
	elsewhere, err := admin.StopRule.AddStopRule(ctx, connect.NewRequest(&tetherv1.AddStopRuleRequest{NodeId: other.Node.NodeId, Name: "theirs", Expression: long(99)}))
	if err != nil {
		t.Fatal(err)
	}

	// Another tree's rule is not found, and costs the call alone: a
	// hundred of them leave the budget's price of the long rules as it was.
	for range 100 {
		_, err := rogue.StopRule.TestStopRule(ctx, connect.NewRequest(&tetherv1.TestStopRuleRequest{NodeId: root.Node.NodeId, RuleId: elsewhere.Msg.Rule.RuleId}))
		if connect.CodeOf(err) != connect.CodeNotFound {
			t.Fatalf("another tree's rule by id: %v, want not_found", err)
		}
	}
	left := burst - 100

	price := 1 + len(long(0))/controlplane.RuleBytesPerRequest
	want := left / price
	tested := 0
	var refusal error
	// In turn, each again and again: the rules tested before (held
	// compiled on this replica) cost what the first test of each did.
	for i := range left + 1 {
		_, err := rogue.StopRule.TestStopRule(ctx, connect.NewRequest(&tetherv1.TestStopRuleRequest{NodeId: root.Node.NodeId, RuleId: ids[i%stored]}))
		if err != nil {
			refusal = err
			break
		}
		tested++
	}
	if tested != want {
		t.Fatalf("the rogue tested stored rules of %d bytes by id %d times on a budget of %d, want %d (each compile costs %d requests, as the expression sent would)", len(long(0)), tested, left, want, price)
	}
	wantLimit(t, "a test by id past the lineage's budget", refusal, connect.CodeResourceExhausted, "rate limit", "lineage "+root.Node.NodeId, strconv.Itoa(len(long(want%stored)))+" bytes", strconv.Itoa(price-1)+" requests")

	// What is left (the refused call took its own request at the Gate,
	// the price nothing) still tests the short stored rule, for one
	// request each.
	rest := left - want*price - 1
	for i := range rest {
		if _, err := rogue.StopRule.TestStopRule(ctx, connect.NewRequest(&tetherv1.TestStopRuleRequest{NodeId: root.Node.NodeId, RuleId: short.Msg.Rule.RuleId})); err != nil {
			t.Fatalf("the short stored rule, test %d of the %d requests left: %v", i+1, rest, err)
		}
	}
	_, err = rogue.StopRule.TestStopRule(ctx, connect.NewRequest(&tetherv1.TestStopRuleRequest{NodeId: root.Node.NodeId, RuleId: short.Msg.Rule.RuleId}))
	wantLimit(t, "the short stored rule past the budget", err, connect.CodeResourceExhausted, "rate limit")
}
