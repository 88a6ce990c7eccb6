package controlplane_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// Acceptance probes of the termination seed (003), round 7: the hostile
// agent being stopped writing its own evidence, stalling each phase and
// shielding its children, and whether its record can be told from a
// cooperative agent's.

// seed7Job offers C a job from its parent P (P owns it) and has C take it.
func seed7Job(t *testing.T, w *seedWorld, job string) *tetherv1.Lease {
	t.Helper()
	resp, err := w.pAgent.Lease.Offer(context.Background(), connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: w.c.Node.NodeId, LeaseDuration: durationpb.New(10 * time.Minute)}))
	if err != nil {
		t.Fatalf("offer %s: %v", job, err)
	}
	l, d := unary{w.cAgent}.send(t, ack(resp.Msg.Lease))
	wantDecision(t, "ack", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_ACKED)
	return l
}

// TestSeed7ACoordinatorBeingStoppedCannotWriteItsChildsJobsEnd: the record
// must not rest on the stopped agents' word. The parent P offered its
// child C a job, which C holds; an operator drains P's subtree while C has
// a tool call in flight. P — a coordinator of the job, but part of the
// workload being stopped — resolves C's job itself, FAILED and then
// CANCELLED ("C finished cleanly"), while it drains and again while it
// aborts: had it been accepted, the record's lease entry would read like a
// job its lineage closed before the stop, on nobody's word but the rogue's.
// Each is refused failed_precondition naming the state, before the lease
// machine (the lease and its evidence unchanged); the record then says how
// the job really ended: C never acknowledged the termination's cancel
// request, so UNRESOLVED.
func TestSeed7ACoordinatorBeingStoppedCannotWriteItsChildsJobsEnd(t *testing.T) {
	w := newSeedWorld(t)
	ctx := context.Background()
	job := seed7Job(t, w, "seed7-resolve")
	if _, err := w.begin(w.gC.token); err != nil {
		t.Fatal(err)
	}
	term := terminate(t, w.admin, w.p.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Minute, time.Minute, time.Minute)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)

	lease := func() *tetherv1.Lease {
		resp, err := w.admin.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: job.JobId}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg.Lease
	}
	rows := func() int {
		resp, err := w.admin.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: job.JobId}))
		if err != nil {
			t.Fatal(err)
		}
		return len(resp.Msg.Rows)
	}
	resolve := func(state string) {
		t.Helper()
		before, n := lease(), rows()
		for _, result := range []tetherv1.TerminalResult{tetherv1.TerminalResult_TERMINAL_RESULT_FAILED, tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED} {
			_, err := w.pAgent.Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{JobId: job.JobId, Result: result, Reason: "C finished cleanly"}))
			wantRefused(t, "the stopping parent's "+result.String()+" of its child's job while "+state, err, connect.CodeFailedPrecondition, w.p.Node.NodeId, state)
		}
		if after := lease(); !proto.Equal(after, before) {
			t.Errorf("a refused resolution changed the lease:\nbefore %v\nafter  %v", before, after)
		}
		if m := rows(); m != n {
			t.Errorf("a refused resolution left %d evidence rows, want none (%d before, %d after)", m-n, n, m)
		}
	}
	resolve("draining")

	w.clk.Advance(2 * time.Minute) // the drain escalates: P and C abort
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_ABORTING)
	resolve("aborting")

	w.clk.Advance(2 * time.Minute) // the gate never acknowledges; C never acks the job's cancel
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	w.clk.Advance(2 * time.Minute)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, w.admin, term.TerminationId)
	if len(rec.Leases) != 1 || rec.Leases[0].JobId != job.JobId || rec.Leases[0].Outcome != tetherv1.LeaseOutcome_LEASE_OUTCOME_UNRESOLVED || rec.Leases[0].TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_UNRESOLVED {
		t.Fatalf("record leases %v, want %s unresolved (its holder never acknowledged the cancel request)", rec.Leases, job.JobId)
	}
}
