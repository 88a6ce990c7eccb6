package controlplane_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// proposalIDs is the set of the proposals' ids.
func proposalIDs(ps []*tetherv1.StopProposal) map[string]bool {
	out := map[string]bool{}
	for _, p := range ps {
		out[p.ProposalId] = true
	}
	return out
}

// TestAStopRulesPendingProposalIsInItsNodesPendingList: a stop rule's
// proposal waiting for the operator was in no pending index (only an
// agent's ProposeStop wrote one), so ListProposals of the node's pending
// proposals — `tether proposal ls --node N --pending` — answered none
// while the rule's proposal waited. (Fails if the node's pending list, or
// the pending list of every node, lacks the rule's proposal, or keeps it
// once it is decided.)
func TestAStopRulesPendingProposalIsInItsNodesPendingList(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	bg := context.Background()
	root := register(t, admin, "planner")
	worker := spawn(t, srv.Clients(root.Credential), root.Node.NodeId, "worker")
	grant := issueRoot(t, admin, worker.Node.NodeId, time.Hour, "tool:*")
	rule := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: worker.Node.NodeId, Name: "no-shell", Expression: `observed.calls_by_tool[?"shell"].orValue(0) >= 1`})
	gateCall(t, srv, grant.token, "shell", false)
	p := waitRuleProposal(t, srv, rule.RuleId)
	if p.State != tetherv1.ProposalState_PROPOSAL_STATE_PENDING {
		t.Fatalf("the rule's proposal is %s, want pending", p.State)
	}
	pending := func(node string) map[string]bool {
		t.Helper()
		got, err := admin.Supervisor.ListProposals(bg, connect.NewRequest(&tetherv1.ListProposalsRequest{NodeId: node, State: tetherv1.ProposalState_PROPOSAL_STATE_PENDING}))
		if err != nil {
			t.Fatal(err)
		}
		return proposalIDs(got.Msg.Proposals)
	}
	if !pending(worker.Node.NodeId)[p.ProposalId] {
		t.Errorf("the worker's pending proposals lack its rule's pending proposal %s", p.ProposalId)
	}
	if !pending("")[p.ProposalId] {
		t.Errorf("the pending proposals lack the rule's pending proposal %s", p.ProposalId)
	}
	if _, err := admin.Supervisor.DecideProposal(bg, connect.NewRequest(&tetherv1.DecideProposalRequest{ProposalId: p.ProposalId, Reason: "fine"})); err != nil {
		t.Fatal(err)
	}
	if pending(worker.Node.NodeId)[p.ProposalId] || pending("")[p.ProposalId] {
		t.Errorf("the rejected proposal %s is still listed pending", p.ProposalId)
	}
}

// TestARoguesDecidedProposalsAreNotReadForThePendingList: `tether proposal
// ls --pending` without --node (ListProposals of the pending state, of
// every node) read every proposal ever filed to find the pending ones,
// and decided ones are never pruned: a rogue tree whose children propose
// and are rejected, again and again, had the operator's look at what
// waits for them read all of those (30 here, every one). The pending ones
// are read from their index now. (Fails if the pending list scans the
// stored proposals, or misses the victim's pending one.)
func TestARoguesDecidedProposalsAreNotReadForThePendingList(t *testing.T) {
	b, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	st := &prefixCountingStore{Store: b}
	srv := testserver.Start(t, func(cfg *controlplane.Config) { cfg.Store = st })
	admin := srv.AdminClients()
	bg := context.Background()
	rogue := register(t, admin, "rogue")
	rejectedProposals(t, srv, srv.Clients(rogue.Credential), rogue.Node.NodeId, 30)
	victim := register(t, admin, "victim")
	p, err := srv.Clients(victim.Credential).Agent.ProposeStop(bg, connect.NewRequest(&tetherv1.ProposeStopRequest{Condition: "now", Reason: "mine"}))
	if err != nil {
		t.Fatal(err)
	}
	st.proposals.Store(0)
	got, err := admin.Supervisor.ListProposals(bg, connect.NewRequest(&tetherv1.ListProposalsRequest{State: tetherv1.ProposalState_PROPOSAL_STATE_PENDING}))
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Msg.Proposals) != 1 || got.Msg.Proposals[0].ProposalId != p.Msg.Proposal.ProposalId {
		t.Errorf("the pending proposals are %d, want the victim's one", len(got.Msg.Proposals))
	}
	if n := st.proposals.Load(); n != 0 {
		t.Errorf("listing the pending proposals scanned %d stored proposals (the rogue tree's 30 rejected ones among them), want none: the pending index only", n)
	}
}

// TestAPageOfTheOlderFeedIsAskedForWhole: before_sequence (the console's
// ?before=) is a page of newest tombstones below it, one message, and the
// stream ends; without newest, or with after_sequence, it is refused
// invalid_argument, naming the field.
func TestAPageOfTheOlderFeedIsAskedForWhole(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	bg := context.Background()
	holder := register(t, admin, "holder")
	var last uint64
	for range 5 {
		g := issueRoot(t, admin, holder.Node.NodeId, time.Hour, "tool:*")
		r, err := admin.Capability.Revoke(bg, connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_GrantId{GrantId: g.grant.GrantId}}))
		if err != nil {
			t.Fatal(err)
		}
		last = r.Msg.Sequence
	}
	stream, err := admin.Capability.WatchRevocations(bg, connect.NewRequest(&tetherv1.WatchRevocationsRequest{BeforeSequence: last, Newest: 2}))
	if err != nil {
		t.Fatal(err)
	}
	var got []uint64
	messages := 0
	for stream.Receive() {
		messages++
		for _, tomb := range stream.Msg().Tombstones {
			got = append(got, tomb.Sequence)
		}
	}
	if err := stream.Err(); err != nil || messages != 1 || len(got) != 2 || got[0] != last-2 || got[1] != last-1 {
		t.Errorf("a page of 2 before %d: %d messages of %v (err %v), want one of [%d %d], then the end", last, messages, got, err, last-2, last-1)
	}
	for _, req := range []*tetherv1.WatchRevocationsRequest{{BeforeSequence: last}, {BeforeSequence: last, Newest: 2, AfterSequence: 1}} {
		stream, err := admin.Capability.WatchRevocations(bg, connect.NewRequest(req))
		if err == nil {
			for stream.Receive() {
			}
			err = stream.Err()
		}
		if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "before_sequence") {
			t.Errorf("WatchRevocations %v: %v, want invalid_argument naming before_sequence", req, err)
		}
	}
}
