package controlplane_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// Rogue agents against job leases: a stranger from another tree must not be
// able to jam, read or write evidence about a job of another lineage, and a
// conflict that is recorded must really halt the job.

// try sends a worker message and returns the answer or the error text
// ("code: message"), never failing the test on a refusal.
func (u unary) try(t *testing.T, m *tetherv1.ChannelRequest) (*tetherv1.Lease, *tetherv1.Decision, string) {
	t.Helper()
	ctx := context.Background()
	var (
		resp interface {
			GetLease() *tetherv1.Lease
			GetDecision() *tetherv1.Decision
		}
		err error
	)
	switch m := m.Message.(type) {
	case *tetherv1.ChannelRequest_Ack:
		var r *connect.Response[tetherv1.AckResponse]
		if r, err = u.c.Lease.Ack(ctx, connect.NewRequest(m.Ack)); err == nil {
			resp = r.Msg
		}
	case *tetherv1.ChannelRequest_Renew:
		var r *connect.Response[tetherv1.RenewResponse]
		if r, err = u.c.Lease.Renew(ctx, connect.NewRequest(m.Renew)); err == nil {
			resp = r.Msg
		}
	case *tetherv1.ChannelRequest_Progress:
		var r *connect.Response[tetherv1.ProgressResponse]
		if r, err = u.c.Lease.Progress(ctx, connect.NewRequest(m.Progress)); err == nil {
			resp = r.Msg
		}
	case *tetherv1.ChannelRequest_CancelAck:
		var r *connect.Response[tetherv1.LeaseServiceCancelAckResponse]
		if r, err = u.c.Lease.CancelAck(ctx, connect.NewRequest(m.CancelAck)); err == nil {
			resp = r.Msg
		}
	case *tetherv1.ChannelRequest_Complete:
		var r *connect.Response[tetherv1.CompleteResponse]
		if r, err = u.c.Lease.Complete(ctx, connect.NewRequest(m.Complete)); err == nil {
			resp = r.Msg
		}
	}
	if err != nil {
		var ce *connect.Error
		if ok := asConnect(err, &ce); ok {
			return nil, nil, ce.Code().String() + ": " + ce.Message()
		}
		return nil, nil, err.Error()
	}
	return resp.GetLease(), resp.GetDecision(), ""
}

func (c *channel) try(t *testing.T, m *tetherv1.ChannelRequest) (*tetherv1.Lease, *tetherv1.Decision, string) {
	t.Helper()
	c.next++
	m.CorrelationId = c.next
	if err := c.stream.Send(m); err != nil {
		t.Fatalf("channel send: %v", err)
	}
	resp, err := c.stream.Receive()
	if err != nil {
		t.Fatalf("channel receive: %v", err)
	}
	if resp.CorrelationId != m.CorrelationId {
		t.Fatalf("answer carries correlation id %d, want %d", resp.CorrelationId, m.CorrelationId)
	}
	return resp.Lease, resp.Decision, resp.Error
}

type tryTransport interface {
	try(t *testing.T, m *tetherv1.ChannelRequest) (*tetherv1.Lease, *tetherv1.Decision, string)
}

func asConnect(err error, target **connect.Error) bool {
	ce, ok := err.(*connect.Error)
	if ok {
		*target = ce
	}
	return ok
}

func cancelAck(l *tetherv1.Lease) *tetherv1.ChannelRequest {
	return &tetherv1.ChannelRequest{Message: &tetherv1.ChannelRequest_CancelAck{CancelAck: &tetherv1.LeaseServiceCancelAckRequest{JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration}}}
}

// leaseLeaks reports which of the secrets (lease ids, holders, generations the
// caller did not send) an answer's text contains.
func leaseLeaks(text string, secrets ...string) []string {
	var found []string
	for _, s := range secrets {
		if s != "" && strings.Contains(text, s) {
			found = append(found, s)
		}
	}
	return found
}

