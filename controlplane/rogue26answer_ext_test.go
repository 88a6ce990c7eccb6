package controlplane_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/stoprule"
)

// TestRogue26ARogueCannotHaveTheServerAnswerMegabytesForOneRequest: a stop
// rule's listing (ListStopRules of a node) answers every rule in effect at
// the node — its own and each ancestor's, 64 of an agent's per node, each
// up to 2 KiB of expression, 512 bytes of description and 16 labels — in
// one message, for one request of the caller's budget. A rogue that
// filled a chain of 8 of its nodes with such rules (its own budget paid
// for them once) had 2.4 MiB answered per request of its budget after
// that, as often as it asked: about ten times what a page of a thousand
// nodes costs, at 32 nodes deep about forty. An answer now costs a
// request per controlplane.AnswerBytesPerRequest (256 KiB) past its first,
// beyond what the call already paid for its work, taken once the answer is
// built even past what the budget has left (the budget goes into debt and
// admits nothing more until it is refilled). Since the forty-seventh pass
// a listing is answered a page of at most 500 rules at a time (rogue47e):
// each first page of the 512 is priced as its size.
func TestRogue26ARogueCannotHaveTheServerAnswerMegabytesForOneRequest(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the 512 rules this test sets up; make test and CI run them.")
	}
	const burst = 100
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) { cfg.RateLimit, cfg.RateBurst = burst/2, burst })
	admin := srv.AdminClients()
	ctx := context.Background()
	refill := func() { clk.Advance(2 * time.Second) } // a full bucket at burst/2 a second
	// A rule costs its lineage about 34 requests (its expression's size
	// and its body's): 750 ms of the budget's refill, so that the 512
	// rules take some six minutes of the clock, within the credential's
	// lifetime.
	ruleRefill := func() { clk.Advance(750 * time.Millisecond) }
	root := register(t, admin, "rogue")
	rogue := srv.Clients(root.Credential)

	// A chain of 8 nodes, each with 64 of the largest rules an agent may
	// attach: a comment fills the expression, which costs nothing to run.
	labels := map[string]string{}
	for i := range 16 {
		labels[fmt.Sprintf("l%02d-%s", i, strings.Repeat("k", 59))] = strings.Repeat("v", 63)
	}
	node, spawner := root.Node.NodeId, rogue
	for depth := range 8 {
		if depth > 0 {
			refill()
			child := spawn(t, spawner, node, fmt.Sprintf("chain-%d", depth))
			node, spawner = child.Node.NodeId, srv.Clients(child.Credential)
		}
		for r := range 64 {
			ruleRefill()
			expr := "true // " + strings.Repeat("x", 2048-len("true // "))
			_, err := rogue.StopRule.AddStopRule(ctx, connect.NewRequest(&tetherv1.AddStopRuleRequest{
				NodeId: node, Name: fmt.Sprintf("rule-%d-%d", depth, r), Expression: expr,
				Description: strings.Repeat("d", 512), Labels: labels,
			}))
			if err != nil {
				t.Fatalf("rule %d at depth %d: %v", r, depth, err)
			}
		}
	}

	refill()
	list := func() (int, error) {
		resp, err := rogue.StopRule.ListStopRules(ctx, connect.NewRequest(&tetherv1.ListStopRulesRequest{NodeId: node}))
		if err != nil {
			return 0, err
		}
		// The listing's first page (since the forty-seventh pass a
		// listing is answered at most stoprule.MaxListPage rules a page).
		if len(resp.Msg.Rules) != stoprule.MaxListPage || resp.Msg.NextPageToken == "" {
			t.Fatalf("the listing's first page has %d rules (next %q), want %d of %d and a next page", len(resp.Msg.Rules), resp.Msg.NextPageToken, stoprule.MaxListPage, 8*64)
		}
		return proto.Size(resp.Msg), nil
	}
	per := controlplane.AnswerBytesPerRequest
	// An answer of size bytes costs its request and price more; the last
	// one a budget admits may take the budget price into debt.
	price := func(size int) int { return (size - 1) / per }
	answered, listings, size := 0, 0, 0
	var refusal error
	for answered <= 2*burst*per {
		n, err := list()
		if err != nil {
			refusal = err
			break
		}
		answered, listings, size = answered+n, listings+1, n
	}
	if listings == 0 {
		t.Fatalf("no listing was answered on a full budget: %v", refusal)
	}
	if bound := (burst + price(size)) * per; answered > bound {
		t.Fatalf("a budget of %d requests had %d listings of %d bytes answered (%.1f MiB), want at most %d KiB (%d KiB a request)",
			burst, listings, size, float64(answered)/(1<<20), bound>>10, per>>10)
	}
	t.Logf("a budget of %d requests bought %d listings of %d KiB", burst, listings, size>>10)
	wantLimit(t, "a listing past the budget", refusal, connect.CodeResourceExhausted, "rate limit", "lineage "+root.Node.NodeId)

	// A request refilled at a time: a listing admitted on it is answered,
	// its price taken as debt, so the next refill is still owed.
	const rounds = burst
	answered, listings = 0, 0
	last := false
	for round := range rounds {
		clk.Advance(20 * time.Millisecond)
		n, err := list()
		if err != nil {
			wantLimit(t, "a listing while the budget refills", err, connect.CodeResourceExhausted, "rate limit", "lineage "+root.Node.NodeId)
			last = false
			continue
		}
		if last {
			t.Fatalf("round %d: a listing was answered on the request refilled right after one of %d bytes, whose price is %d more", round, n, price(n))
		}
		answered, listings, last = answered+n, listings+1, true
	}
	if bound := (rounds + 1 + price(size)) * per; listings == 0 || answered > bound {
		t.Fatalf("%d requests refilled one at a time bought %d listings (%.1f MiB), want at least one and at most %d KiB", rounds, listings, float64(answered)/(1<<20), bound>>10)
	}

	// The operator lists the same node on its own budget; another tree's
	// small listing costs one request, as before.
	if _, err := admin.StopRule.ListStopRules(ctx, connect.NewRequest(&tetherv1.ListStopRulesRequest{NodeId: node})); err != nil {
		t.Fatalf("the operator's listing: %v", err)
	}
	other := register(t, admin, "other")
	neighbour := srv.Clients(other.Credential)
	for i := range burst {
		if _, err := neighbour.StopRule.ListStopRules(ctx, connect.NewRequest(&tetherv1.ListStopRulesRequest{NodeId: other.Node.NodeId})); err != nil {
			t.Fatalf("another tree's small listing %d of %d: %v", i+1, burst, err)
		}
	}
}
