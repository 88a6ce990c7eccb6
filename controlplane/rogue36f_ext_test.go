package controlplane_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The thirty-sixth hostile pass, stop rules: the rogue is an agent that
// has the control plane read, for a rule on observed.revocations, every
// grant its node holds and each one's chain.

// TestRogue36FTestingARuleOnTheRevocationsIsPricedByTheGrantsRead: a
// TestStopRule of an expression on observed.revocations reads every grant
// the node holds and judges each one's chain; it cost one request whatever
// their number, so a rogue that delegated its child 160 grants had a
// budget of 1,000 requests buy a thousand such reads. It now costs a
// request more per 4 grants read, as the evaluator charges them.
func TestRogue36FTestingARuleOnTheRevocationsIsPricedByTheGrantsRead(t *testing.T) {
	const burst = 1000
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) { cfg.RateLimit, cfg.RateBurst = 100, burst })
	admin := srv.AdminClients()
	rogue := register(t, admin, "rogue")
	c := srv.Clients(rogue.Credential)
	kid := spawn(t, c, rogue.Node.NodeId, "kid")
	root := issueRoot(t, admin, rogue.Node.NodeId, time.Hour, "tool:*")
	delegateMany(t, c, root, kid.Node.NodeId, 160)
	clk.Advance(2 * burst / 100 * time.Second)
	test := func(expression string) error {
		_, err := c.StopRule.TestStopRule(context.Background(), connect.NewRequest(&tetherv1.TestStopRuleRequest{NodeId: kid.Node.NodeId, Expression: expression}))
		return err
	}
	tests := 0
	var refusal error
	for refusal == nil && tests <= burst {
		if refusal = test(`observed.revocations > 0`); refusal == nil {
			tests++
		}
	}
	wantLimit(t, "the rogue past its budget", refusal, connect.CodeResourceExhausted, "rate limit")
	if tests > burst/10 {
		t.Fatalf("a budget of %d requests bought %d tests reading the child's 160 grants, want at most %d", burst, tests, burst/10)
	}
	// Refilled, a test that does not read them costs its one request.
	clk.Advance(2 * burst / 100 * time.Second)
	for i := range burst / 2 {
		if err := test(`observed.calls > 0`); err != nil {
			t.Fatalf("test %d not reading the grants on a budget of %d: %v", i, burst, err)
		}
	}
}

// TestRogue36FARuleOnATerminatedNodeIsRefused: an agent attached rules to
// its terminated descendants, which no rule ever judges again, and each
// start of the evaluator compiled them; it is refused failed_precondition,
// naming the node, and nothing is stored.
func TestRogue36FARuleOnATerminatedNodeIsRefused(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	rogue := register(t, admin, "rogue")
	c := srv.Clients(rogue.Credential)
	kid := spawn(t, c, rogue.Node.NodeId, "kid")
	terminateInStore(t, srv, kid.Node.NodeId)
	for _, as := range []*testserver.Clients{c, admin} {
		_, err := as.StopRule.AddStopRule(context.Background(), connect.NewRequest(&tetherv1.AddStopRuleRequest{NodeId: kid.Node.NodeId, Name: "late", Expression: "observed.calls > 100"}))
		wantLimit(t, "a rule on a terminated child", err, connect.CodeFailedPrecondition, kid.Node.NodeId, "terminated")
	}
	resp, err := admin.StopRule.ListStopRules(context.Background(), connect.NewRequest(&tetherv1.ListStopRulesRequest{NodeId: kid.Node.NodeId}))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range resp.Msg.Rules {
		if r.NodeId == kid.Node.NodeId {
			t.Fatalf("the terminated child holds rule %s after a refused attach", r.Name)
		}
	}
}