// A stranger agent from another tree sends every worker message for a job
// of the planner's tree — with the job's real lease id and generation, as
// if it had guessed them — unary and over the Channel. Each is
// PermissionDenied before the lease machine: no conflict, no evidence row,
// no lease detail in the answer, the same answer as for a job that does not
// exist; and the job then completes normally.
func TestLeaseStrangerCannotJamAnotherTreesJob(t *testing.T) {
	transports2(t, func(t *testing.T, w *leaseWorld, via func(*testserver.Clients) tryTransport) {
		job := w.job()
		offered, err := w.plannerC.Lease.Offer(context.Background(), connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: w.w1, LeaseDuration: durationpb.New(time.Minute)}))
		if err != nil {
			t.Fatal(err)
		}
		l, d, errText := via(w.w1C).try(t, ack(offered.Msg.Lease))
		if errText != "" {
			t.Fatal(errText)
		}
		wantDecision(t, "ack", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_ACKED)
		if _, err := w.plannerC.Lease.RequestCancel(context.Background(), connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: job, Reason: "so cancel acks are judged"})); err != nil {
			t.Fatal(err)
		}
		before := w.get(t, job)
		rowsBefore := len(w.evidence(t, job))

		stranger := via(w.strangerC)
		ghost := proto.Clone(l).(*tetherv1.Lease)
		ghost.JobId = "job-that-does-not-exist"
		for _, tc := range []struct {
			name string
			msg  func(*tetherv1.Lease) *tetherv1.ChannelRequest
		}{
			{"ack", ack},
			{"renew", func(l *tetherv1.Lease) *tetherv1.ChannelRequest { return renew(l, 7) }},
			{"progress", func(l *tetherv1.Lease) *tetherv1.ChannelRequest { return progress(l, 3, "99%") }},
			{"cancel ack", cancelAck},
			{"complete", func(l *tetherv1.Lease) *tetherv1.ChannelRequest {
				return complete(l, tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED)
			}},
		} {
			got, d, errText := stranger.try(t, tc.msg(l))
			if !strings.HasPrefix(errText, "permission_denied: ") || got != nil || d != nil {
				t.Fatalf("stranger %s: %q %v %v, want permission_denied and nothing else", tc.name, errText, got, d)
			}
			// It learns nothing it did not send: not the holder, the owner,
			// another lease id, a generation or a state.
			if found := leaseLeaks(errText, w.w1, w.planner, "generation", "ACTIVE", "OFFERED"); len(found) > 0 {
				t.Fatalf("stranger %s: the refusal %q names %v", tc.name, errText, found)
			}
			_, _, ghostText := stranger.try(t, tc.msg(ghost))
			if strings.ReplaceAll(ghostText, ghost.JobId, job) != errText {
				t.Fatalf("stranger %s: the refusal tells an existing job from a missing one:\n existing %q\n missing  %q", tc.name, errText, ghostText)
			}
		}
		after := w.get(t, job)
		if !proto.Equal(before, after) || after.OwnershipConflict {
			t.Fatalf("the stranger changed the lease:\nbefore %v\nafter  %v", before, after)
		}
		if rows := len(w.evidence(t, job)); rows != rowsBefore {
			t.Fatalf("the stranger wrote %d evidence rows", rows-rowsBefore)
		}

		// The job goes on: the holder acknowledges the cancel and completes.
		holder := via(w.w1C)
		if _, d, errText = holder.try(t, cancelAck(l)); errText != "" {
			t.Fatal(errText)
		}
		wantDecision(t, "cancel ack", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_CANCEL_ACKED)
		final, d, errText := holder.try(t, complete(l, tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED))
		if errText != "" {
			t.Fatal(errText)
		}
		wantDecision(t, "complete", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_TERMINAL_ACCEPTED)
		if final.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED || final.OwnershipConflict {
			t.Fatalf("after the holder completed: %v", final)
		}
	})
}

// transports2 is transports for tryTransport.
func transports2(t *testing.T, probe func(t *testing.T, w *leaseWorld, via func(c *testserver.Clients) tryTransport)) {
	t.Run("unary", func(t *testing.T) {
		probe(t, newLeaseWorld(t), func(c *testserver.Clients) tryTransport { return unary{c} })
	})
	t.Run("channel", func(t *testing.T) {
		probe(t, newLeaseWorld(t), func(c *testserver.Clients) tryTransport { return openChannel(t, c) })
	})
}

