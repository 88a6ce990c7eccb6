package controlplane_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// Acceptance probes of the two seeds, twenty-first pass: what the agent
// being stopped can do in the moments a termination is under way but has
// not reached it yet.

// markHoldingStore is the server's real Badger store, which can hold the
// termination's mark after its first chunk (the roots'): every later
// Update the mark makes waits until the test releases it. Everything else
// is Badger's, unchanged. A subtree larger than a chunk is marked over
// several transactions, with other trees' work served between them, so
// the moment the test holds open is one every multi-chunk termination
// has; the hold only makes it last long enough to act in.
type markHoldingStore struct {
	store.Store
	mu       sync.Mutex
	marks    int
	held     chan struct{} // closed when a later chunk of the mark waits
	release  chan struct{} // closed by the test
	heldOnce sync.Once
}

func newMarkHoldingStore(b store.Store) *markHoldingStore {
	return &markHoldingStore{Store: b, held: make(chan struct{}), release: make(chan struct{})}
}

func (s *markHoldingStore) Update(ctx context.Context, fn func(tx store.Txn) error) error {
	if strings.Contains(openerStack(), "supervisor.(*Supervisor).mark") {
		s.mu.Lock()
		s.marks++
		later := s.marks > 1
		s.mu.Unlock()
		if later {
			s.heldOnce.Do(func() { close(s.held) })
			select {
			case <-s.release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return s.Store.Update(ctx, fn)
}

// TestSeed21NothingBelowADrainingAncestorBeginsACallBeforeItsMark: draining
// refuses new tool calls, for the whole subtree being drained. A
// termination marks its subtree top down, the roots in one transaction and
// their descendants in later ones; between them the root is draining and
// its child is still running as stored. The rogue child uses that moment:
// it calls a tool through the gate (its parent's delegated grant) and the
// gate ends the call before the mark reaches the child, so that, admitted,
// the call would be neither refused nor in flight when the mark lists the
// child's calls — a new call made after the drain began, missing from the
// record. A spawn there is refused already (an ancestor is stopping). The
// call must be refused as the draining node's own would be, and listed
// rejected_draining in the record; and so must what a node being stopped
// may not do either: take a fresh token for offline tools, be armed with a
// fresh grant or privilege or arm its own child with a grant, propose its
// own stop on its own windows, accept a new job, or write the
// end of a job it coordinates (its child's) before the termination
// reconciles it.
func TestSeed21NothingBelowADrainingAncestorBeginsACallBeforeItsMark(t *testing.T) {
	b, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	st := newMarkHoldingStore(b)
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), testserver.AllowPrivilegeHooks("127.0.0.1"), func(cfg *controlplane.Config) { cfg.Store = st })
	ctx := context.Background()
	admin := srv.AdminClients()
	p := register(t, admin, "parent")
	pAgent := srv.Clients(p.Credential)
	c := spawn(t, pAgent, p.Node.NodeId, "child")
	cAgent := srv.Clients(c.Credential)
	gP := issueRoot(t, admin, p.Node.NodeId, time.Hour, "tool:*")
	gC := delegate(t, pAgent, gP, c.Node.NodeId, "tool:shell")
	gate := srv.Clients(srv.ToolServerToken(t, "gate-1"))
	offered := offerJobTo(t, pAgent, "job-21", c.Node.NodeId)
	// C coordinates a job of its own child's.
	gc := spawn(t, cAgent, c.Node.NodeId, "grandchild")
	gcJob, _ := unary{srv.Clients(gc.Credential)}.send(t, ack(offerJobTo(t, cAgent, "job-21-gc", gc.Node.NodeId)))
	released := false
	releaseMark := func() {
		if !released {
			released = true
			close(st.release)
		}
	}
	t.Cleanup(releaseMark)

	term := terminate(t, admin, p.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Hour, time.Minute, time.Minute)
	select {
	case <-st.held:
	case <-time.After(time.Minute):
		t.Fatal("the mark never went past its roots' chunk")
	}
	state := func(id string) tetherv1.NodeState {
		n, err := admin.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: id}))
		if err != nil {
			t.Fatal(err)
		}
		return n.Msg.Node.State
	}
	if ps, cs := state(p.Node.NodeId), state(c.Node.NodeId); ps != tetherv1.NodeState_NODE_STATE_DRAINING || cs != tetherv1.NodeState_NODE_STATE_RUNNING {
		t.Fatalf("between the mark's chunks the parent is %s and the child %s, want draining and running", ps, cs)
	}

	_, err = cAgent.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: c.Node.NodeId, Name: "escape"}))
	wantRefused(t, "the child's spawn before its mark", err, connect.CodeFailedPrecondition, "draining")

	begun, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: gC.token, Tool: "shell", GateId: "gate-1"}))
	wantRefused(t, "the child's new call before its mark", err, connect.CodeFailedPrecondition, "draining", p.Node.NodeId)
	_, err = cAgent.Capability.Refresh(ctx, connect.NewRequest(&tetherv1.RefreshRequest{GrantId: gC.grant.GrantId}))
	wantRefused(t, "the child's token refresh before its mark", err, connect.CodeFailedPrecondition, "draining")
	_, err = admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: c.Node.NodeId, Scopes: []string{"tool:*"}, Ttl: durationpb.New(time.Hour)}))
	wantRefused(t, "an operator's fresh grant to the child before its mark", err, connect.CodeFailedPrecondition, "draining")
	_, err = cAgent.Capability.Delegate(ctx, connect.NewRequest(&tetherv1.DelegateRequest{ParentGrantId: gC.grant.GrantId, HolderNodeId: gc.Node.NodeId, Scopes: []string{"tool:shell"}}))
	wantRefused(t, "the child's delegation to its own child before its mark", err, connect.CodeFailedPrecondition, "draining")
	_, err = cAgent.Supervisor.RegisterPrivilege(ctx, connect.NewRequest(&tetherv1.RegisterPrivilegeRequest{
		NodeId: c.Node.NodeId, Kind: "file_lock", ExternalId: "/locks/late", ExpiresAt: timestamppb.New(clk.Now().Add(time.Hour)), RevokeUrl: "http://127.0.0.1:1/revoke",
	}))
	wantRefused(t, "the child's privilege before its mark", err, connect.CodeFailedPrecondition, "draining")
	_, err = cAgent.Agent.ProposeStop(ctx, connect.NewRequest(&tetherv1.ProposeStopRequest{Reason: "let me stop myself, slowly", Mode: tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, DrainWindow: durationpb.New(24 * time.Hour)}))
	wantRefused(t, "the child's own stop proposal before its mark", err, connect.CodeFailedPrecondition, "draining")
	_, err = cAgent.Lease.Ack(ctx, connect.NewRequest(ack(offered).GetAck()))
	wantRefused(t, "the child's ACK of a new job before its mark", err, connect.CodeFailedPrecondition, "draining")
	_, err = cAgent.Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{JobId: gcJob.JobId, Result: tetherv1.TerminalResult_TERMINAL_RESULT_FAILED, Reason: "my child's job failed before the stop"}))
	wantRefused(t, "the child's resolution of its own child's job before its mark", err, connect.CodeFailedPrecondition, "draining")
	if err == nil {
		// As the rogue's gate would: the call ends before the mark
		// reaches the child.
		if _, err := gate.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: begun.Msg.Call.CallId, GateId: "gate-1"})); err != nil {
			t.Fatal(err)
		}
	}
	releaseMark()

	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	for _, id := range []string{gc.Node.NodeId, c.Node.NodeId, p.Node.NodeId} {
		if _, err := admin.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: id, Reason: "launcher saw it exit"})); err != nil {
			t.Fatal(err)
		}
	}
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, admin, term.TerminationId)
	if len(rec.ToolCalls) != 1 {
		t.Fatalf("the record lists %d calls, want the child's call made while its parent drained: %v", len(rec.ToolCalls), rec.ToolCalls)
	}
	if got := rec.ToolCalls[0]; got.NodeId != c.Node.NodeId || got.Resolution != tetherv1.CallResolution_CALL_RESOLUTION_REJECTED_DRAINING {
		t.Errorf("the record lists the child's call as %s of %s, want rejected_draining of %s", got.Resolution, got.NodeId, c.Node.NodeId)
	}
}

