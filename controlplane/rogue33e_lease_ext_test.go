package controlplane_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue33EAnOwnerBelowTheJobsHolderCoordinatesNothing: an agent offers
// a job to its child; its own parent's parent (the root) moves the job up
// to the agent's parent, which ACKs and works on it. The job's owner is
// now a descendant of its holder. The owner's lineage kept coordinating
// the job wherever it went in its tree, so the rogue child could ask its
// parent's job to stop, resolve it FAILED, claim it (an ownership conflict
// that halts its parent's work), read it, and take it back for its own
// child (seen failing: each was judged and ACCEPTED, or recorded). A
// holder's descendants never coordinate its job: each is refused as a
// stranger's, before the lease machine, nothing recorded.
func TestRogue33EAnOwnerBelowTheJobsHolderCoordinatesNothing(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx := context.Background()
	root := register(t, admin, "ops")
	rootC := srv.Clients(root.Credential)
	lead := spawn(t, rootC, root.Node.NodeId, "lead")
	leadC := srv.Clients(lead.Credential)
	rogue := spawn(t, leadC, lead.Node.NodeId, "rogue")
	rogueC := srv.Clients(rogue.Credential)
	child := spawn(t, rogueC, rogue.Node.NodeId, "child")

	const job = "r33e-moved-up"
	g1, err := offerTo(rogueC, child.Node.NodeId, job)
	if err != nil {
		t.Fatal(err)
	}
	r22Ack(t, srv.Clients(child.Credential), g1)
	// The root moves the job up to the lead, which takes it.
	resp, err := rootC.Lease.Reassign(ctx, connect.NewRequest(&tetherv1.ReassignRequest{
		JobId: job, HolderIdentity: lead.Node.NodeId, LeaseDuration: durationpb.New(5 * time.Minute), Reason: "the lead takes it over"}))
	r22Decision(t, "the move up", resp.Msg.GetDecision(), err, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_REASSIGNED)
	g2 := resp.Msg.Lease
	r22Ack(t, leadC, g2)
	before := r22Lease(t, admin, job)
	rows := len(r22Evidence(t, admin, job))

	stranger := func(what string, err error) {
		t.Helper()
		if connect.CodeOf(err) != connect.CodePermissionDenied {
			t.Fatalf("the owner below the holder: %s: %v, want permission_denied as for a stranger", what, err)
		}
	}
	_, err = rogueC.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: job, Reason: "stop, parent"}))
	stranger("cancel request", err)
	_, err = rogueC.Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{JobId: job, Result: tetherv1.TerminalResult_TERMINAL_RESULT_FAILED, Reason: "it failed"}))
	stranger("resolve FAILED", err)
	_, err = rogueC.Lease.Reassign(ctx, connect.NewRequest(&tetherv1.ReassignRequest{
		JobId: job, HolderIdentity: child.Node.NodeId, LeaseDuration: durationpb.New(5 * time.Minute), Reason: "mine again"}))
	stranger("reassign to its own child", err)
	_, err = rogueC.Lease.Renew(ctx, connect.NewRequest(&tetherv1.RenewRequest{JobId: job, LeaseId: g2.LeaseId, LeaseGeneration: g2.LeaseGeneration, RenewSequence: 1}))
	stranger("a claim on the lead's generation", err)
	_, err = rogueC.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: job}))
	stranger("read", err)
	_, err = rogueC.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: job}))
	stranger("evidence", err)

	after := r22Lease(t, admin, job)
	if after.LeaseGeneration != before.LeaseGeneration || after.HolderIdentity != lead.Node.NodeId || after.State != tetherv1.LeaseState_LEASE_STATE_ACTIVE ||
		after.CancelRequested || after.OwnershipConflict || after.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_UNSPECIFIED {
		t.Fatalf("after the rogue's tries the lease is generation %d held by %s, %v, cancel %v, conflict %v, result %v; want the lead's generation %d ACTIVE as it was",
			after.LeaseGeneration, after.HolderIdentity, after.State, after.CancelRequested, after.OwnershipConflict, after.TerminalResult, before.LeaseGeneration)
	}
	if got := len(r22Evidence(t, admin, job)); got != rows {
		t.Fatalf("the rogue's tries wrote %d evidence rows, want none", got-rows)
	}

	// The lead's ancestors still coordinate it, and the lead's own work
	// goes on.
	renew, err := leadC.Lease.Renew(ctx, connect.NewRequest(&tetherv1.RenewRequest{JobId: job, LeaseId: g2.LeaseId, LeaseGeneration: g2.LeaseGeneration, RenewSequence: 1}))
	r22Decision(t, "the lead's renewal", renew.Msg.GetDecision(), err, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RENEWED)
	cancel, err := rootC.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: job, Reason: "done with it"}))
	r22Decision(t, "the root's cancel request", cancel.Msg.GetDecision(), err, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_CANCEL_REQUESTED)
}