// The stranger's coordinator calls and reads: offering the job id to its
// own child, reading the lease or its evidence, cancelling, reassigning,
// resolving. All are PermissionDenied, with the same answer as for a job
// that does not exist (Offer says only that the id is taken), and nothing
// is judged or recorded.
func TestLeaseStrangerCannotReadOrDirectAnotherTreesJob(t *testing.T) {
	w := newLeaseWorld(t)
	ctx := context.Background()
	child := spawn(t, w.strangerC, w.stranger, "s1")
	job := w.job()
	resp, err := w.plannerC.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: w.w1, LeaseDuration: durationpb.New(time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	l := resp.Msg.Lease
	before := w.get(t, job)
	rowsBefore := len(w.evidence(t, job))
	secrets := []string{l.LeaseId, w.w1, w.planner}

	_, err = w.strangerC.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: child.Node.NodeId}))
	if connect.CodeOf(err) != connect.CodePermissionDenied || len(leaseLeaks(err.Error(), secrets...)) > 0 {
		t.Fatalf("the stranger offering the job id to its child: %v", err)
	}
	missing := "job-nobody-has"
	for _, tc := range []struct {
		name string
		call func(job string) error
	}{
		{"get", func(job string) error {
			_, err := w.strangerC.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: job}))
			return err
		}},
		{"evidence", func(job string) error {
			_, err := w.strangerC.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: job}))
			return err
		}},
		{"request cancel", func(job string) error {
			_, err := w.strangerC.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: job}))
			return err
		}},
		{"reassign", func(job string) error {
			_, err := w.strangerC.Lease.Reassign(ctx, connect.NewRequest(&tetherv1.ReassignRequest{JobId: job, HolderIdentity: child.Node.NodeId}))
			return err
		}},
		{"resolve", func(job string) error {
			_, err := w.strangerC.Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{JobId: job, Result: tetherv1.TerminalResult_TERMINAL_RESULT_FAILED}))
			return err
		}},
	} {
		err := tc.call(job)
		if connect.CodeOf(err) != connect.CodePermissionDenied {
			t.Fatalf("stranger %s: %v, want permission_denied", tc.name, err)
		}
		if found := leaseLeaks(err.Error(), secrets...); len(found) > 0 {
			t.Fatalf("stranger %s: %q names %v", tc.name, err, found)
		}
		other := tc.call(missing)
		if connect.CodeOf(other) != connect.CodePermissionDenied || strings.ReplaceAll(other.Error(), missing, job) != err.Error() {
			t.Fatalf("stranger %s: a missing job answers %v, an existing one %v", tc.name, other, err)
		}
	}
	list, err := w.strangerC.Lease.ListLeases(ctx, connect.NewRequest(&tetherv1.ListLeasesRequest{}))
	if err != nil || len(list.Msg.Leases) != 0 {
		t.Fatalf("the stranger's own list: %v %v", list, err)
	}
	if after := w.get(t, job); !proto.Equal(before, after) {
		t.Fatalf("the stranger changed the lease:\nbefore %v\nafter  %v", before, after)
	}
	if rows := len(w.evidence(t, job)); rows != rowsBefore {
		t.Fatalf("the stranger wrote %d evidence rows", rows-rowsBefore)
	}
	// Its own namespace works: a fresh job id offered to its own child.
	if _, err := w.strangerC.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "stranger-job", HolderIdentity: child.Node.NodeId})); err != nil {
		t.Fatalf("the stranger offering its own job: %v", err)
	}
	// The owner reads and directs its job as before.
	if _, err := w.plannerC.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: job})); err != nil {
		t.Fatalf("the owner reading the evidence: %v", err)
	}
}

// A former holder is not a stranger to its own generation: after the job
// moved to generation 2, its late renew is judged and recorded as stale
// (seed probe 1), and the current generation is untouched. It is a
// stranger to generation 2: its claims on it are refused, so it cannot
// halt its successor by recording a conflict.
func TestLeaseFormerHolderLateRenewIsRecordedStale(t *testing.T) {
	w := newLeaseWorld(t)
	job := w.job()
	l1, _ := unary{w.w1C}.send(t, ack(w.offer(t, job, w.w1, time.Minute)))
	l2 := w.reassign(t, job, w.w2, time.Minute)
	unary{w.w2C}.send(t, ack(l2))
	rows := len(w.evidence(t, job))
	_, d := unary{w.w1C}.send(t, renew(l1, 1))
	wantDecision(t, "late renew from generation 1", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_STALE_GENERATION)
	if got := len(w.evidence(t, job)); got != rows+1 {
		t.Fatalf("%d rows, want %d: the stale renew is evidence", got, rows+1)
	}
	if got := w.get(t, job); got.HolderIdentity != w.w2 || got.LeaseGeneration != 2 || !got.StaleGeneration || got.OwnershipConflict {
		t.Fatalf("after the late renew: %v", got)
	}
	// The rogue former holder learns generation 2's lease id (a stale
	// answer no longer shows it) and claims
	// it, hoping to record a conflict and halt w2's work: it does not hold
	// generation 2, so it is a stranger to it, refused before the machine.
	before := w.get(t, job)
	rows = len(w.evidence(t, job))
	for _, m := range []*tetherv1.ChannelRequest{renew(l2, 1), progress(l2, 1, "mine"), complete(l2, tetherv1.TerminalResult_TERMINAL_RESULT_FAILED)} {
		for _, via := range []tryTransport{unary{w.w1C}, openChannel(t, w.w1C)} {
			if _, _, errText := via.try(t, m); !strings.HasPrefix(errText, "permission_denied: ") {
				t.Fatalf("the former holder claiming generation 2: %q, want permission_denied", errText)
			}
		}
	}
	if after := w.get(t, job); !proto.Equal(before, after) || after.OwnershipConflict {
		t.Fatalf("the former holder changed generation 2:\nbefore %v\nafter  %v", before, after)
	}
	if got := len(w.evidence(t, job)); got != rows {
		t.Fatalf("the former holder's claims wrote %d rows", got-rows)
	}
	_, d = unary{w.w2C}.send(t, renew(l2, 1))
	wantDecision(t, "the holder's renew", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RENEWED)
}