// offerJobTo offers job to holder as the agent c.
func offerJobTo(t *testing.T, c *testserver.Clients, job, holder string) *tetherv1.Lease {
	t.Helper()
	resp, err := c.Lease.Offer(context.Background(), connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: holder, LeaseDuration: durationpb.New(time.Minute)}))
	if err != nil {
		t.Fatalf("offer %s: %v", job, err)
	}
	wantDecision(t, "offer", resp.Msg.Decision, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_OFFERED)
	return resp.Msg.Lease
}

// TestSeed21AHoldersTricksEachGetAnExplicitOutcome: the lease seed's
// sequence and cancellation rules, played by a holder that tries the
// shortcuts a worker's own word could take, unary and over the Channel.
// A progress report that reuses its accepted sequence with another value
// (to rewrite what it reported) is refused and the accepted value stays;
// the exact repeat is a duplicate. A renew that arrives at the expiry's
// instant is too late: the generation is EXPIRED, and neither a renew nor a
// result revives it. After a cancel request and the holder's cancel ACK, a
// late SUCCESS is refused (the cancellation stays authoritative), progress
// is late evidence, and only CANCELLED or FAILED ends the job. Every one
// of those messages has its own row in the evidence matrix, with its
// decision and the flags after it.
func TestSeed21AHoldersTricksEachGetAnExplicitOutcome(t *testing.T) {
	transports(t, func(t *testing.T, w *leaseWorld, via func(*testserver.Clients) transport) {
		w1 := via(w.w1C)
		// Reused progress sequence.
		job := w.job()
		l, _ := w1.send(t, ack(w.offer(t, job, w.w1, time.Minute)))
		_, d := w1.send(t, progress(l, 3, "wrote 30 rows"))
		wantDecision(t, "progress 3", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_PROGRESS_RECORDED)
		after, d := w1.send(t, progress(l, 3, "wrote 100 rows"))
		wantDecision(t, "progress 3 in other words", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_DUPLICATE_PROGRESS)
		if after.ProgressSequence != 3 || after.ProgressValue != "wrote 30 rows" {
			t.Errorf("after the reused sequence: seq %d value %q, want 3 and the accepted value", after.ProgressSequence, after.ProgressValue)
		}
		_, d = w1.send(t, progress(l, 3, "wrote 30 rows"))
		wantDecision(t, "progress 3 repeated", d, tetherv1.Outcome_OUTCOME_DUPLICATE, tetherv1.AuditEvent_AUDIT_EVENT_DUPLICATE_PROGRESS)
		if got := w.get(t, job); got.ProgressValue != "wrote 30 rows" || !got.ExpiresAt.AsTime().Equal(l.ExpiresAt.AsTime()) {
			t.Errorf("GetLease after the progress reports: value %q expiry %s, want the accepted value and the ACK's expiry %s", got.ProgressValue, got.ExpiresAt.AsTime(), l.ExpiresAt.AsTime())
		}

		// A renew at the expiry's instant.
		job2 := w.job()
		l2, _ := w1.send(t, ack(w.offer(t, job2, w.w1, 10*time.Second)))
		w.clock.Advance(10 * time.Second)
		after, d = w1.send(t, renew(l2, 1))
		wantDecision(t, "renew at the expiry", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_LEASE_EXPIRED)
		if after.State != tetherv1.LeaseState_LEASE_STATE_EXPIRED || after.RenewSequence != 0 || !after.ExpiresAt.AsTime().Equal(l2.ExpiresAt.AsTime()) {
			t.Errorf("after the renew at the expiry: %s seq %d expiry %s, want EXPIRED, 0 and %s", after.State, after.RenewSequence, after.ExpiresAt.AsTime(), l2.ExpiresAt.AsTime())
		}
		_, d = w1.send(t, renew(l2, 2))
		wantDecision(t, "a second renew", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_LEASE_EXPIRED)
		_, d = w1.send(t, complete(l2, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS))
		wantDecision(t, "success after the expiry", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_LEASE_EXPIRED)

		// A late result after the cancel and its acknowledgement.
		job3 := w.job()
		l3, _ := w1.send(t, ack(w.offer(t, job3, w.w1, time.Minute)))
		resp, err := w.plannerC.Lease.RequestCancel(context.Background(), connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: job3, Reason: "budget"}))
		if err != nil {
			t.Fatal(err)
		}
		wantDecision(t, "cancel", resp.Msg.Decision, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_CANCEL_REQUESTED)
		_, d = w1.send(t, cancelAck(l3))
		wantDecision(t, "cancel ack", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_CANCEL_ACKED)
		_, d = w1.send(t, complete(l3, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS))
		wantDecision(t, "success after the cancel ack", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_INVALID_TRANSITION)
		_, d = w1.send(t, progress(l3, 1, "still going"))
		wantDecision(t, "progress after the cancel ack", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_LATE_PROGRESS)
		if got := w.get(t, job3); got.State != tetherv1.LeaseState_LEASE_STATE_ACTIVE || got.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_UNSPECIFIED || !got.CancelAck || got.ProgressSequence != 0 {
			t.Errorf("after the late result: %s %s cancel_ack %v progress %d, want ACTIVE, no result, acknowledged, no progress", got.State, got.TerminalResult, got.CancelAck, got.ProgressSequence)
		}
		done, d := w1.send(t, complete(l3, tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED))
		wantDecision(t, "cancelled", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_TERMINAL_ACCEPTED)
		if done.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED {
			t.Errorf("the job ended %s, want CANCELLED", done.TerminalResult)
		}

		// Each message has its row, with its own decision.
		for _, c := range []struct {
			job  string
			want []string
		}{
			{job, []string{"offer ACCEPTED", "ack ACCEPTED", "progress ACCEPTED", "progress REJECTED", "progress DUPLICATE"}},
			{job2, []string{"offer ACCEPTED", "ack ACCEPTED", "renew REJECTED", "renew REJECTED", "complete REJECTED"}},
			{job3, []string{"offer ACCEPTED", "ack ACCEPTED", "request_cancel ACCEPTED", "cancel_ack ACCEPTED", "complete REJECTED", "progress REJECTED", "complete ACCEPTED"}},
		} {
			var got []string
			for _, r := range w.evidence(t, c.job) {
				if r.Message == "tick" {
					continue // the expiry sweep's row, whenever it ran
				}
				got = append(got, r.Message+" "+strings.TrimPrefix(r.Decision.GetOutcome().String(), "OUTCOME_"))
			}
			if strings.Join(got, ", ") != strings.Join(c.want, ", ") {
				t.Errorf("evidence of %s: %v, want %v", c.job, got, c.want)
			}
		}
	})
}
