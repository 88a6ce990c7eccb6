package controlplane_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The twenty-second hostile pass over the job leases: decisions about a
// generation since replaced, and decisions by an agent whose stop was
// requested, against the real server.

// r22Evidence reads every evidence row of job as the operator.
func r22Evidence(t *testing.T, admin *testserver.Clients, job string) []*tetherv1.EvidenceRow {
	t.Helper()
	resp, err := admin.Lease.Evidence(context.Background(), connect.NewRequest(&tetherv1.EvidenceRequest{JobId: job}))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg.Rows
}

// r22Lease reads job's lease as the operator.
func r22Lease(t *testing.T, admin *testserver.Clients, job string) *tetherv1.Lease {
	t.Helper()
	resp, err := admin.Lease.GetLease(context.Background(), connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: job}))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg.Lease
}

// r22Ack has c, the holder, ACK l.
func r22Ack(t *testing.T, c *testserver.Clients, l *tetherv1.Lease) {
	t.Helper()
	resp, err := c.Lease.Ack(context.Background(), connect.NewRequest(&tetherv1.AckRequest{JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration}))
	if err != nil {
		t.Fatal(err)
	}
	if o := resp.Msg.Decision.Outcome; o != tetherv1.Outcome_OUTCOME_ACCEPTED {
		t.Fatalf("ack: %v %s", o, resp.Msg.Decision.Reason)
	}
}

// r22Decision checks a judged decision's outcome and event.
func r22Decision(t *testing.T, what string, d *tetherv1.Decision, err error, outcome tetherv1.Outcome, event tetherv1.AuditEvent) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v, want a judged decision", what, err)
	}
	if d.Outcome != outcome || d.AuditEvent != event {
		t.Fatalf("%s: %v %v (%s), want %v %v", what, d.Outcome, d.AuditEvent, d.Reason, outcome, event)
	}
}

