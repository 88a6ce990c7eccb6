package controlplane_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The fifteenth hostile pass, at the tool (job-lease seed 000 §7, §9, §12):
// a fenced resource must refuse a holder whose authority ended, so a tool
// server's fence reads, besides a job's generation and state, what ends a
// generation's authority while it is ACTIVE — its expiry as the
// coordinator stated it, a cancel request, an ownership conflict — and an
// ACTIVE lease whose expiry the coordinator's clock has reached reads
// EXPIRED at once, as the coordinator judges any message for it, not only
// once its deadline sweep records it. The Go, TypeScript and Python fences
// that act on it are tested in their SDKs (agentsdk/rogue15fence_test.go).
func TestRogue15AToolServerReadsAGenerationsAuthority(t *testing.T) {
	w := newLeaseWorld(t)
	ctx := context.Background()
	tool := w.srv.Clients(w.srv.ToolServerToken(t, "rogue15-tool"))
	read := func(job string) *tetherv1.Lease {
		t.Helper()
		resp, err := tool.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: job}))
		if err != nil {
			t.Fatalf("a tool server's GetLease of %s: %v", job, err)
		}
		return resp.Msg.GetLease()
	}
	holder := unary{w.w1C}

	job := w.job()
	l, d := holder.send(t, ack(w.offer(t, job, w.w1, time.Minute)))
	wantDecision(t, "ack", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_ACKED)
	got := read(job)
	if got.GetState() != tetherv1.LeaseState_LEASE_STATE_ACTIVE || got.GetLeaseGeneration() != l.LeaseGeneration ||
		!got.GetExpiresAt().AsTime().Equal(l.ExpiresAt.AsTime()) || got.GetCancelRequested() {
		t.Fatalf("an ACTIVE lease as a tool server reads it: %v, want ACTIVE generation %d until %v", got, l.LeaseGeneration, l.ExpiresAt.AsTime())
	}
	if _, err := w.plannerC.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: job, Reason: "budget cut"})); err != nil {
		t.Fatal(err)
	}
	got = read(job)
	if got.GetState() != tetherv1.LeaseState_LEASE_STATE_ACTIVE || !got.GetCancelRequested() {
		t.Fatalf("a cancelled lease as a tool server reads it: %v, want ACTIVE with the cancel requested", got)
	}
	text := protojson.Format(got)
	if leaks := leaseLeaks(text, w.w1, w.planner, l.LeaseId, "budget cut"); len(leaks) > 0 {
		t.Fatalf("a tool server reading job %s learnt %q:\n%s", job, leaks, text)
	}

	lapsing := w.job()
	_, d = holder.send(t, ack(w.offer(t, lapsing, w.w1, 10*time.Second)))
	wantDecision(t, "ack", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_ACKED)
	w.clock.Advance(10 * time.Second)
	if got := read(lapsing); got.GetState() != tetherv1.LeaseState_LEASE_STATE_EXPIRED || got.GetExpiresAt() != nil {
		t.Fatalf("a lease whose expiry the coordinator's clock reached, as a tool server reads it: %v, want EXPIRED", got)
	}
}
