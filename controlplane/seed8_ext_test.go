package controlplane_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The workload could write its own evidence: the termination seed asks the
// reconciliation record to tell what the control plane confirmed from what
// an agent claimed. A lease entry used to say how a job ended (COMPLETED,
// SUCCESS) but not on whose word, so a holder that reports SUCCESS while
// it is being drained read exactly like a cooperative holder's result of
// before the stop, and a job the termination itself ended read like one
// the holder reported.

// TestSeed8TheRecordSaysOnWhoseWordEachLeaseEnded: an operator drains P
// (C's tool call in flight keeps the drain open). C's jobs end five ways:
//
//   - coop: C reported SUCCESS before the stop — the holder's report;
//   - rogue: C reports SUCCESS while it drains — the holder's report too,
//     but listed as its claim under stop, not confirmed;
//   - by-parent: P (C's parent, the job's coordinating lineage) resolved
//     it FAILED before the stop — the coordinator's resolution, naming P;
//   - by-operator: an operator resolved it FAILED — the coordinator's
//     resolution, naming no node;
//   - left: C never reported — the termination ended it (UNRESOLVED: C
//     still had authority and did not acknowledge the cancel request).
//
// Every fact comes from the lease's own evidence (which message gave the
// job its result, judged when); C sends nothing that could say otherwise.
func TestSeed8TheRecordSaysOnWhoseWordEachLeaseEnded(t *testing.T) {
	w := newSeedWorld(t)
	ctx := context.Background()
	c := w.c.Node.NodeId
	p := w.p.Node.NodeId
	jobs := map[string]*tetherv1.Lease{}
	for _, job := range []string{"coop", "rogue", "by-parent", "by-operator", "left"} {
		jobs[job] = w.offerAcked(t, job, c, unary{w.cAgent})
	}

	// Before the stop: C's cooperative result, P's and an operator's
	// resolutions.
	before := w.clk.Now()
	_, d := unary{w.cAgent}.send(t, complete(jobs["coop"], tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS))
	wantDecision(t, "C's cooperative completion", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_TERMINAL_ACCEPTED)
	if _, err := w.pAgent.Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{JobId: "by-parent", Result: tetherv1.TerminalResult_TERMINAL_RESULT_FAILED, Reason: "the parent gave up on it"})); err != nil {
		t.Fatalf("P resolves by-parent: %v", err)
	}
	if _, err := w.admin.Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{JobId: "by-operator", Result: tetherv1.TerminalResult_TERMINAL_RESULT_FAILED, Reason: "operator's call"})); err != nil {
		t.Fatalf("the operator resolves by-operator: %v", err)
	}

	if _, err := w.begin(w.gC.token); err != nil {
		t.Fatal(err)
	}
	w.clk.Advance(time.Second)
	term := terminate(t, w.admin, p, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Minute, time.Second, time.Minute)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)

	// The rogue: C, being drained, reports SUCCESS for a job it was told
	// nothing about. The lease machine accepts a holder's result while it
	// drains (work in flight may end); the record must not confirm it.
	w.clk.Advance(10 * time.Second)
	underStop := w.clk.Now()
	_, d = unary{w.cAgent}.send(t, complete(jobs["rogue"], tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS))
	wantDecision(t, "C's completion while it drains", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_TERMINAL_ACCEPTED)

	w.clk.Advance(time.Minute) // the drain escalates; the gate never acknowledges
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_ABORTING)
	w.clk.Advance(2 * time.Second)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	w.clk.Advance(2 * time.Minute)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)

	rec := record(t, w.admin, term.TerminationId)
	got := map[string]*tetherv1.RecordLease{}
	for _, l := range rec.Leases {
		got[l.JobId] = l
	}
	entry := func(job string) string {
		l := got[job]
		if l == nil {
			return "missing"
		}
		at := "-"
		if l.EndedAt != nil {
			at = l.EndedAt.AsTime().Sub(epoch).String()
		}
		return fmt.Sprintf("%s %s %s node=%q at=%s under_stop=%t", l.Outcome, l.TerminalResult, l.EndedBy, l.EndedByNodeId, at, l.ClaimedUnderStop)
	}
	var reconciledAt string
	if l := got["left"]; l != nil && l.EndedAt != nil {
		reconciledAt = l.EndedAt.AsTime().Sub(epoch).String()
	}
	want := map[string]string{
		"coop":        fmt.Sprintf("LEASE_OUTCOME_COMPLETED TERMINAL_RESULT_SUCCESS LEASE_ENDED_BY_HOLDER_REPORT node=%q at=%s under_stop=false", c, before.Sub(epoch)),
		"rogue":       fmt.Sprintf("LEASE_OUTCOME_COMPLETED TERMINAL_RESULT_SUCCESS LEASE_ENDED_BY_HOLDER_REPORT node=%q at=%s under_stop=true", c, underStop.Sub(epoch)),
		"by-parent":   fmt.Sprintf("LEASE_OUTCOME_COMPLETED TERMINAL_RESULT_FAILED LEASE_ENDED_BY_COORDINATOR_RESOLUTION node=%q at=%s under_stop=false", p, before.Sub(epoch)),
		"by-operator": fmt.Sprintf("LEASE_OUTCOME_COMPLETED TERMINAL_RESULT_FAILED LEASE_ENDED_BY_COORDINATOR_RESOLUTION node=\"\" at=%s under_stop=false", before.Sub(epoch)),
		"left":        fmt.Sprintf("LEASE_OUTCOME_UNRESOLVED TERMINAL_RESULT_UNRESOLVED LEASE_ENDED_BY_TERMINATION node=\"\" at=%s under_stop=false", reconciledAt),
	}
	for _, job := range []string{"coop", "rogue", "by-parent", "by-operator", "left"} {
		if g := entry(job); g != want[job] {
			t.Errorf("record lease %s:\n got %s\nwant %s", job, g, want[job])
		}
	}
	if reconciledAt == "" || !got["left"].EndedAt.AsTime().After(underStop) {
		t.Errorf("the job the termination ended names no time after the stop: %v", got["left"])
	}

	// The point of it: the rogue's SUCCESS and the cooperative one are
	// the same result, and the record tells them apart.
	rogue, coop := got["rogue"], got["coop"]
	if rogue == nil || coop == nil {
		t.Fatalf("the record lists rogue %v and coop %v", rogue, coop)
	}
	if rogue.TerminalResult != coop.TerminalResult || rogue.Outcome != coop.Outcome {
		t.Fatalf("rogue %v and coop %v should carry the same result", rogue, coop)
	}
	if !rogue.ClaimedUnderStop || coop.ClaimedUnderStop {
		t.Fatalf("the record does not tell the draining holder's claim (%v) from the cooperative result (%v)", rogue, coop)
	}
}

