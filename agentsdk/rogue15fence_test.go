package agentsdk_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/tetherhq/tether/agentsdk"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The fifteenth hostile pass, at the tool, against the job-lease seed
// (000 §7, §9, §10, §12): a fenced resource refuses a holder that has no
// authority. A Fence with IssuedGenerations asked the coordinator only
// whether a generation was issued, once per generation: a holder whose
// job the coordinator cancelled, whose lease it let expire, whose job was
// resolved or completed or is in an ownership conflict, or that was only
// offered the job, kept writing through the fence for as long as no later
// generation was seen there (each of the six, checked against the old
// fence: answered 200 and the tool ran).
// FIXED: the fence asks for every side effect (or, with MaxStale, trusts
// an ACTIVE answer at most that long and never past the lease's expiry)
// and refuses a generation that is not ACTIVE, was asked to cancel, or
// carries an ownership conflict, with ErrNoAuthority (HTTP 403).

// fencedTool is a tool server behind a Fence asking the coordinator on
// its own tool-server credential: effects counts the side effects that
// got through.
type fencedTool struct {
	fence   *agentsdk.Fence
	handler http.Handler
	effects int
}

func newFencedTool(t *testing.T, s *leaseSetup, name string) *fencedTool {
	t.Helper()
	tool := agentsdk.Dial(s.srv.URL, s.srv.ToolServerToken(t, name), agentsdk.WithHTTPClient(s.srv.HTTP))
	f := &fencedTool{fence: &agentsdk.Fence{Check: agentsdk.IssuedGenerations(tool)}}
	f.handler = f.fence.Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { f.effects++ }))
	return f
}

// send makes one side effect with header's fencing headers and returns the
// HTTP status and the body (the fence's reason when refused).
func (f *fencedTool) send(header http.Header) (int, string) {
	r := httptest.NewRequest(http.MethodPost, "/write", nil)
	for k, v := range header {
		r.Header[k] = v
	}
	rec := httptest.NewRecorder()
	f.handler.ServeHTTP(rec, r)
	return rec.Code, rec.Body.String()
}

func fencing(job string, generation uint64) http.Header {
	h := http.Header{}
	h.Set(agentsdk.HeaderJobID, job)
	h.Set(agentsdk.HeaderLeaseGeneration, strconv.FormatUint(generation, 10))
	return h
}

// A rogue holder keeps calling a fenced tool after the coordinator took
// its authority away, each way the seed names: a cancel requested, the
// lease let expire, the job resolved, the job completed, an ownership
// conflict recorded; and a worker that was offered the job but never
// accepted it. Each was admitted before the
// fix (the fence had seen no later generation); each is refused now, the
// tool runs nothing, and the honest holder of an ACTIVE lease still
// writes.
func TestRogue15AFenceRefusesAHolderWithoutAuthority(t *testing.T) {
	s := newLeaseSetup(t)
	w := s.newWorker(t, t.TempDir(), time.Hour) // renewals driven by the test
	ctx := context.Background()
	tool := newFencedTool(t, s, "rogue15-fenced-tool")
	accept := func(job string, d time.Duration) *agentsdk.Job {
		t.Helper()
		j, dec, err := w.Accept(ctx, s.offer(t, job, d), agentsdk.JobOptions{})
		accepted(t, "accept "+job, dec, err)
		return j
	}
	header := func(j *agentsdk.Job) http.Header {
		h := http.Header{}
		j.Header(h)
		return h
	}
	// The rogue's side effect is refused with 403 and its reason; nothing ran.
	refused := func(what string, h http.Header, reason string) {
		t.Helper()
		before := tool.effects
		code, body := tool.send(h)
		if code != http.StatusForbidden || tool.effects != before {
			t.Fatalf("%s: the fence answered %d (%q) and the tool ran %d times; want 403 and nothing run", what, code, body, tool.effects-before)
		}
		if !strings.Contains(body, reason) {
			t.Fatalf("%s: the fence's refusal %q does not say %q", what, body, reason)
		}
	}
	admitted := func(what string, h http.Header) {
		t.Helper()
		before := tool.effects
		if code, body := tool.send(h); code != http.StatusOK || tool.effects != before+1 {
			t.Fatalf("%s: %d %q", what, code, body)
		}
	}

	// Cancelled: the coordinator asked the holder to stop; it keeps writing.
	cancelled := accept("job-cancelled", time.Minute)
	admitted("the holder before the cancel", header(cancelled))
	if _, err := s.planner.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: "job-cancelled", Reason: "stop"})); err != nil {
		t.Fatal(err)
	}
	refused("a write after the cancel request", header(cancelled), "cancel")

	// Expired: the coordinator let the lease lapse (no renewal).
	expired := accept("job-expired", 10*time.Second)
	admitted("the holder before the expiry", header(expired))
	s.clock.Advance(10 * time.Second)
	refused("a write after the lease expired", header(expired), "EXPIRED")

	// Resolved: cancelled and reconciled by the coordinator.
	resolved := accept("job-resolved", 5*time.Minute)
	admitted("the holder before the resolution", header(resolved))
	if _, err := s.planner.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: "job-resolved", Reason: "stop"})); err != nil {
		t.Fatal(err)
	}
	if _, err := s.planner.Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{JobId: "job-resolved", Result: tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED, Reason: "the worker never confirmed"})); err != nil {
		t.Fatal(err)
	}
	refused("a write after the job was resolved", header(resolved), "TERMINAL")

	// Completed: the holder itself reported success, then writes again.
	done := accept("job-done", 5*time.Minute)
	admitted("the holder before its result", header(done))
	d, err := done.Complete(ctx, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS, "done")
	accepted(t, "complete", d, err)
	refused("a write after the job completed", header(done), "TERMINAL")

	// Offered, never accepted: an offer carries no execution authority.
	offered := s.offer(t, "job-offered", 5*time.Minute)
	refused("a write under an offer nobody accepted", fencing("job-offered", offered.LeaseGeneration), "OFFERED")

	// Conflicted: a second claimant of the active generation (the job's
	// coordinating lineage renews it as if it held it): until the
	// coordinator resolves the conflict, no execution is valid (§12).
	conflicted := accept("job-conflicted", 5*time.Minute)
	admitted("the holder before the conflict", header(conflicted))
	l := conflicted.Lease()
	claim, err := s.planner.Lease.Renew(ctx, connect.NewRequest(&tetherv1.RenewRequest{JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration, RenewSequence: 1}))
	if err != nil || claim.Msg.Decision.AuditEvent != tetherv1.AuditEvent_AUDIT_EVENT_OWNERSHIP_CONFLICT {
		t.Fatalf("the second claim: %v %v", claim, err)
	}
	refused("a write under an ownership conflict", header(conflicted), "ownership conflict")

	// The honest holder of an ACTIVE lease writes, and keeps writing after
	// renewing past the first expiry.
	honest := accept("job-honest", 10*time.Second)
	admitted("the honest holder", header(honest))
	s.clock.Advance(5 * time.Second)
	d, err = honest.Renew(ctx)
	accepted(t, "renew", d, err)
	s.clock.Advance(9 * time.Second) // past the first expiry, before the renewed one
	admitted("the honest holder after renewing", header(honest))
}

