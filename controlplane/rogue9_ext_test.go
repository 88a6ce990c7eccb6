package controlplane_test

import (
	"context"
	"fmt"
	"testing"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor"
)

// The ninth rogue pass: what the eighth left open. Each test plays one
// rogue through the real server (Badger on disk, real HTTP, real JWTs, the
// manual clock).

// pendingProposals counts the stop proposals waiting for an operator's
// decision, as an operator lists them.
func pendingProposals(t *testing.T, admin *testserver.Clients) int {
	t.Helper()
	resp, err := admin.Supervisor.ListProposals(context.Background(), connect.NewRequest(&tetherv1.ListProposalsRequest{State: tetherv1.ProposalState_PROPOSAL_STATE_PENDING}))
	if err != nil {
		t.Fatal(err)
	}
	return len(resp.Msg.Proposals)
}

// TestARogueThatSpawnsProposersCannotFloodTheOperatorsQueue: a node may
// have only a few stop proposals pending, but a rogue spawns children and
// has each of them file its few: the operators' queue of proposals waiting
// for a decision (ListProposals answers it in one message) grew with every
// spawn, bounded only by how many nodes a tree may hold. A tree has a
// bound of its own; the next proposal in it is refused with the limit
// named and nothing stored, another tree's agent still proposes, and an
// operator's decision frees a place.
func TestARogueThatSpawnsProposersCannotFloodTheOperatorsQueue(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	ctx := context.Background()
	root := register(t, admin, "rogue")
	rogue := srv.Clients(root.Credential)
	propose := func(c *testserver.Clients) (*tetherv1.StopProposal, error) {
		resp, err := c.Agent.ProposeStop(ctx, connect.NewRequest(&tetherv1.ProposeStopRequest{Condition: "now", Reason: "flood"}))
		if err != nil {
			return nil, err
		}
		return resp.Msg.Proposal, nil
	}
	var first *tetherv1.StopProposal
	filed, refused := 0, 0
	var lastErr error
	// Enough children to pass the tree's bound by two nodes' worth.
	children := supervisor.MaxPendingProposalsPerTree/supervisor.MaxPendingProposals + 2
	for i := range children {
		child := srv.Clients(spawn(t, rogue, root.Node.NodeId, fmt.Sprintf("proposer-%d", i)).Credential)
		for range supervisor.MaxPendingProposals {
			p, err := propose(child)
			if err != nil {
				refused++
				lastErr = err
				continue
			}
			filed++
			if first == nil {
				first = p
			}
		}
	}
	if filed != supervisor.MaxPendingProposalsPerTree {
		t.Fatalf("the rogue's tree filed %d proposals (refused %d), want the tree's bound %d", filed, refused, supervisor.MaxPendingProposalsPerTree)
	}
	wantLimit(t, "a proposal over the tree's bound", lastErr, connect.CodeResourceExhausted, "stop proposals waiting", "maximum per tree")
	if n := pendingProposals(t, admin); n != supervisor.MaxPendingProposalsPerTree {
		t.Fatalf("%d proposals pending, want %d (the refused ones stored nothing)", n, supervisor.MaxPendingProposalsPerTree)
	}
	// The rogue itself, with no proposal of its own pending, is held to
	// its tree's bound too.
	if _, err := propose(rogue); err == nil {
		t.Fatal("the rogue filed a proposal past its tree's bound")
	}
	// The bound is its tree's alone: another tree's agent still proposes.
	other := srv.Clients(register(t, admin, "bystander").Credential)
	if _, err := propose(other); err != nil {
		t.Fatalf("another tree's proposal: %v", err)
	}
	// An operator's decision frees a place in the rogue's tree.
	if _, err := admin.Supervisor.DecideProposal(ctx, connect.NewRequest(&tetherv1.DecideProposalRequest{ProposalId: first.ProposalId, Approve: false, Reason: "no"})); err != nil {
		t.Fatal(err)
	}
	if _, err := propose(rogue); err != nil {
		t.Fatalf("a proposal after one of the tree's was decided: %v", err)
	}
	if n := pendingProposals(t, admin); n != supervisor.MaxPendingProposalsPerTree+1 {
		t.Fatalf("%d proposals pending, want the rogue tree's %d and the bystander's one", n, supervisor.MaxPendingProposalsPerTree)
	}
}