// TestSeed8AResultTheTerminationImposedIsNotTheHolders: a job whose holder
// acknowledged the cancel request ends CANCELLED on the termination's
// word (it reconciled the acknowledgement), a job whose lease ran out ends
// on the termination's word too, and a job its holder reports CANCELLED
// itself while it is being aborted ends on the holder's word, as its
// claim under stop — never the one passed off as the other. The
// acknowledgement came while the holder was being stopped, so the
// CANCELLED it rests on is flagged as the holder's claim under stop too
// (twenty-seventh pass, TestRogue27AHoldersCancelAckUnderItsStopIsItsClaim).
func TestSeed8AResultTheTerminationImposedIsNotTheHolders(t *testing.T) {
	w := newSeedWorld(t)
	ctx := context.Background()
	c := w.c.Node.NodeId
	jobs := map[string]*tetherv1.Lease{}
	for _, job := range []string{"acked", "reported", "expired"} {
		d := 10 * time.Minute
		if job == "expired" {
			d = 30 * time.Second
		}
		resp, err := w.admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: c, LeaseDuration: durationpb.New(d)}))
		if err != nil {
			t.Fatalf("offer %s: %v", job, err)
		}
		l, dec := unary{w.cAgent}.send(t, ack(resp.Msg.Lease))
		wantDecision(t, "ack "+job, dec, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_ACKED)
		jobs[job] = l
	}
	// The operator asks for the two cancellations (a coordinator's
	// request), then aborts P's subtree. While C is being stopped it
	// acknowledges one request and reports the other job CANCELLED.
	for _, job := range []string{"acked", "reported"} {
		if _, err := w.admin.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: job, Reason: "stop"})); err != nil {
			t.Fatalf("request cancel %s: %v", job, err)
		}
	}
	w.clk.Advance(time.Second)
	term := terminate(t, w.admin, w.p.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Minute, time.Minute)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	_, dec := unary{w.cAgent}.send(t, cancelAck(jobs["acked"]))
	wantDecision(t, "C's cancel acknowledgement", dec, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_CANCEL_ACKED)
	_, dec = unary{w.cAgent}.send(t, complete(jobs["reported"], tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED))
	wantDecision(t, "C's CANCELLED while it is stopped", dec, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_TERMINAL_ACCEPTED)
	w.clk.Advance(2 * time.Minute) // past the confirm timeout and the short lease
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, w.admin, term.TerminationId)
	got := map[string]string{}
	for _, l := range rec.Leases {
		got[l.JobId] = fmt.Sprintf("%s %s %s node=%q under_stop=%t", l.Outcome, l.TerminalResult, l.EndedBy, l.EndedByNodeId, l.ClaimedUnderStop)
	}
	want := map[string]string{
		"acked":    "LEASE_OUTCOME_CANCELLED TERMINAL_RESULT_CANCELLED LEASE_ENDED_BY_TERMINATION node=\"\" under_stop=true",
		"reported": fmt.Sprintf("LEASE_OUTCOME_CANCELLED TERMINAL_RESULT_CANCELLED LEASE_ENDED_BY_HOLDER_REPORT node=%q under_stop=true", c),
		"expired":  "LEASE_OUTCOME_EXPIRED TERMINAL_RESULT_FAILED LEASE_ENDED_BY_TERMINATION node=\"\" under_stop=false",
	}
	for job, w := range want {
		if got[job] != w {
			t.Errorf("record lease %s:\n got %s\nwant %s", job, got[job], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("record leases %v, want %v", got, want)
	}
}