// With MaxStale a fence trusts an answer that a generation may act for at
// most MaxStale from when it asked, and never past the expiry the
// coordinator stated: a cancel takes effect at the fence within MaxStale
// (here the first side effect after it still passes, the first after
// MaxStale is refused), an expiry at the expiry, and a refusal is never
// kept (every refused side effect asks again). The fence's clock is
// injected; here it is the coordinator's.
func TestRogue15AFenceTrustsAnActiveAnswerAtMostMaxStale(t *testing.T) {
	s := newLeaseSetup(t)
	w := s.newWorker(t, t.TempDir(), time.Hour)
	ctx := context.Background()
	tool := agentsdk.Dial(s.srv.URL, s.srv.ToolServerToken(t, "rogue15-stale-tool"), agentsdk.WithHTTPClient(s.srv.HTTP))
	asks := 0
	ask := agentsdk.IssuedGenerations(tool)
	fence := &agentsdk.Fence{MaxStale: 10 * time.Second, Clock: s.clock, Check: func(ctx context.Context, job string, generation uint64) (agentsdk.Authority, error) {
		asks++
		return ask(ctx, job, generation)
	}}
	admit := func(what, job string, generation uint64, wantAsks int, want error) {
		t.Helper()
		err := fence.AdmitContext(ctx, job, generation)
		if (want == nil) != (err == nil) || (want != nil && !errors.Is(err, want)) || asks != wantAsks {
			t.Fatalf("%s: %v after %d asks, want %v after %d", what, err, asks, want, wantAsks)
		}
	}

	j, d, err := w.Accept(ctx, s.offer(t, "job-stale", time.Minute), agentsdk.JobOptions{})
	accepted(t, "accept", d, err)
	g := j.Lease().LeaseGeneration
	admit("the first side effect", "job-stale", g, 1, nil)
	admit("the next, within MaxStale", "job-stale", g, 1, nil)
	if _, err := s.planner.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: "job-stale", Reason: "stop"})); err != nil {
		t.Fatal(err)
	}
	s.clock.Advance(9 * time.Second)
	admit("a side effect after the cancel, within MaxStale of the last ask (the stated bound)", "job-stale", g, 1, nil)
	s.clock.Advance(time.Second)
	admit("a side effect MaxStale after the last ask", "job-stale", g, 2, agentsdk.ErrNoAuthority)
	admit("the next refused side effect asks again", "job-stale", g, 3, agentsdk.ErrNoAuthority)
	admit("an unissued generation", "job-stale", g+1, 4, agentsdk.ErrUnissuedGeneration)

	short, d, err := w.Accept(ctx, s.offer(t, "job-short", 10*time.Second), agentsdk.JobOptions{})
	accepted(t, "accept", d, err)
	fence.MaxStale = time.Minute
	g = short.Lease().LeaseGeneration
	admit("a lease expiring in 10s", "job-short", g, 5, nil)
	s.clock.Advance(9 * time.Second)
	admit("before its expiry", "job-short", g, 5, nil)
	s.clock.Advance(time.Second)
	admit("at its expiry, within MaxStale", "job-short", g, 6, agentsdk.ErrNoAuthority)
}
