package controlplane_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The forty-seventh rogue pass (E): rollouts and stop rules.

// rogue47eRules has the rogue root attach its allotment of the largest
// cheap rules it may write (a 512-byte description, 16 labels of 63
// characters each side, an expression of five bytes) to itself and to
// each node of a chain of depth descendants below it, and answers the
// chain, root first, and how many rules were attached.
func rogue47eRules(t *testing.T, srv *testserver.Server, depth int) (chain []string, attached int) {
	t.Helper()
	ctx := context.Background()
	rogue := register(t, srv.AdminClients(), "rogue")
	rc := srv.Clients(rogue.Credential)
	chain = []string{rogue.Node.NodeId}
	last := rc
	for i := 0; i < depth; i++ {
		c := spawn(t, last, chain[len(chain)-1], fmt.Sprintf("c%d", i))
		chain = append(chain, c.Node.NodeId)
		last = srv.Clients(c.Credential)
	}
	labels := map[string]string{}
	for i := 0; i < 16; i++ {
		labels[fmt.Sprintf("k%02d%s", i, strings.Repeat("k", 60))] = strings.Repeat("v", 63)
	}
	// Each node's rules are added on a goroutine of its own: the adds wait
	// for the store's commits, not for one another.
	errs := make(chan error, len(chain))
	for d, node := range chain {
		go func() {
			for i := 0; i < 64; i++ {
				if _, err := rc.StopRule.AddStopRule(ctx, connect.NewRequest(&tetherv1.AddStopRuleRequest{
					NodeId: node, Name: fmt.Sprintf("r%02d-%02d", d, i), Expression: "false",
					Description: strings.Repeat("d", 512), Labels: labels,
				})); err != nil {
					errs <- fmt.Errorf("rule %d on %s: %w", i, node, err)
					return
				}
			}
			errs <- nil
		}()
	}
	for range chain {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	attached = 64 * len(chain)
	return chain, attached
}

// A rogue that fills its chain with the largest rules it may write had
// every ListStopRules answer them all in one message: the operators'
// listing of every rule (no node_id), and anyone's listing of the rules in
// effect at the chain's deepest node, its own included, for one request of
// the caller's budget. With 26 nodes of 64 rules (1,664 rules) an answer
// held 4,595,576 bytes, over the 4 MiB the control plane pages its long
// answers to stay under; a full chain of 33 nodes with both allotments
// (4,224 rules) and long expressions passes the SDKs' 16 MiB, and the
// operator could no longer list them at all. Here 12 nodes (768 rules):
// one answer of all before, now pages of at most 500 that list each rule
// once, in the order the listing promises.
func TestRogue47EARoguesRulesAreListedAPageAtATime(t *testing.T) {
	srv := testserver.Start(t)
	ctx := context.Background()
	chain, attached := rogue47eRules(t, srv, 11)
	deepest := chain[len(chain)-1]
	depth := map[string]int{}
	for i, n := range chain {
		depth[n] = i
	}
	admin := srv.AdminClients()
	// Two operators' selector rules: one in effect at the chain (the
	// rogue root's label), one not; a node's listing begins with those
	// in effect.
	for _, sel := range []string{"team=research", "team=nobody"} {
		if _, err := admin.StopRule.AddStopRule(ctx, connect.NewRequest(&tetherv1.AddStopRuleRequest{LabelSelector: sel, Name: "sel-" + sel[5:], Expression: "false"})); err != nil {
			t.Fatal(err)
		}
	}
	depth[""] = -1
	for _, node := range []string{"", deepest} {
		want := attached + 2
		if node != "" {
			want = attached + 1
		}
		for _, size := range []int32{0, 100, 7} {
			seen := map[string]bool{}
			var order []string
			token := ""
			for pages := 0; ; pages++ {
				if pages > want {
					t.Fatalf("node %q, page_size %d: more pages than rules", node, size)
				}
				resp, err := admin.StopRule.ListStopRules(ctx, connect.NewRequest(&tetherv1.ListStopRulesRequest{NodeId: node, PageSize: size, PageToken: token}))
				if err != nil {
					t.Fatal(err)
				}
				bytes := proto.Size(resp.Msg)
				if pages == 0 {
					t.Logf("node %q, page_size %d: %d of %d rules, %d bytes in the first answer", node, size, len(resp.Msg.Rules), want, bytes)
				}
				limit := int(size)
				if limit == 0 {
					limit = 500
				}
				if bytes > 4<<20 || len(resp.Msg.Rules) > limit {
					t.Fatalf("node %q: one answer held %d rules in %d bytes; want at most %d a page, under 4 MiB", node, len(resp.Msg.Rules), bytes, limit)
				}
				for _, r := range resp.Msg.Rules {
					if seen[r.RuleId] {
						t.Fatalf("node %q, page_size %d: rule %s listed twice", node, size, r.RuleId)
					}
					seen[r.RuleId] = true
					order = append(order, r.NodeId+"/"+r.RuleId)
					if node == deepest && r.Inherited != (r.NodeId != deepest) {
						t.Errorf("rule %s on %s: inherited %v at %s", r.RuleId, r.NodeId, r.Inherited, deepest)
					}
				}
				if token = resp.Msg.NextPageToken; token == "" {
					break
				}
			}
			if len(seen) != want {
				t.Errorf("node %q, page_size %d: the pages listed %d rules of %d", node, size, len(seen), want)
			}
			if node == "" {
				continue
			}
			// The node's rules in effect come in List's order: the
			// selector rules first, then the lineage's, root first, each
			// group by rule id.
			for i := 1; i < len(order); i++ {
				pn, pr, _ := strings.Cut(order[i-1], "/")
				n, r, _ := strings.Cut(order[i], "/")
				if depth[pn] > depth[n] || (pn == n && pr >= r) {
					t.Fatalf("page_size %d: %s listed after %s", size, order[i], order[i-1])
				}
			}
		}
	}
}

// A page token is the caller's word: one naming no rule in effect at the
// node (another tree's node in it, a malformed one) is refused, and an
// agent still lists no node outside its subtree and not every rule.
func TestRogue47EAListPageTokenIsChecked(t *testing.T) {
	srv := testserver.Start(t)
	ctx := context.Background()
	admin := srv.AdminClients()
	rogue := register(t, admin, "rogue")
	rc := srv.Clients(rogue.Credential)
	victim := register(t, admin, "victim")
	for _, tok := range []string{"on/" + victim.Node.NodeId + "/x_00000000000000000000", "rule/x_00000000000000000000", "sel/../x", "on/" + rogue.Node.NodeId + "/zz"} {
		_, err := rc.StopRule.ListStopRules(ctx, connect.NewRequest(&tetherv1.ListStopRulesRequest{NodeId: rogue.Node.NodeId, PageToken: tok}))
		if connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("token %q: %v, want invalid_argument", tok, err)
		}
	}
	if _, err := admin.StopRule.ListStopRules(ctx, connect.NewRequest(&tetherv1.ListStopRulesRequest{PageToken: "../x"})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("operator's token %q: %v, want invalid_argument", "../x", err)
	}
	if _, err := admin.StopRule.ListStopRules(ctx, connect.NewRequest(&tetherv1.ListStopRulesRequest{PageSize: -1})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("page_size -1: %v, want invalid_argument", err)
	}
	if _, err := rc.StopRule.ListStopRules(ctx, connect.NewRequest(&tetherv1.ListStopRulesRequest{PageToken: "x_00000000000000000000"})); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("agent listing every rule: %v, want permission_denied", err)
	}
	if _, err := rc.StopRule.ListStopRules(ctx, connect.NewRequest(&tetherv1.ListStopRulesRequest{NodeId: victim.Node.NodeId})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("agent listing another tree's node: %v, want not_found", err)
	}
}