// A conflict that is recorded halts the job: the coordinating lineage (the
// planner) claims the active generation; from then on the holder's renews
// are refused and extend nothing, a heartbeat changes nothing, completion
// is refused, and the conflict outlives the holder's healthy traffic until
// the planner resolves it — here by reassigning, after which the job goes
// on as generation 2.
func TestLeaseRecordedConflictHaltsUntilResolved(t *testing.T) {
	transports2(t, func(t *testing.T, w *leaseWorld, via func(*testserver.Clients) tryTransport) {
		ctx := context.Background()
		job := w.job()
		holder := via(w.w1C)
		l, _, errText := holder.try(t, ack(w.offer(t, job, w.w1, time.Minute)))
		if errText != "" {
			t.Fatal(errText)
		}
		_, d, errText := via(w.plannerC).try(t, renew(l, 1))
		if errText != "" {
			t.Fatal(errText)
		}
		wantDecision(t, "the planner's claim", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_OWNERSHIP_CONFLICT)
		expiry := w.get(t, job).ExpiresAt.AsTime()

		heartbeat(t, w, w.w1C, w.w1)
		for seq := uint64(1); seq <= 3; seq++ {
			w.clock.Advance(10 * time.Second)
			got, d, errText := holder.try(t, renew(l, seq))
			if errText != "" {
				t.Fatal(errText)
			}
			wantDecision(t, "the holder's renew under the conflict", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_OWNERSHIP_CONFLICT)
			if !got.ExpiresAt.AsTime().Equal(expiry) || !got.OwnershipConflict || got.RenewSequence != 0 {
				t.Fatalf("renew %d under the conflict: %v", seq, got)
			}
		}
		_, d, _ = holder.try(t, complete(l, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS))
		wantDecision(t, "complete under the conflict", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_OWNERSHIP_CONFLICT)

		// A sibling cannot resolve it; the planner can.
		if _, err := w.w2C.Lease.Reassign(ctx, connect.NewRequest(&tetherv1.ReassignRequest{JobId: job, HolderIdentity: w.w1})); connect.CodeOf(err) != connect.CodePermissionDenied {
			t.Fatalf("a sibling resolving: %v", err)
		}
		re, err := w.plannerC.Lease.Reassign(ctx, connect.NewRequest(&tetherv1.ReassignRequest{JobId: job, HolderIdentity: w.w1, Reason: "the planner's claim was a mistake"}))
		if err != nil {
			t.Fatal(err)
		}
		wantDecision(t, "resolving reassignment", re.Msg.Decision, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_REASSIGNED)
		l2, _, errText := holder.try(t, ack(re.Msg.Lease))
		if errText != "" {
			t.Fatal(errText)
		}
		_, d, _ = holder.try(t, renew(l2, 1))
		wantDecision(t, "renew of generation 2", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RENEWED)
		_, d, _ = holder.try(t, complete(l2, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS))
		wantDecision(t, "complete of generation 2", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_TERMINAL_ACCEPTED)
	})
}

// heartbeat opens node's session and sends one heartbeat, waiting for its
// acknowledgement.
func heartbeat(t *testing.T, w *leaseWorld, c *testserver.Clients, node string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	session := c.Agent.Session(ctx)
	defer func() { _ = session.CloseRequest(); _ = session.CloseResponse() }()
	if err := session.Send(&tetherv1.SessionRequest{Kind: &tetherv1.SessionRequest_Hello{Hello: &tetherv1.SessionHello{NodeId: node}}}); err != nil {
		t.Fatal(err)
	}
	if err := session.Send(&tetherv1.SessionRequest{Kind: &tetherv1.SessionRequest_Heartbeat{Heartbeat: &tetherv1.SessionHeartbeat{SentAt: timestamppb.New(w.clock.Now())}}}); err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := session.Receive()
		if err != nil {
			t.Fatalf("session: %v", err)
		}
		if resp.GetHeartbeatAck() != nil {
			return
		}
	}
}