// TestRogue22ADecisionAboutAReplacedGenerationChangesNothing: a
// coordinator's RequestCancel, Reassign and Resolve carried no lease
// generation, so a decision made about one generation applied to whichever
// was current when it arrived: an operator's reassignment, retried after a
// timeout that hid its success, issued generation 3 (seen failing: the
// retry was ACCEPTED REASSIGNED); an operator's delayed "resolve FAILED"
// about generation 1 ended generation 2. A decision may now name its
// generation (lease_generation): naming one since replaced, it is
// REJECTED STALE_GENERATION (never issued: FUTURE_GENERATION), recorded
// as one evidence row, and changes nothing; naming none, it decides about
// the current generation, as before.
func TestRogue22ADecisionAboutAReplacedGenerationChangesNothing(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx := context.Background()
	root := register(t, admin, "ops")
	rootC := srv.Clients(root.Credential)
	lead := spawn(t, rootC, root.Node.NodeId, "lead")
	leadC := srv.Clients(lead.Credential)
	w1 := spawn(t, leadC, lead.Node.NodeId, "w1")
	w2 := spawn(t, leadC, lead.Node.NodeId, "w2")

	const job = "r22-gen"
	g1, err := offerTo(leadC, w1.Node.NodeId, job)
	if err != nil {
		t.Fatal(err)
	}
	r22Ack(t, srv.Clients(w1.Credential), g1)

	// The lead moves the job from generation 1 to w2, naming generation 1.
	reassign := &tetherv1.ReassignRequest{JobId: job, HolderIdentity: w2.Node.NodeId, LeaseDuration: durationpb.New(5 * time.Minute), Reason: "w1 is slow", LeaseGeneration: 1}
	resp, err := leadC.Lease.Reassign(ctx, connect.NewRequest(reassign))
	r22Decision(t, "the reassignment", resp.Msg.GetDecision(), err, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_REASSIGNED)
	g2 := resp.Msg.Lease
	if g2.LeaseGeneration != 2 {
		t.Fatalf("the reassignment issued generation %d, want 2", g2.LeaseGeneration)
	}
	rows := len(r22Evidence(t, admin, job))

	// Its retry: no generation 3.
	resp, err = leadC.Lease.Reassign(ctx, connect.NewRequest(reassign))
	r22Decision(t, "the retried reassignment", resp.Msg.GetDecision(), err, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_STALE_GENERATION)
	if !strings.Contains(resp.Msg.Decision.Reason, "generation 1") {
		t.Fatalf("the refusal says %q; want it to name the generation decided about", resp.Msg.Decision.Reason)
	}
	if l := r22Lease(t, admin, job); l.LeaseGeneration != 2 || l.LeaseId != g2.LeaseId || l.HolderIdentity != w2.Node.NodeId || l.State != tetherv1.LeaseState_LEASE_STATE_OFFERED || l.StaleGeneration {
		t.Fatalf("after the retried reassignment the lease is generation %d (%s, %s, %v, stale flag %v); want generation 2 as it was", l.LeaseGeneration, l.LeaseId, l.HolderIdentity, l.State, l.StaleGeneration)
	}
	r22Ack(t, srv.Clients(w2.Credential), g2)

	// The operator's late decisions about generation 1, and one about a
	// generation never issued.
	res, err := admin.Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{JobId: job, Result: tetherv1.TerminalResult_TERMINAL_RESULT_FAILED, Reason: "w1 crashed", LeaseGeneration: 1}))
	r22Decision(t, "the late resolution", res.Msg.GetDecision(), err, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_STALE_GENERATION)
	cancel, err := admin.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: job, Reason: "stop w1", LeaseGeneration: 1}))
	r22Decision(t, "the late cancel request", cancel.Msg.GetDecision(), err, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_STALE_GENERATION)
	cancel, err = admin.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: job, Reason: "ahead", LeaseGeneration: 3}))
	r22Decision(t, "a cancel request about generation 3", cancel.Msg.GetDecision(), err, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_FUTURE_GENERATION)
	l := r22Lease(t, admin, job)
	if l.LeaseGeneration != 2 || l.State != tetherv1.LeaseState_LEASE_STATE_ACTIVE || l.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_UNSPECIFIED || l.CancelRequested {
		t.Fatalf("after the late decisions the lease is generation %d %v, result %v, cancel requested %v; want generation 2 ACTIVE as it was", l.LeaseGeneration, l.State, l.TerminalResult, l.CancelRequested)
	}
	// Each refusal is one evidence row, saying what was refused.
	all := r22Evidence(t, admin, job)
	if got := len(all) - rows; got != 5 {
		t.Fatalf("%d evidence rows for the four refused decisions and generation 2's ACK, want 5", got)
	}
	// The ACK's row is the second.
	for i, want := range map[int]string{0: "reassign", 2: "resolve", 3: "request_cancel", 4: "request_cancel"} {
		r := all[rows+i]
		if r.Message != want || r.Decision.Outcome != tetherv1.Outcome_OUTCOME_REJECTED || r.Generation != 2 {
			t.Fatalf("row %d: %s %v generation %d, want a refused %s of generation 2's record", i, r.Message, r.Decision.Outcome, r.Generation, want)
		}
	}

	// Naming the current generation, or none, decides as before.
	cancel, err = admin.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: job, Reason: "stop w2", LeaseGeneration: 2}))
	r22Decision(t, "the cancel request about generation 2", cancel.Msg.GetDecision(), err, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_CANCEL_REQUESTED)
	res, err = admin.Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{JobId: job, Result: tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED, Reason: "w2 stopped"}))
	r22Decision(t, "a resolution naming no generation", res.Msg.GetDecision(), err, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RESOLVED)
}

