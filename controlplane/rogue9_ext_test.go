package controlplane_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

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

// TestARogueCannotReadTheUnknownJobLogThroughItsJobsPageToken: the
// evidence of a job with rows of its own is those rows; the log of
// messages about jobs without a lease is read only for a job that has
// none. A rogue offered a job under an id an operator had already sent
// orders about (judged against no lease, kept in that log) and asked for
// its job's evidence with a page token it made ("u1"): it read the
// operator's orders about a job that was never its own. The token is now
// refused invalid_argument and nothing is read; the job's own rows still
// page as before.
func TestARogueCannotReadTheUnknownJobLogThroughItsJobsPageToken(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	ctx := context.Background()
	const job = "job-planned-by-ops"
	// The operator's orders about the job before any lease exists: each
	// is judged (rejected, no lease) and kept in the unknown-job log.
	for i := range 3 {
		if _, err := admin.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: job, Reason: fmt.Sprintf("ops plan %d: cut the vendor off", i)})); err != nil {
			t.Fatalf("operator's order %d: %v", i, err)
		}
	}
	root := register(t, admin, "rogue")
	rogue := srv.Clients(root.Credential)
	child := spawn(t, rogue, root.Node.NodeId, "worker")
	if _, err := rogue.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: child.Node.NodeId, LeaseDuration: durationpb.New(time.Minute)})); err != nil {
		t.Fatalf("the rogue's offer: %v", err)
	}
	own, err := rogue.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: job}))
	if err != nil {
		t.Fatal(err)
	}
	if len(own.Msg.Rows) != 1 || own.Msg.NextPageToken != "" {
		t.Fatalf("the job's own evidence: %d rows, next %q; want its offer alone", len(own.Msg.Rows), own.Msg.NextPageToken)
	}
	for _, token := range []string{"u1", "u2"} {
		resp, err := rogue.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: job, PageToken: token}))
		if err == nil {
			for _, r := range resp.Msg.Rows {
				t.Errorf("page token %q read a row the job never had: %s", token, r.Reason)
			}
			t.Fatalf("page token %q of a job with rows of its own: answered, want invalid_argument", token)
		}
		wantLimit(t, "a page token into the unknown-job log", err, connect.CodeInvalidArgument, "page_token")
	}
	// An operator reading the job is held to the same: its evidence is the
	// job's own rows.
	if _, err := admin.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: job, PageToken: "u1"})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("an operator's token into the unknown-job log of a job with rows: %v, want invalid_argument", err)
	}
	// A job without a lease still pages through its rows of the log.
	first, err := admin.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: "never-offered", PageSize: 1}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("a job nobody spoke of: %v (%v), want not_found", err, first)
	}
}