// A node that is draining is offered nothing new and cannot acknowledge an
// offer it got before: FailedPrecondition naming the state, and nothing is
// judged.
func TestLeaseNoNewLeaseForADrainingNode(t *testing.T) {
	w := newLeaseWorld(t)
	ctx := context.Background()
	job := w.job()
	offered := w.offer(t, job, w.w1, time.Minute)
	rows := len(w.evidence(t, job))
	term := terminate(t, w.admin, w.w1, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Hour, time.Minute, time.Hour)
	testserver.WaitFor(t, 20*time.Second, "w1 to drain", func() bool {
		n, err := w.admin.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: w.w1}))
		return err == nil && n.Msg.Node.State == tetherv1.NodeState_NODE_STATE_DRAINING
	})
	_, err := w.plannerC.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: w.job(), HolderIdentity: w.w1}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "draining") {
		t.Fatalf("offer to a draining node: %v", err)
	}
	_, err = w.admin.Lease.Reassign(ctx, connect.NewRequest(&tetherv1.ReassignRequest{JobId: job, HolderIdentity: w.w1}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "draining") {
		t.Fatalf("reassignment to a draining node: %v", err)
	}
	_, err = w.w1C.Lease.Ack(ctx, connect.NewRequest(ack(offered).GetAck()))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "draining") {
		t.Fatalf("ack by a draining node: %v", err)
	}
	_, _, errText := openChannel(t, w.w1C).try(t, ack(offered))
	if !strings.HasPrefix(errText, "failed_precondition: ") || !strings.Contains(errText, "draining") {
		t.Fatalf("ack by a draining node over the channel: %q", errText)
	}
	if got := w.get(t, job); got.State == tetherv1.LeaseState_LEASE_STATE_ACTIVE || got.AckState == tetherv1.AckState_ACK_STATE_ACKED {
		t.Fatalf("a draining node's ACK was accepted: %v", got)
	}
	_ = term
	// The termination cancels the job's lease (its own evidence); the
	// refused ACKs wrote none.
	for _, r := range w.evidence(t, job)[rows:] {
		if r.Message == "ack" {
			t.Fatalf("a refused ACK was judged: %v", r)
		}
	}
}

// Evidence is paginated: every row exactly once across pages, in order, a
// page never above the server's maximum however large the page_size asked,
// and a page token that is not one is refused.
func TestLeaseEvidencePages(t *testing.T) {
	w := newLeaseWorld(t)
	ctx := context.Background()
	job := w.job()
	l, _ := unary{w.w1C}.send(t, ack(w.offer(t, job, w.w1, time.Minute)))
	// 2,200 more decisions in a few batched Channel requests: duplicates of
	// an accepted renew, each judged and recorded.
	unary{w.w1C}.send(t, renew(l, 1))
	c := openChannel(t, w.w1C)
	const extra = 2200
	for sent := 0; sent < extra; {
		n := min(500, extra-sent)
		req := renew(l, 1)
		req.CorrelationId = uint64(sent + 1)
		for i := 1; i < n; i++ {
			m := renew(l, 1)
			m.CorrelationId = uint64(sent + i + 1)
			req.Batch = append(req.Batch, m)
		}
		if err := c.stream.Send(req); err != nil {
			t.Fatal(err)
		}
		for answered := 0; answered < n; {
			resp, err := c.stream.Receive()
			if err != nil {
				t.Fatal(err)
			}
			answered += 1 + len(resp.Batch)
		}
		sent += n
	}
	total := 3 + extra // offer, ack, renew, duplicates
	first, err := w.admin.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: job}))
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Msg.Rows) != 1000 || first.Msg.NextPageToken == "" {
		t.Fatalf("a page without page_size: %d rows, next %q; want the maximum, 1000, and a token", len(first.Msg.Rows), first.Msg.NextPageToken)
	}
	capped, err := w.admin.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: job, PageSize: 1 << 30}))
	if err != nil || len(capped.Msg.Rows) != 1000 {
		t.Fatalf("page_size 2^30: %d rows, %v; want 1000", len(capped.Msg.Rows), err)
	}
	for _, size := range []int32{63, 64, 300, 1000} {
		t.Run(fmt.Sprint("page size ", size), func(t *testing.T) {
			seen, token, pages := 0, "", 0
			for {
				resp, err := w.admin.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: job, PageSize: size, PageToken: token}))
				if err != nil {
					t.Fatal(err)
				}
				pages++
				if len(resp.Msg.Rows) > int(size) {
					t.Fatalf("page %d has %d rows, above page_size %d", pages, len(resp.Msg.Rows), size)
				}
				for _, r := range resp.Msg.Rows {
					seen++
					if r.Row != uint64(seen) {
						t.Fatalf("page %d: row %d where row %d was due", pages, r.Row, seen)
					}
				}
				if token = resp.Msg.NextPageToken; token == "" {
					break
				}
			}
			if seen != total {
				t.Fatalf("%d rows across %d pages, want %d", seen, pages, total)
			}
		})
	}
	// A page far into the history decodes against the right lease: row
	// 2000's lease is the one the renews left.
	mid, err := w.admin.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: job, PageSize: 5, PageToken: "r1999"}))
	if err != nil || len(mid.Msg.Rows) != 5 || mid.Msg.Rows[0].Row != 2000 || mid.Msg.Rows[0].LeaseId != l.LeaseId || mid.Msg.Rows[0].RenewSequence != 1 {
		t.Fatalf("a page from row 2000: %v %v", mid, err)
	}
	for _, bad := range []string{"x", "r", "r-1", "rabc", "r0"} {
		_, err := w.admin.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: job, PageToken: bad}))
		if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "page_token") {
			t.Fatalf("page token %q: %v", bad, err)
		}
	}
	if _, err := w.admin.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: job, PageSize: -1})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("negative page_size: %v", err)
	}
}

