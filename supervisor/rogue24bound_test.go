package supervisor

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/tetherhq/tether/internal/store/badgerstore"
	"github.com/tetherhq/tether/supervisor/tree"
)

// TestRogue24ANodesProposalsAreListedAPageAtATime: a node's stop
// proposals were listed in one answer, and its decided ones are never
// pruned: an agent that proposes its own stop again each time it is
// rejected grows the answer its operators' node page and `tether proposal
// ls --node` read, without bound. Proposals now lists a page at a time
// (at most pageSize read, MaxProposalPage by default) with a token for
// the next, each proposal once, by every index it reads; a token it did
// not hand out is refused. (Fails if a page holds more than its size, a
// proposal is listed twice or missed, or a bad token is taken.)
func TestRogue24ANodesProposalsAreListedAPageAtATime(t *testing.T) {
	s, _ := chunkTestSupervisor(t, badgerstore.BadgerOptions{}, 0)
	ctx := context.Background()
	rogue, err := s.Tree.RegisterRoot(ctx, "rogue", nil, "test")
	if err != nil {
		t.Fatal(err)
	}
	other, err := s.Tree.RegisterRoot(ctx, "other", nil, "test")
	if err != nil {
		t.Fatal(err)
	}
	const rejected = 130
	want := map[string]map[string]bool{"rogue": {}, "rogue pending": {}, "pending": {}, "all": {}}
	propose := func(n *tree.Node, name string, reject bool) {
		p, _, err := s.Propose(ctx, n.NodeID, "now", "let me stop", "agent:"+n.NodeID, ModeDrain, 0, ProposalPolicy{})
		if err != nil {
			t.Fatal(err)
		}
		want["all"][p.ProposalID] = true
		if name == "rogue" {
			want["rogue"][p.ProposalID] = true
		}
		if reject {
			if _, _, err := s.Decide(ctx, p.ProposalID, false, "no", "operator:o"); err != nil {
				t.Fatal(err)
			}
			return
		}
		want["pending"][p.ProposalID] = true
		if name == "rogue" {
			want["rogue pending"][p.ProposalID] = true
		}
	}
	for range rejected {
		propose(rogue, "rogue", true)
	}
	propose(rogue, "rogue", false)
	for range 3 {
		propose(other, "other", true)
	}
	propose(other, "other", false)

	const size = 40
	for _, c := range []struct {
		name  string
		state ProposalState
		node  string
	}{
		{"rogue", ProposalStateUnspecified, rogue.NodeID},
		{"rogue pending", ProposalStatePending, rogue.NodeID},
		{"pending", ProposalStatePending, ""},
		{"all", ProposalStateUnspecified, ""},
	} {
		seen := map[string]bool{}
		pages, token := 0, ""
		for {
			got, next, err := s.Proposals(ctx, c.state, c.node, token, size)
			if err != nil {
				t.Fatalf("%s, page %d: %v", c.name, pages, err)
			}
			pages++
			if len(got) > size {
				t.Fatalf("%s: a page of size %d listed %d proposals", c.name, size, len(got))
			}
			for _, p := range got {
				if seen[p.ProposalID] {
					t.Fatalf("%s: proposal %s listed twice", c.name, p.ProposalID)
				}
				seen[p.ProposalID] = true
			}
			if next == "" {
				break
			}
			if pages > 2*len(want["all"]) {
				t.Fatalf("%s: the pages never end", c.name)
			}
			token = next
		}
		if len(seen) != len(want[c.name]) {
			t.Fatalf("%s: listed %d proposals in %d pages, want %d", c.name, len(seen), pages, len(want[c.name]))
		}
		for id := range want[c.name] {
			if !seen[id] {
				t.Fatalf("%s: proposal %s never listed", c.name, id)
			}
		}
		t.Logf("%s: %d proposals in %d pages of at most %d", c.name, len(seen), pages, size)
	}
	// The default page is MaxProposalPage: the node's 131 in one.
	if got, next, err := s.Proposals(ctx, ProposalStateUnspecified, rogue.NodeID, "", 0); err != nil || len(got) != rejected+1 || next != "" {
		t.Fatalf("the default page of the node: %d proposals, next %q, %v; want %d, none", len(got), next, err, rejected+1)
	}
	for _, bad := range []string{"x", "../proposals", "p_nope/" + rogue.NodeID, fmt.Sprintf("%s/%s/x", rogue.NodeID, rogue.NodeID)} {
		if _, _, err := s.Proposals(ctx, ProposalStateUnspecified, rogue.NodeID, bad, 0); !errors.Is(err, tree.ErrInvalidArgument) {
			t.Errorf("page_token %q: %v, want ErrInvalidArgument", bad, err)
		}
	}
}
