package controlplane_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor"
)

// The eighteenth hostile pass over termination: the agent being stopped,
// against the real server.

// TestAStoppedRoguesProposalsDoNotOutliveItsStop: a rogue R beside a
// worker W under one root fills its tree's bound of pending stop proposals
// (its children file theirs) and is then stopped, its whole subtree
// terminated and recorded. Its proposals asked to stop nodes that are now
// stopped; they stayed pending all the same, held every place of the
// tree's bound, and W's own proposal was refused "an operator must decide
// some first" until an operator rejected the rogue's one by one (approving
// one fails: its node is terminated). The rogue's flood outlived its stop.
// A proposal of a terminated node is now closed when the tree's bound is
// reached: rejected, decided by the termination that stopped its node, so
// W proposes, and the operators' list of pending proposals holds none of
// the rogue's.
func TestAStoppedRoguesProposalsDoNotOutliveItsStop(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx := context.Background()
	root := register(t, admin, "ops")
	rootC := srv.Clients(root.Credential)
	worker := srv.Clients(spawn(t, rootC, root.Node.NodeId, "worker").Credential)
	rogueNode := spawn(t, rootC, root.Node.NodeId, "rogue")
	rogue := srv.Clients(rogueNode.Credential)
	propose := func(c *testserver.Clients) (*tetherv1.StopProposal, error) {
		resp, err := c.Agent.ProposeStop(ctx, connect.NewRequest(&tetherv1.ProposeStopRequest{Condition: "now", Reason: "flood"}))
		if err != nil {
			return nil, err
		}
		return resp.Msg.Proposal, nil
	}
	filed := 0
	for i := 0; filed < supervisor.MaxPendingProposalsPerTree; i++ {
		child := srv.Clients(spawn(t, rogue, rogueNode.Node.NodeId, fmt.Sprintf("proposer-%d", i)).Credential)
		for range supervisor.MaxPendingProposals {
			if filed == supervisor.MaxPendingProposalsPerTree {
				break
			}
			if _, err := propose(child); err != nil {
				t.Fatalf("proposal %d: %v", filed, err)
			}
			filed++
		}
	}
	if _, err := propose(worker); err == nil {
		t.Fatal("the worker proposed past its tree's bound while the rogue's proposals were live")
	}
	// The root stops the rogue's subtree; the record is written.
	term := terminate(t, rootC, rogueNode.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Second, time.Second).TerminationId
	testserver.WaitFor(t, 60*time.Second, "the rogue's termination", func() bool {
		clk.Advance(time.Minute)
		return getTermination(t, admin, term).State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	// The worker's own proposal finds room: the rogue's were moot.
	mine, err := propose(worker)
	if err != nil {
		t.Fatalf("the worker's proposal after the rogue's subtree was terminated: %v", err)
	}
	resp, err := admin.Supervisor.ListProposals(ctx, connect.NewRequest(&tetherv1.ListProposalsRequest{State: tetherv1.ProposalState_PROPOSAL_STATE_PENDING}))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Msg.Proposals) != 1 || resp.Msg.Proposals[0].ProposalId != mine.ProposalId {
		t.Fatalf("%d proposals pending after the rogue's stop, want the worker's alone", len(resp.Msg.Proposals))
	}
	closed, err := admin.Supervisor.ListProposals(ctx, connect.NewRequest(&tetherv1.ListProposalsRequest{State: tetherv1.ProposalState_PROPOSAL_STATE_REJECTED}))
	if err != nil {
		t.Fatal(err)
	}
	if len(closed.Msg.Proposals) != supervisor.MaxPendingProposalsPerTree {
		t.Fatalf("%d proposals rejected, want the rogue's %d", len(closed.Msg.Proposals), supervisor.MaxPendingProposalsPerTree)
	}
	for _, p := range closed.Msg.Proposals {
		if p.DecidedBy != "termination:"+term || p.TerminationId != "" {
			t.Fatalf("the rogue's proposal %s was closed by %q (started termination %q), want decided by the termination %s that stopped its node, starting none", p.ProposalId, p.DecidedBy, p.TerminationId, term)
		}
	}
}