// A rollout batch whose agent holds a lease with an unresolved ownership
// conflict: the batch's record reports that lease UNRESOLVED, never
// HANDED_OVER (a clean lease of the same batch is); the lease is not
// reassigned; the batch is not done — the rollout pauses at the batch
// deadline naming the conflict — until the conflict is resolved, and the
// completed rollout still says the lease was not handed over.
func TestRolloutDoesNotHandOverAConflictedLease(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx := context.Background()
	p := registerLabelled(t, admin, "p", map[string]string{"version": "v1"})
	pc := srv.Clients(p.Credential)
	c1, c2 := spawn(t, pc, p.Node.NodeId, "c1"), spawn(t, pc, p.Node.NodeId, "c2")
	offer := func(job, holder string) *tetherv1.Lease {
		resp, err := pc.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: holder, LeaseDuration: durationpb.New(10 * time.Minute)}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg.Lease
	}
	x, _ := unary{srv.Clients(c1.Credential)}.send(t, ack(offer("job-x", c1.Node.NodeId)))
	unary{srv.Clients(c2.Credential)}.send(t, ack(offer("job-y", c2.Node.NodeId)))
	_, d := unary{pc}.send(t, renew(x, 1))
	wantDecision(t, "the owner's claim on job-x", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_OWNERSHIP_CONFLICT)

	r := startRollout(t, admin, &tetherv1.RolloutRequest{Selector: "version=v1", TargetSelector: "version=v2", Batch: 1,
		DrainWindow: durationpb.New(time.Second), ConfirmTimeout: durationpb.New(time.Second), BatchDeadline: durationpb.New(time.Hour)})
	r = waitRollout(t, srv, r.RolloutId, "to start a batch", func(r *tetherv1.Rollout) bool { return len(r.Batches) == 1 })
	term := r.Batches[0].TerminationId
	testserver.WaitFor(t, 20*time.Second, "the batch's termination to finish", func() bool {
		clk.Advance(2 * time.Second)
		return getTermination(t, admin, term).State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	outcomes := map[string]tetherv1.LeaseOutcome{}
	for _, l := range record(t, admin, term).Leases {
		outcomes[l.JobId] = l.Outcome
	}
	if outcomes["job-x"] != tetherv1.LeaseOutcome_LEASE_OUTCOME_UNRESOLVED || outcomes["job-y"] != tetherv1.LeaseOutcome_LEASE_OUTCOME_HANDED_OVER {
		t.Fatalf("record leases %v: want job-x UNRESOLVED (conflicted) and job-y HANDED_OVER", outcomes)
	}

	v2 := registerLabelled(t, admin, "v2", map[string]string{"version": "v2"})
	reportReady(t, admin, v2.Node.NodeId)
	r = waitRollout(t, srv, r.RolloutId, "to hand over batch 0", func(r *tetherv1.Rollout) bool { return r.Batches[0].LeasesHandedOver == 1 })
	if len(r.Batches[0].LeasesNotHandedOver) != 1 || !strings.Contains(r.Batches[0].LeasesNotHandedOver[0], "job-x") {
		t.Fatalf("leases not handed over %v, want job-x", r.Batches[0].LeasesNotHandedOver)
	}
	if got := operatorLease(t, admin, "job-x"); got.LeaseGeneration != 1 || !got.OwnershipConflict {
		t.Fatalf("the conflicted lease moved: %v", got)
	}
	if got := operatorLease(t, admin, "job-y"); got.LeaseGeneration != 2 || got.HolderIdentity != v2.Node.NodeId {
		t.Fatalf("the clean lease was not handed over: %v", got)
	}
	if r = getRollout(t, admin, r.RolloutId); r.Batches[0].State == tetherv1.RolloutBatchState_ROLLOUT_BATCH_STATE_DONE || r.State == tetherv1.RolloutState_ROLLOUT_STATE_COMPLETED {
		t.Fatalf("batch %s, rollout %s with a conflicted lease unresolved", r.Batches[0].State, r.State)
	}
	clk.Advance(time.Hour)
	r = waitRollout(t, srv, r.RolloutId, "to pause at the deadline", func(r *tetherv1.Rollout) bool { return r.State == tetherv1.RolloutState_ROLLOUT_STATE_PAUSED })
	if !strings.Contains(r.Reason, "ownership conflict") {
		t.Fatalf("pause reason %q does not name the conflict", r.Reason)
	}

	if _, err := admin.Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{JobId: "job-x", Result: tetherv1.TerminalResult_TERMINAL_RESULT_FAILED, Reason: "two claimants; rerun"})); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Supervisor.ResumeRollout(ctx, connect.NewRequest(&tetherv1.ResumeRolloutRequest{RolloutId: r.RolloutId})); err != nil {
		t.Fatal(err)
	}
	r = waitRollout(t, srv, r.RolloutId, "to complete", func(r *tetherv1.Rollout) bool { return r.State == tetherv1.RolloutState_ROLLOUT_STATE_COMPLETED })
	if !strings.Contains(r.Reason, "not handed over") || !strings.Contains(r.Reason, "job-x") || r.Counts.LeasesHandedOver != 1 {
		t.Fatalf("completed rollout: reason %q, %d handed over", r.Reason, r.Counts.LeasesHandedOver)
	}
}