// TestRogue22AStrangersDecisionWithAGenerationLearnsNothing: an agent of
// another tree sends RequestCancel, Reassign and Resolve about a job it
// does not coordinate, naming its stale, current and a never-issued
// generation. Each is answered as about a job that does not exist — the
// same code and words as for a job id nobody used — and nothing is
// judged or recorded. (Probe: it held.)
func TestRogue22AStrangersDecisionWithAGenerationLearnsNothing(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx := context.Background()
	root := register(t, admin, "ops")
	rootC := srv.Clients(root.Credential)
	w1 := spawn(t, rootC, root.Node.NodeId, "w1")
	w2 := spawn(t, rootC, root.Node.NodeId, "w2")
	const job = "r22-stranger"
	g1, err := offerTo(rootC, w1.Node.NodeId, job)
	if err != nil {
		t.Fatal(err)
	}
	r22Ack(t, srv.Clients(w1.Credential), g1)
	if _, err := rootC.Lease.Reassign(ctx, connect.NewRequest(&tetherv1.ReassignRequest{JobId: job, HolderIdentity: w2.Node.NodeId, LeaseGeneration: 1})); err != nil {
		t.Fatal(err)
	}
	before := r22Lease(t, admin, job)
	rows := len(r22Evidence(t, admin, job))

	stranger := srv.Clients(register(t, admin, "stranger").Credential)
	for _, gen := range []uint64{0, 1, 2, 99} {
		for _, id := range []string{job, "r22-nobody-used-this"} {
			decide := map[string]func() error{
				"reassign": func() error {
					_, err := stranger.Lease.Reassign(ctx, connect.NewRequest(&tetherv1.ReassignRequest{JobId: id, HolderIdentity: w1.Node.NodeId, LeaseGeneration: gen}))
					return err
				},
				"resolve": func() error {
					_, err := stranger.Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{JobId: id, Result: tetherv1.TerminalResult_TERMINAL_RESULT_FAILED, LeaseGeneration: gen}))
					return err
				},
				"cancel": func() error {
					_, err := stranger.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: id, LeaseGeneration: gen}))
					return err
				},
			}
			for what, call := range decide {
				err := call()
				if connect.CodeOf(err) != connect.CodePermissionDenied {
					t.Fatalf("the stranger's %s of %s naming generation %d: %v, want permission_denied", what, id, gen, err)
				}
				msg := strings.ReplaceAll(err.Error(), id, "JOB")
				want := r22NoLease
				if !strings.Contains(msg, want) {
					t.Fatalf("the stranger's %s of %s naming generation %d says %q; want the no-such-job answer %q", what, id, gen, msg, want)
				}
			}
		}
	}
	after := r22Lease(t, admin, job)
	if after.LeaseGeneration != before.LeaseGeneration || after.State != before.State || after.CancelRequested || after.HolderIdentity != before.HolderIdentity {
		t.Fatalf("the strangers' decisions changed the lease: %v", after)
	}
	if got := len(r22Evidence(t, admin, job)); got != rows {
		t.Fatalf("the strangers' decisions added %d evidence rows, want none", got-rows)
	}
}

// r22NoLease is the answer, with the job id as JOB, an agent gets for
// a job it may not touch.
const r22NoLease = `job "JOB": there is no lease you may act on`

