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

// TestSeed7ANodeBeingStoppedGetsNoFreshToken: draining refuses new tool
// calls — at every gate, including one that checks tokens offline and
// never asks the ledger, where the only bound is the token's few minutes
// of life. The child C is drained with its parent (its call in flight
// keeps the drain open for an hour); C, and an operator on its behalf,
// ask for a fresh token of C's grant, which would let C call such a tool
// for the whole window. Both are refused failed_precondition naming the
// state, while draining and while aborting; C's token of before the stop
// is the last it gets, and its parent, still running, refreshes as before.
func TestSeed7ANodeBeingStoppedGetsNoFreshToken(t *testing.T) {
	w := newSeedWorld(t)
	ctx := context.Background()
	// A running node refreshes.
	if _, err := w.cAgent.Capability.Refresh(ctx, connect.NewRequest(&tetherv1.RefreshRequest{GrantId: w.gC.grant.GrantId})); err != nil {
		t.Fatalf("a running node's refresh: %v", err)
	}
	if _, err := w.begin(w.gC.token); err != nil {
		t.Fatal(err)
	}
	term := terminate(t, w.admin, w.c.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, 10*time.Minute, time.Hour, time.Minute)
	refresh := func(state string) {
		t.Helper()
		for who, c := range map[string]interface {
			Refresh(context.Context, *connect.Request[tetherv1.RefreshRequest]) (*connect.Response[tetherv1.RefreshResponse], error)
		}{"the stopping child": w.cAgent.Capability, "an operator": w.admin.Capability} {
			resp, err := c.Refresh(ctx, connect.NewRequest(&tetherv1.RefreshRequest{GrantId: w.gC.grant.GrantId}))
			if err == nil {
				t.Errorf("%s's refresh while %s minted a token until %s", who, state, resp.Msg.TokenExpiresAt.AsTime())
				continue
			}
			wantRefused(t, who+"'s refresh while "+state, err, connect.CodeFailedPrecondition, w.c.Node.NodeId, state)
		}
	}
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)
	refresh("draining")
	// The parent, still running, refreshes its own grant.
	if _, err := w.pAgent.Capability.Refresh(ctx, connect.NewRequest(&tetherv1.RefreshRequest{GrantId: w.gP.grant.GrantId})); err != nil {
		t.Fatalf("the running parent's refresh: %v", err)
	}
	w.clk.Advance(11 * time.Minute)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_ABORTING)
	refresh("aborting")
}