// operatorLease reads a lease as the operator.
func operatorLease(t *testing.T, admin *testserver.Clients, job string) *tetherv1.Lease {
	t.Helper()
	resp, err := admin.Lease.GetLease(context.Background(), connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: job}))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg.Lease
}

// kill -9 after an ownership conflict was recorded: after the restart the
// conflict still halts the holder's renews, the job's owner and holders are
// still known (a stranger is still refused without a row, the owner still
// resolves), and only the owner's resolution lets the job go on.
func TestLeaseConflictSurvivesKill9(t *testing.T) {
	if testing.Short() {
		// By design: -short (make test-short) leaves out the slow subprocess and
		// browser tests; make test and CI run them.
		t.Skip("By design: -short skips the tests that run the real binary; make test and CI run them.")
	}
	dir := t.TempDir()
	proc := testserver.StartProcess(t, dir)
	admin := proc.Clients(proc.Admin)
	ctx := context.Background()
	root, err := admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "planner"}))
	if err != nil {
		t.Fatal(err)
	}
	planner := proc.Clients(root.Msg.Credential)
	child, err := planner.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: root.Msg.Node.NodeId, Name: "w"}))
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "stranger"}))
	if err != nil {
		t.Fatal(err)
	}
	offered, err := planner.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "job", HolderIdentity: child.Msg.Node.NodeId, LeaseDuration: durationpb.New(10 * time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	worker := proc.Clients(child.Msg.Credential)
	l, _ := unary{worker}.send(t, ack(offered.Msg.Lease))
	_, d := unary{planner}.send(t, renew(l, 1))
	wantDecision(t, "the planner's claim", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_OWNERSHIP_CONFLICT)
	proc.Kill()

	proc = testserver.StartProcess(t, dir)
	admin = proc.Clients(proc.Admin)
	worker, planner = proc.Clients(child.Msg.Credential), proc.Clients(root.Msg.Credential)
	before, err := admin.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: "job"}))
	if err != nil {
		t.Fatal(err)
	}
	if !before.Msg.Lease.OwnershipConflict {
		t.Fatalf("the conflict did not survive kill -9: %v", before.Msg.Lease)
	}
	rows, err := admin.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: "job"}))
	if err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); seq <= 2; seq++ {
		got, d := unary{worker}.send(t, renew(l, seq))
		wantDecision(t, "the holder's renew after the restart", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_OWNERSHIP_CONFLICT)
		if !got.ExpiresAt.AsTime().Equal(before.Msg.Lease.ExpiresAt.AsTime()) {
			t.Fatalf("a renew under the conflict extended authority after the restart: %v", got)
		}
	}
	_, _, errText := unary{proc.Clients(stranger.Msg.Credential)}.try(t, renew(l, 9))
	if !strings.HasPrefix(errText, "permission_denied: ") {
		t.Fatalf("a stranger's renew after the restart: %q", errText)
	}
	after, err := admin.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: "job"}))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(after.Msg.Rows), len(rows.Msg.Rows)+2; got != want {
		t.Fatalf("%d evidence rows after two renews and a stranger's, want %d (the stranger writes none)", got, want)
	}
	re, err := planner.Lease.Reassign(ctx, connect.NewRequest(&tetherv1.ReassignRequest{JobId: "job", HolderIdentity: child.Msg.Node.NodeId, Reason: "settled"}))
	if err != nil {
		t.Fatalf("the owner resolving after the restart: %v", err)
	}
	wantDecision(t, "the owner's resolution", re.Msg.Decision, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_REASSIGNED)
	l2, _ := unary{worker}.send(t, ack(re.Msg.Lease))
	_, d = unary{worker}.send(t, renew(l2, 1))
	wantDecision(t, "renew of the new generation", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RENEWED)
}