// TestRogue22RefusedDecisionsCostTheCallersBudget: a coordinating agent
// replaying a decision about a replaced generation is refused each time,
// judged and recorded; each refusal is one request of its budget, so the
// replays stop at the budget, as accepted decisions would. (Probe: it
// held.)
func TestRogue22RefusedDecisionsCostTheCallersBudget(t *testing.T) {
	const burst = 40
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) { cfg.RateLimit, cfg.RateBurst = 1, burst })
	admin := srv.AdminClients()
	ctx := context.Background()
	root := register(t, admin, "ops")
	lead := spawn(t, admin, root.Node.NodeId, "lead")
	w1 := spawn(t, admin, lead.Node.NodeId, "w1")
	w2 := spawn(t, admin, lead.Node.NodeId, "w2")
	const job = "r22-budget"
	g1, err := offerTo(admin, w1.Node.NodeId, job)
	if err != nil {
		t.Fatal(err)
	}
	r22Ack(t, srv.Clients(w1.Credential), g1)
	if _, err := admin.Lease.Reassign(ctx, connect.NewRequest(&tetherv1.ReassignRequest{JobId: job, HolderIdentity: w2.Node.NodeId, LeaseGeneration: 1})); err != nil {
		t.Fatal(err)
	}
	rows := len(r22Evidence(t, admin, job))
	leadC := srv.Clients(lead.Credential)
	refused := 0
	for ; refused <= 4*burst; refused++ {
		resp, err := leadC.Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{JobId: job, Result: tetherv1.TerminalResult_TERMINAL_RESULT_FAILED, LeaseGeneration: 1}))
		if connect.CodeOf(err) == connect.CodeResourceExhausted {
			break
		}
		r22Decision(t, "a replayed resolution of generation 1", resp.Msg.GetDecision(), err, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_STALE_GENERATION)
	}
	t.Logf("%d refused decisions before the budget ran out", refused)
	if refused > burst {
		t.Fatalf("%d refused decisions judged, want them to stop at the budget (burst %d)", refused, burst)
	}
	if got := len(r22Evidence(t, admin, job)) - rows; got != refused {
		t.Fatalf("%d evidence rows for %d refused decisions", got, refused)
	}
}

