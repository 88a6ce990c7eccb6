package controlplane_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The fourteenth hostile pass over job leases, against the job-lease seed
// (000): a hostile holder, a former holder, a sibling, a rogue coordinator
// and a rogue tool server, each trying to fake evidence, freeze another's
// job or dodge a cancel. What each test holds:
//
//	TestRogue14AToolServerReadsOnlyAJobsGeneration (seed §3, §8, §10, and
//	    the house rule "reveals nothing it should not"): a tool server's
//	    credential may call GetLease so that its fence can ask whether a
//	    generation was issued. It was answered the whole lease of any job
//	    of any tree — the holder's node id, the lease id, the progress value
//	    the holder reported and its terminal detail — for the price of
//	    guessing a job id (ids are chosen by clients: "job-1"). FIXED: a
//	    tool server is answered the job id, its generation and its state,
//	    what a fence needs, nothing of the holder's or coordinator's words.
//
// The same pass found two holes in the SDKs' lease workers (Go, TypeScript,
// Python), held by agentsdk/rogue14lease_test.go and the SDKs' seed tests:
// a worker restarted (kill -9) after it renewed and reported progress
// started its sequences at 0 again, its renewals refused STALE_RENEW until
// the lease lapsed and its reports kept as late progress (FIXED: it goes on
// from the accepted sequences); and it did not act on its ACK's answer, so
// a cancel requested while it was down reached it only at its first renewal
// (FIXED). Limits left, design §11: a Fence orders generations but does not
// check authority (an expired, cancelled or terminal generation passes
// until a later one is seen there; since fixed, rogue15fence); a job's holder reads the evidence of
// earlier generations, and a job's offering agent keeps coordinating it,
// across trees after an operator's reassignment (the cross-tree half since
// closed: rogue15reassign_ext_test.go).

// A rogue tool server (any tool the operator registered, and so any tool an
// agent of any tree may call) asks the coordinator about a job of a tree it
// serves nothing for. It learns that the job exists and its generation —
// what its fence needs to refuse an unissued one — and nothing else: not
// who holds it, not the lease id a worker message names, not what the
// holder reported as its progress or its result, nor who cancelled it.
func TestRogue14AToolServerReadsOnlyAJobsGeneration(t *testing.T) {
	w := newLeaseWorld(t)
	ctx := context.Background()
	job := w.job()
	l := w.offer(t, job, w.w1, time.Minute)
	holder := unary{w.w1C}
	_, d := holder.send(t, ack(l))
	wantDecision(t, "ack", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_ACKED)
	const secretProgress, secretDetail = "customer-ledger-row-4411 copied", "wrote s3://payroll/2026-11.csv"
	_, d = holder.send(t, progress(l, 1, secretProgress))
	wantDecision(t, "progress", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_PROGRESS_RECORDED)
	if _, err := w.plannerC.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: job, Reason: "budget cut"})); err != nil {
		t.Fatalf("request cancel: %v", err)
	}
	done := complete(l, tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED)
	done.GetComplete().Detail = secretDetail
	_, d = holder.send(t, done)
	wantDecision(t, "complete", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_TERMINAL_ACCEPTED)

	tool := w.srv.Clients(w.srv.ToolServerToken(t, "rogue-tool"))
	resp, err := tool.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: job}))
	if err != nil {
		t.Fatalf("a tool server's GetLease (its fence's check): %v", err)
	}
	got := resp.Msg.GetLease()
	if got.GetJobId() != job || got.GetLeaseGeneration() != 1 || got.GetState() != tetherv1.LeaseState_LEASE_STATE_TERMINAL {
		t.Fatalf("a tool server reads job %q generation %d %s, want %q generation 1 TERMINAL (what its fence needs)",
			got.GetJobId(), got.GetLeaseGeneration(), got.GetState(), job)
	}
	text := protojson.Format(resp.Msg)
	if leaks := leaseLeaks(text, w.w1, w.planner, l.LeaseId, secretProgress, secretDetail, "budget cut"); len(leaks) > 0 {
		t.Fatalf("a tool server reading job %s learnt %q of another tree's job:\n%s", job, leaks, text)
	}
	if strings.Contains(text, "progress") || strings.Contains(text, "cancel") {
		t.Fatalf("a tool server reads more than the job's generation and state:\n%s", text)
	}
	// The holder and the operator still read the whole lease.
	if full := w.get(t, job); full.GetProgressValue() != secretProgress || full.GetHolderIdentity() != w.w1 {
		t.Fatalf("the operator reads progress %q holder %q, want the whole lease", full.GetProgressValue(), full.GetHolderIdentity())
	}
}
