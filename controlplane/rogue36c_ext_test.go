package controlplane_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The thirty-sixth hostile pass, job leases × exit evidence: framing an
// honest sibling. Since the thirty-fifth pass a GetLease naming a job's
// current generation weighs the holder: after its confirmed exit the read
// is kept on it as a tool_call contradiction, so its record reads
// unaccounted. That read is a fence's question about a side effect — but
// any reader of the job could ask it: the job's owner (here a rogue
// sibling of the holder, w1, which offered the job to its own child before
// the parent handed it to w2), the holder's ancestors, an operator. The
// rogue waited for its honest sibling's exit, read the job naming its
// generation, and the sibling's record read unaccounted for a side effect
// nobody attempted (seen failing before the fix: one tool_call
// contradiction a read, naming the rogue; the record UNACCOUNTED). Now
// only a tool server's read — the fence's, which gates a side effect — is
// the holder's activity; any other reader is answered holder_exited
// (read, never written), and the honest holder's record reads CONFIRMED.
// The same read between the holder's session's end and its claim saw the
// holder alive after the end, so its claim was not corroborated (seen
// failing before the fix); now it is.
func TestRogue36CAReaderWhoIsNotAToolServerCannotFrameAnExitedHolder(t *testing.T) {
	readsDoNotFrameAnExitedHolder(t, newLeaseWorld(t))
}

// TestRogue36CAReaderWhoIsNotAToolServerCannotFrameAnExitedHolderOnEtcd is
// the same on a server on etcd (one replica, serving the leases), where
// the holder's node is read from the store.
func TestRogue36CAReaderWhoIsNotAToolServerCannotFrameAnExitedHolderOnEtcd(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the etcd stores; make test and CI run them.")
	}
	w := newLeaseWorldOnEtcd(t)
	readsDoNotFrameAnExitedHolder(t, w)
}

// readsDoNotFrameAnExitedHolder: w.w1 owns a job that w.w2 holds; w2
// exits honestly; w1, their parent and an operator read the job naming
// w2's generation, are told w2 exited, and nothing is kept on w2, whose
// stop's record reads it confirmed.
func readsDoNotFrameAnExitedHolder(t *testing.T, w *leaseWorld) {
	t.Helper()
	ctx := context.Background()

	// The rogue w1 offers a job to its own child, so it is the job's owner;
	// the parent hands the job to the honest w2, w1's sibling, and w2 takes
	// it. The owner's lineage coordinates the job, so w1 reads it.
	child := spawn(t, w.w1C, w.w1, "w1-child")
	job := w.job()
	offered, err := w.w1C.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: child.Node.NodeId, LeaseDuration: durationpb.New(10 * time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	wantDecision(t, "the rogue's offer", offered.Msg.Decision, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_OFFERED)
	moved, err := w.plannerC.Lease.Reassign(ctx, connect.NewRequest(&tetherv1.ReassignRequest{JobId: job, HolderIdentity: w.w2, LeaseDuration: durationpb.New(10 * time.Minute), Reason: "w2 takes it"}))
	if err != nil {
		t.Fatal(err)
	}
	honest, d := unary{w.w2C}.send(t, ack(moved.Msg.Lease))
	wantDecision(t, "the honest holder's ack", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_ACKED)

	// The honest holder ends its session, then claims its exit: confirmed.
	w.endSession(t, w.w2C, w.w2)
	// Between its session's end and its claim the rogue reads the job
	// naming its generation: the holder is not seen alive by it (before the
	// fix it was, and its claim was not corroborated: no exit confirmed).
	for _, g := range []uint64{honest.LeaseGeneration, 0} {
		resp, err := w.w1C.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: job, LeaseGeneration: g}))
		if err != nil || resp.Msg.GetHolderExited() {
			t.Fatalf("the rogue's read of generation %d before the holder's claim: %v, %v; want the lease, holder_exited unset", g, resp, err)
		}
	}
	if _, err := w.w2C.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: w.w2, Reason: "done, gone"})); err != nil {
		t.Fatal(err)
	}
	if n := getNode(t, w.admin, w.w2); n.GetExitedAt() == nil || len(n.Contradictions) != 0 {
		t.Fatalf("the honest holder after its exit: %v", n)
	}

	// The rogue owner, the holder's parent and an operator each read the
	// job naming the honest holder's generation, twice. Each is told the
	// holder exited; none of it is the holder's activity.
	for _, r := range []struct {
		who string
		c   *testserver.Clients
	}{{"the rogue owner", w.w1C}, {"the holder's parent", w.plannerC}, {"an operator", w.admin}} {
		for range 2 {
			resp, err := r.c.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: job, LeaseGeneration: honest.LeaseGeneration}))
			if err != nil {
				t.Fatalf("%s's read: %v", r.who, err)
			}
			if !resp.Msg.GetHolderExited() || resp.Msg.GetLease().GetLeaseGeneration() != honest.LeaseGeneration {
				t.Fatalf("%s's read of the exited holder's generation: %v, want holder_exited", r.who, resp.Msg)
			}
		}
		if n := getNode(t, w.admin, w.w2); len(n.Contradictions) != 0 {
			t.Fatalf("after %s's reads the honest holder has contradictions %v (%v): framed by a read", r.who, contradictionKinds(n.Contradictions), n.Contradictions)
		}
	}

	// Its stop: the record reads the honest holder's exit confirmed.
	term := terminate(t, w.admin, w.w2, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Minute, time.Minute, time.Minute)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	w.clock.Advance(5 * time.Minute)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	c := recordNode(t, record(t, w.admin, term.TerminationId), w.w2)
	if c.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_CONFIRMED || len(c.Contradictions) != 0 {
		t.Fatalf("record: the honest holder %s (%s) with contradictions %v, want confirmed", c.Outcome, c.UnaccountedReason, contradictionKinds(c.Contradictions))
	}
}