// The evidence of many jobs shares a key in the store (a commit's rows go
// under one key of the evidence log, folded into a key per job later).
// A rogue holder whose job id mimics the victim's keys, and whose progress
// values carry bytes laid out like a packed row naming the victim's job,
// neither reads nor forges the victim's evidence through the packing: the
// victim's history is its own rows only, numbered without a gap, before and
// after the rows were folded; the rogue's values come back verbatim in its
// own history; the rogue cannot read the victim's.
func TestLeaseRogueCannotReadOrForgeEvidenceThroughPackedRows(t *testing.T) {
	w := newLeaseWorld(t)
	ctx := context.Background()
	victim := w.job()
	vl, _ := unary{w.w1C}.send(t, ack(w.offer(t, victim, w.w1, time.Minute)))

	rogueChild := spawn(t, w.strangerC, w.stranger, "rogue")
	rogueC := w.srv.Clients(rogueChild.Credential)
	rogueJob := victim + "/0000000000000002"
	offered, err := w.strangerC.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: rogueJob, HolderIdentity: rogueChild.Node.NodeId, LeaseDuration: durationpb.New(time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	rl, _ := unary{rogueC}.send(t, ack(offered.Msg.Lease))

	// A row "entry" as the log lays it out: a length, the victim's job id,
	// a length, a row of schema 3 numbered like the victim's next rows.
	forged := func(i int) string {
		row := fmt.Sprintf("\x03%c\x05L-fake\x01%c%s", rune(3+i%60), rune(len(rogueChild.Node.NodeId)), rogueChild.Node.NodeId)
		return fmt.Sprintf("%c%s%c%s", rune(len(victim)), victim, rune(len(row)), row)
	}
	const rounds = 40 // each call its own commit: more than the log keeps
	var values []string
	for i := range rounds {
		_, d := unary{w.w1C}.send(t, renew(vl, uint64(i+1)))
		wantDecision(t, "the victim's renew", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RENEWED)
		values = append(values, forged(i))
		_, d = unary{rogueC}.send(t, progress(rl, uint64(i+1), values[i]))
		wantDecision(t, "the rogue's progress", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_PROGRESS_RECORDED)
	}

	pages := func(c *testserver.Clients, job string) []*tetherv1.EvidenceRow {
		t.Helper()
		var rows []*tetherv1.EvidenceRow
		token := ""
		for {
			resp, err := c.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: job, PageSize: 3, PageToken: token}))
			if err != nil {
				t.Fatalf("evidence of %s: %v", job, err)
			}
			rows = append(rows, resp.Msg.Rows...)
			if token = resp.Msg.NextPageToken; token == "" {
				return rows
			}
		}
	}
	rows := pages(w.plannerC, victim)
	if len(rows) != 2+rounds {
		t.Fatalf("the victim's evidence has %d rows, want %d", len(rows), 2+rounds)
	}
	for i, r := range rows {
		if r.Row != uint64(i+1) || r.JobId != victim || r.LeaseId != vl.LeaseId || r.HolderIdentity != w.w1 || r.ProgressValue != "" {
			t.Fatalf("the victim's row %d: %v", i+1, r)
		}
	}
	if last := rows[len(rows)-1]; last.RenewSequence != rounds || w.get(t, victim).RenewSequence != rounds {
		t.Fatalf("the victim's last row %v, lease %v", last, w.get(t, victim))
	}
	own := pages(w.strangerC, rogueJob)
	if len(own) != 2+rounds {
		t.Fatalf("the rogue's evidence has %d rows, want %d", len(own), 2+rounds)
	}
	for i, r := range own[2:] {
		if r.JobId != rogueJob || r.ProgressValue != values[i] {
			t.Fatalf("the rogue's row %d: %v", i+3, r)
		}
	}
	_, err = rogueC.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: victim}))
	if connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("the rogue reading the victim's evidence: %v", err)
	}
	for _, page := range []string{"r0", "r2", "r30"} {
		_, err = w.strangerC.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: victim, PageToken: page}))
		if connect.CodeOf(err) != connect.CodePermissionDenied {
			t.Fatalf("the rogue's tree reading the victim's evidence from %s: %v", page, err)
		}
	}
}