// TestRogue22AnAgentWhoseStopWasRequestedDecidesNothing: an operator
// requests the stop of a lead agent; until the termination's mark reaches
// the lead (held here at the termination's first reconcile), the lead and
// its workers were still running, so the lead could still resolve,
// cancel, reassign, claim and offer the jobs its lineage coordinates, and
// its worker could ACK a new lease — the workload of the stop deciding its
// own jobs' record (seen failing: the lead's resolve FAILED was ACCEPTED).
// Each is now refused failed_precondition before the lease machine: no
// judgement, no evidence row. An agent the stop does not cover decides as
// before.
func TestRogue22AnAgentWhoseStopWasRequestedDecidesNothing(t *testing.T) {
	clk := clock.NewManual(epoch)
	var (
		mu      sync.Mutex
		holding = true
		held    = make(chan struct{})
		release = make(chan struct{})
	)
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) {
		cfg.TerminationReconciled = func(string) {
			mu.Lock()
			hold := holding
			holding = false
			mu.Unlock()
			if hold {
				close(held)
				<-release
			}
		}
	})
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	admin := srv.AdminClients()
	ctx := context.Background()
	root := register(t, admin, "ops")
	rootC := srv.Clients(root.Credential)
	lead := spawn(t, rootC, root.Node.NodeId, "lead")
	other := spawn(t, rootC, root.Node.NodeId, "other")
	leadC := srv.Clients(lead.Credential)
	w1 := spawn(t, leadC, lead.Node.NodeId, "w1")
	w2 := spawn(t, leadC, lead.Node.NodeId, "w2")
	w1C := srv.Clients(w1.Credential)

	active, err := offerTo(leadC, w1.Node.NodeId, "r22-stop-active")
	if err != nil {
		t.Fatal(err)
	}
	r22Ack(t, w1C, active)
	offered, err := offerTo(leadC, w1.Node.NodeId, "r22-stop-offered")
	if err != nil {
		t.Fatal(err)
	}
	jobs := []string{active.JobId, offered.JobId}
	rows := map[string]int{}
	for _, j := range jobs {
		rows[j] = len(r22Evidence(t, admin, j))
	}

	stop := terminate(t, admin, lead.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Hour, 0, 0)
	<-held
	if n := getNode(t, admin, lead.Node.NodeId); n.State != tetherv1.NodeState_NODE_STATE_RUNNING {
		t.Fatalf("the lead is %v with the mark held, want still running (the window this test is about)", n.State)
	}

	refusedBeforeJudging := func(what string, err error) {
		t.Helper()
		if connect.CodeOf(err) != connect.CodeFailedPrecondition {
			t.Fatalf("%s after its stop was requested: %v, want failed_precondition", what, err)
		}
		if !strings.Contains(err.Error(), "stop") || !strings.Contains(err.Error(), stop.TerminationId) {
			t.Fatalf("%s: the refusal says %q; want it to say a stop was requested, naming the termination", what, err)
		}
	}
	_, err = leadC.Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{JobId: active.JobId, Result: tetherv1.TerminalResult_TERMINAL_RESULT_FAILED, Reason: "my own record"}))
	refusedBeforeJudging("the lead's resolution", err)
	_, err = leadC.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: active.JobId}))
	refusedBeforeJudging("the lead's cancel request", err)
	_, err = leadC.Lease.Reassign(ctx, connect.NewRequest(&tetherv1.ReassignRequest{JobId: active.JobId, HolderIdentity: w2.Node.NodeId}))
	refusedBeforeJudging("the lead's reassignment", err)
	_, err = leadC.Lease.Renew(ctx, connect.NewRequest(&tetherv1.RenewRequest{JobId: active.JobId, LeaseId: active.LeaseId, LeaseGeneration: active.LeaseGeneration, RenewSequence: 1}))
	refusedBeforeJudging("the lead's claim on its worker's lease", err)
	_, err = offerTo(leadC, w2.Node.NodeId, "r22-stop-new")
	refusedBeforeJudging("the lead's offer", err)
	_, err = w1C.Lease.Ack(ctx, connect.NewRequest(&tetherv1.AckRequest{JobId: offered.JobId, LeaseId: offered.LeaseId, LeaseGeneration: offered.LeaseGeneration}))
	refusedBeforeJudging("the worker's ACK", err)
	// Nor is new work offered to the stop's workload.
	_, err = offerTo(rootC, w2.Node.NodeId, "r22-stop-to-w2")
	refusedBeforeJudging("an offer to a worker under the stop", err)

	for _, j := range jobs {
		if got := len(r22Evidence(t, admin, j)); got != rows[j] {
			t.Fatalf("job %s: %d evidence rows after the refused decisions, want %d (nothing judged)", j, got, rows[j])
		}
	}
	if l := r22Lease(t, admin, active.JobId); l.State != tetherv1.LeaseState_LEASE_STATE_ACTIVE || l.CancelRequested || l.LeaseGeneration != 1 || l.OwnershipConflict {
		t.Fatalf("the active job after the refused decisions: %v", l)
	}
	// The holder still works its lease (it is finishing under a drain),
	// and an agent the stop does not cover still decides.
	if _, err := w1C.Lease.Renew(ctx, connect.NewRequest(&tetherv1.RenewRequest{JobId: active.JobId, LeaseId: active.LeaseId, LeaseGeneration: active.LeaseGeneration, RenewSequence: 1})); err != nil {
		t.Fatalf("the holder's renewal under the drain: %v", err)
	}
	if _, err := offerTo(rootC, other.Node.NodeId, "r22-stop-other"); err != nil {
		t.Fatalf("an offer to an agent the stop does not cover: %v", err)
	}

	mu.Lock()
	released = true
	mu.Unlock()
	close(release)
	// Released, the mark reaches the lead, and its decisions are refused
	// as a stopping node's, as before: failed_precondition while it
	// drains, or, its drain already over (nothing held it), its credential
	// dead with it (unauthenticated).
	testserver.WaitFor(t, time.Minute, "the stop's mark to reach the lead", func() bool {
		return getNode(t, admin, lead.Node.NodeId).State != tetherv1.NodeState_NODE_STATE_RUNNING
	})
	_, err = leadC.Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{JobId: active.JobId, Result: tetherv1.TerminalResult_TERMINAL_RESULT_FAILED}))
	if code := connect.CodeOf(err); code != connect.CodeFailedPrecondition && code != connect.CodeUnauthenticated {
		t.Fatalf("the lead's resolution once marked: %v, want failed_precondition (draining) or unauthenticated (terminated)", err)
	}
}
