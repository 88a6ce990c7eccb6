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
	"pgregory.net/rapid"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/etcdtest"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// leaseWorld is a real server with a manual clock, a planner agent and two
// workers it spawned (w1, w2), and a stranger agent in another tree.
type leaseWorld struct {
	srv                           *testserver.Server
	clock                         *clock.Manual
	admin                         *testserver.Clients
	planner, w1, w2, stranger     string // node ids
	plannerC, w1C, w2C, strangerC *testserver.Clients
	jobs                          int
}

func newLeaseWorld(t *testing.T) *leaseWorld {
	t.Helper()
	clk := clock.NewManual(epoch)
	return populateLeaseWorld(t, testserver.Start(t, testserver.WithClock(clk)), clk)
}

// newLeaseWorldOnEtcd is newLeaseWorld on a server on a real etcd (one
// replica, serving the leases), where a node is read from the store.
func newLeaseWorldOnEtcd(t *testing.T) *leaseWorld {
	t.Helper()
	clk := clock.NewManual(epoch)
	st := etcdtest.OpenStore(t, etcdtest.Start(t))
	srv := testserver.Start(t, testserver.WithEtcdStore(st, "replica-0"), testserver.WithClock(clk))
	testserver.WaitFor(t, replicaWait, "the replica to serve the leases", func() bool {
		serving, _ := srv.Leases().Serving()
		return serving
	})
	return populateLeaseWorld(t, srv, clk)
}

// populateLeaseWorld registers the lease tests' agents on srv: a planner,
// its children w1 and w2, and a stranger of another lineage.
func populateLeaseWorld(t *testing.T, srv *testserver.Server, clk *clock.Manual) *leaseWorld {
	t.Helper()
	w := &leaseWorld{srv: srv, clock: clk, admin: srv.AdminClients()}
	root := register(t, w.admin, "planner")
	w.planner, w.plannerC = root.Node.NodeId, srv.Clients(root.Credential)
	a := spawn(t, w.plannerC, w.planner, "w1")
	w.w1, w.w1C = a.Node.NodeId, srv.Clients(a.Credential)
	b := spawn(t, w.plannerC, w.planner, "w2")
	w.w2, w.w2C = b.Node.NodeId, srv.Clients(b.Credential)
	s := register(t, w.admin, "stranger")
	w.stranger, w.strangerC = s.Node.NodeId, srv.Clients(s.Credential)
	return w
}

func (w *leaseWorld) job() string {
	w.jobs++
	return fmt.Sprintf("job-%d", w.jobs)
}

func (w *leaseWorld) offer(t fataler, job, holder string, d time.Duration) *tetherv1.Lease {
	t.Helper()
	resp, err := w.admin.Lease.Offer(context.Background(), connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: holder, LeaseDuration: durationpb.New(d)}))
	if err != nil {
		t.Fatalf("offer %s: %v", job, err)
	}
	wantDecision(t, "offer", resp.Msg.Decision, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_OFFERED)
	return resp.Msg.Lease
}

func (w *leaseWorld) reassign(t fataler, job, holder string, d time.Duration) *tetherv1.Lease {
	t.Helper()
	resp, err := w.admin.Lease.Reassign(context.Background(), connect.NewRequest(&tetherv1.ReassignRequest{JobId: job, HolderIdentity: holder, LeaseDuration: durationpb.New(d), Reason: "test"}))
	if err != nil {
		t.Fatalf("reassign %s: %v", job, err)
	}
	wantDecision(t, "reassign", resp.Msg.Decision, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_REASSIGNED)
	return resp.Msg.Lease
}

func (w *leaseWorld) get(t fataler, job string) *tetherv1.Lease {
	t.Helper()
	resp, err := w.admin.Lease.GetLease(context.Background(), connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: job}))
	if err != nil {
		t.Fatalf("get %s: %v", job, err)
	}
	return resp.Msg.Lease
}

func (w *leaseWorld) evidence(t fataler, job string) []*tetherv1.EvidenceRow {
	t.Helper()
	resp, err := w.admin.Lease.Evidence(context.Background(), connect.NewRequest(&tetherv1.EvidenceRequest{JobId: job}))
	if err != nil {
		t.Fatalf("evidence %s: %v", job, err)
	}
	return resp.Msg.Rows
}

func wantDecision(t fataler, what string, d *tetherv1.Decision, outcome tetherv1.Outcome, event tetherv1.AuditEvent) {
	t.Helper()
	if d.GetOutcome() != outcome || d.GetAuditEvent() != event {
		t.Fatalf("%s: %s %s (%s), want %s %s", what, d.GetOutcome(), d.GetAuditEvent(), d.GetReason(), outcome, event)
	}
}

// fataler is what the helpers need from a test: *testing.T or *rapid.T.
type fataler interface {
	Helper()
	Fatalf(format string, args ...any)
}

// transport delivers worker messages, unary or over the Channel stream.
type transport interface {
	send(t *testing.T, m *tetherv1.ChannelRequest) (*tetherv1.Lease, *tetherv1.Decision)
}

type unary struct{ c *testserver.Clients }

func (u unary) send(t *testing.T, m *tetherv1.ChannelRequest) (*tetherv1.Lease, *tetherv1.Decision) {
	t.Helper()
	ctx := context.Background()
	type answer interface {
		GetLease() *tetherv1.Lease
		GetDecision() *tetherv1.Decision
	}
	var (
		a   answer
		err error
	)
	switch m := m.Message.(type) {
	case *tetherv1.ChannelRequest_Ack:
		var r *connect.Response[tetherv1.AckResponse]
		if r, err = u.c.Lease.Ack(ctx, connect.NewRequest(m.Ack)); err == nil {
			a = r.Msg
		}
	case *tetherv1.ChannelRequest_Renew:
		var r *connect.Response[tetherv1.RenewResponse]
		if r, err = u.c.Lease.Renew(ctx, connect.NewRequest(m.Renew)); err == nil {
			a = r.Msg
		}
	case *tetherv1.ChannelRequest_Progress:
		var r *connect.Response[tetherv1.ProgressResponse]
		if r, err = u.c.Lease.Progress(ctx, connect.NewRequest(m.Progress)); err == nil {
			a = r.Msg
		}
	case *tetherv1.ChannelRequest_CancelAck:
		var r *connect.Response[tetherv1.LeaseServiceCancelAckResponse]
		if r, err = u.c.Lease.CancelAck(ctx, connect.NewRequest(m.CancelAck)); err == nil {
			a = r.Msg
		}
	case *tetherv1.ChannelRequest_Complete:
		var r *connect.Response[tetherv1.CompleteResponse]
		if r, err = u.c.Lease.Complete(ctx, connect.NewRequest(m.Complete)); err == nil {
			a = r.Msg
		}
	}
	if err != nil {
		t.Fatalf("unary %T: %v", m.Message, err)
	}
	return a.GetLease(), a.GetDecision()
}

// channel is one open Channel stream; send waits for the answer.
type channel struct {
	stream *connect.BidiStreamForClient[tetherv1.ChannelRequest, tetherv1.ChannelResponse]
	next   uint64
}

func openChannel(t *testing.T, c *testserver.Clients) *channel {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream := c.Lease.Channel(ctx)
	t.Cleanup(func() {
		_ = stream.CloseRequest()
		cancel()
		_ = stream.CloseResponse()
	})
	return &channel{stream: stream}
}

func (c *channel) send(t *testing.T, m *tetherv1.ChannelRequest) (*tetherv1.Lease, *tetherv1.Decision) {
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
	if resp.Error != "" {
		t.Fatalf("channel answered an error: %s", resp.Error)
	}
	return resp.Lease, resp.Decision
}

func ack(l *tetherv1.Lease) *tetherv1.ChannelRequest {
	return &tetherv1.ChannelRequest{Message: &tetherv1.ChannelRequest_Ack{Ack: &tetherv1.AckRequest{JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration}}}
}

func renew(l *tetherv1.Lease, seq uint64) *tetherv1.ChannelRequest {
	return &tetherv1.ChannelRequest{Message: &tetherv1.ChannelRequest_Renew{Renew: &tetherv1.RenewRequest{JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration, RenewSequence: seq}}}
}

func progress(l *tetherv1.Lease, seq uint64, value string) *tetherv1.ChannelRequest {
	return &tetherv1.ChannelRequest{Message: &tetherv1.ChannelRequest_Progress{Progress: &tetherv1.ProgressRequest{JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration, ProgressSequence: seq, ProgressValue: value}}}
}

func complete(l *tetherv1.Lease, result tetherv1.TerminalResult) *tetherv1.ChannelRequest {
	return &tetherv1.ChannelRequest{Message: &tetherv1.ChannelRequest_Complete{Complete: &tetherv1.CompleteRequest{JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration, Result: result}}}
}

// transports runs a probe once with unary calls and once over a stream.
func transports(t *testing.T, probe func(t *testing.T, w *leaseWorld, via func(c *testserver.Clients) transport)) {
	t.Run("unary", func(t *testing.T) {
		probe(t, newLeaseWorld(t), func(c *testserver.Clients) transport { return unary{c} })
	})
	t.Run("channel", func(t *testing.T) {
		probe(t, newLeaseWorld(t), func(c *testserver.Clients) transport { return openChannel(t, c) })
	})
}

// Probe 1: generation 7 expired, generation 8 is active, a late renew from
// 7 arrives: generation 8 is kept and the stale rejection is recorded.
func TestLeaseProbeLateRenewFromAnExpiredGeneration(t *testing.T) {
	transports(t, func(t *testing.T, w *leaseWorld, via func(*testserver.Clients) transport) {
		w1, w2 := via(w.w1C), via(w.w2C)
		job := w.job()
		l := w.offer(t, job, w.w1, 10*time.Second)
		for l.LeaseGeneration < 7 {
			l = w.reassign(t, job, w.w1, 10*time.Second)
		}
		gen7, _ := w1.send(t, ack(l))
		if gen7.LeaseGeneration != 7 || gen7.State != tetherv1.LeaseState_LEASE_STATE_ACTIVE {
			t.Fatalf("generation 7: %v", gen7)
		}
		w.clock.Advance(11 * time.Second) // generation 7 expires
		gen8 := w.reassign(t, job, w.w2, 10*time.Second)
		gen8, _ = w2.send(t, ack(gen8))
		if gen8.LeaseGeneration != 8 || gen8.State != tetherv1.LeaseState_LEASE_STATE_ACTIVE {
			t.Fatalf("generation 8: %v", gen8)
		}

		answer, d := w1.send(t, renew(gen7, 1))
		wantDecision(t, "late renew from generation 7", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_STALE_GENERATION)
		// The former holder is told only that generation 8 is active; the
		// coordinating side reads the rest.
		if answer.LeaseGeneration != 8 || answer.State != tetherv1.LeaseState_LEASE_STATE_ACTIVE || answer.HolderIdentity != "" {
			t.Fatalf("the answer to the late renew: %v", answer)
		}
		after := w.get(t, job)
		if after.LeaseGeneration != 8 || after.HolderIdentity != w.w2 || after.State != tetherv1.LeaseState_LEASE_STATE_ACTIVE ||
			!after.ExpiresAt.AsTime().Equal(gen8.ExpiresAt.AsTime()) || after.RenewSequence != 0 || !after.StaleGeneration {
			t.Fatalf("after the late renew: %v", after)
		}
		rows := w.evidence(t, job)
		last := rows[len(rows)-1]
		if last.Message != "renew" || last.Decision.AuditEvent != tetherv1.AuditEvent_AUDIT_EVENT_STALE_GENERATION || !last.StaleGeneration || last.Generation != 8 {
			t.Fatalf("the stale rejection's row: %v", last)
		}
	})
}

// Probe 2: an ACK without a terminal result is not completion; expiry
// stays authoritative.
func TestLeaseProbeAckIsNotCompletion(t *testing.T) {
	transports(t, func(t *testing.T, w *leaseWorld, via func(*testserver.Clients) transport) {
		w1 := via(w.w1C)
		job := w.job()
		l, d := w1.send(t, ack(w.offer(t, job, w.w1, 10*time.Second)))
		wantDecision(t, "ack", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_ACKED)
		if l.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_UNSPECIFIED || l.State != tetherv1.LeaseState_LEASE_STATE_ACTIVE {
			t.Fatalf("after the ack: %v", l)
		}
		w.clock.Advance(10 * time.Second)
		after, d := w1.send(t, complete(l, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS))
		wantDecision(t, "success after expiry", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_LEASE_EXPIRED)
		if after.State != tetherv1.LeaseState_LEASE_STATE_EXPIRED || after.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_UNSPECIFIED || !after.LeaseExpired {
			t.Fatalf("an acked, expired lease: %v", after)
		}
		_, d = w1.send(t, renew(l, 1))
		wantDecision(t, "renew after expiry", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_LEASE_EXPIRED)
		if got := w.get(t, job); got.State != tetherv1.LeaseState_LEASE_STATE_EXPIRED || got.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_UNSPECIFIED {
			t.Fatalf("GetLease: %v", got)
		}
	})
}

// Probe 3: progress 12 after 14 does not move progress back.
func TestLeaseProbeProgressNeverRegresses(t *testing.T) {
	transports(t, func(t *testing.T, w *leaseWorld, via func(*testserver.Clients) transport) {
		w1 := via(w.w1C)
		job := w.job()
		l, _ := w1.send(t, ack(w.offer(t, job, w.w1, time.Minute)))
		_, d := w1.send(t, progress(l, 14, "70%"))
		wantDecision(t, "progress 14", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_PROGRESS_RECORDED)
		after, d := w1.send(t, progress(l, 12, "60%"))
		wantDecision(t, "progress 12", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_LATE_PROGRESS)
		if after.ProgressSequence != 14 || after.ProgressValue != "70%" || !after.LateProgress {
			t.Fatalf("after progress 12: seq %d value %q late %v", after.ProgressSequence, after.ProgressValue, after.LateProgress)
		}
		if !after.ExpiresAt.AsTime().Equal(l.ExpiresAt.AsTime()) {
			t.Fatalf("progress renewed the lease: %s -> %s", l.ExpiresAt.AsTime(), after.ExpiresAt.AsTime())
		}
	})
}

// Probe 4: a cancel requested during a disconnect, then late progress:
// cancellation and expiry stay authoritative and the job needs an explicit
// terminal reconciliation.
func TestLeaseProbeCancelDuringDisconnect(t *testing.T) {
	transports(t, func(t *testing.T, w *leaseWorld, via func(*testserver.Clients) transport) {
		w1 := via(w.w1C)
		job := w.job()
		l, _ := w1.send(t, ack(w.offer(t, job, w.w1, 30*time.Second)))
		w1.send(t, progress(l, 1, "10%"))
		// The worker is disconnected; the planner (its ancestor) cancels.
		resp, err := w.plannerC.Lease.RequestCancel(context.Background(), connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: job, Reason: "budget"}))
		if err != nil {
			t.Fatal(err)
		}
		wantDecision(t, "cancel", resp.Msg.Decision, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_CANCEL_REQUESTED)
		w.clock.Advance(5 * time.Second)
		// Reconnected, it sends the progress it made meanwhile, and a renew.
		after, d := w1.send(t, progress(l, 2, "20%"))
		wantDecision(t, "late progress", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_LATE_PROGRESS)
		if after.ProgressSequence != 1 || !after.CancelRequested || !after.LateProgress {
			t.Fatalf("after late progress: %v", after)
		}
		_, d = w1.send(t, renew(l, 1))
		wantDecision(t, "renew after cancel", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_INVALID_TRANSITION)
		_, d = w1.send(t, complete(l, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS))
		wantDecision(t, "success after cancel", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_INVALID_TRANSITION)
		// The lease runs out with the cancel standing: the coordinator's
		// policy reconciles it explicitly, UNRESOLVED and bounded, never as
		// the holder's word (thirty-eighth pass; before, it stayed EXPIRED
		// and open until someone resolved it).
		w.clock.Advance(30 * time.Second)
		if got := w.get(t, job); got.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_UNRESOLVED || !got.CancelRequested || !got.ResolvedByCoordinator || got.UnresolvedUntil == nil {
			t.Fatalf("before reconciliation: %v", got)
		}
		res, err := w.plannerC.Lease.Resolve(context.Background(), connect.NewRequest(&tetherv1.ResolveRequest{JobId: job, Result: tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED, Reason: "cancelled; the worker never confirmed"}))
		if err != nil {
			t.Fatal(err)
		}
		wantDecision(t, "resolve", res.Msg.Decision, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RESOLVED)
		if got := w.get(t, job); got.State != tetherv1.LeaseState_LEASE_STATE_TERMINAL || got.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED || !got.LeaseExpired {
			t.Fatalf("after reconciliation: %v", got)
		}
	})
}

// The transfer to a reordering stream: a generation's renews and progress
// delivered in any order on the Channel yield the same owner, sequences,
// expiry and progress (and terminal result) as in-order delivery.
func TestLeaseChannelReorderingKeepsStateAndAuthority(t *testing.T) {
	w := newLeaseWorld(t)
	stream := w.w1C.Lease.Channel(context.Background())
	defer func() { _ = stream.CloseRequest(); _ = stream.CloseResponse() }()
	var correlation uint64
	deliver := func(t *rapid.T, msgs []*tetherv1.ChannelRequest) {
		want := map[uint64]bool{}
		for _, m := range msgs {
			correlation++
			m = proto.Clone(m).(*tetherv1.ChannelRequest)
			m.CorrelationId = correlation
			want[correlation] = true
			if err := stream.Send(m); err != nil {
				t.Fatal(err)
			}
		}
		for range msgs {
			resp, err := stream.Receive()
			if err != nil {
				t.Fatal(err)
			}
			if !want[resp.CorrelationId] || resp.Error != "" || resp.Decision == nil {
				t.Fatalf("answer %d: %v", resp.CorrelationId, resp)
			}
			delete(want, resp.CorrelationId)
		}
	}
	rapid.Check(t, func(t *rapid.T) {
		renews := rapid.IntRange(0, 6).Draw(t, "renews")
		progresses := rapid.IntRange(0, 6).Draw(t, "progress")
		dupes := rapid.IntRange(0, 3).Draw(t, "duplicate progress")
		terminal := rapid.Bool().Draw(t, "terminal")
		type job struct {
			l    *tetherv1.Lease
			msgs []*tetherv1.ChannelRequest
		}
		mk := func() job {
			l := w.offer(t, w.job(), w.w1, time.Minute)
			resp, err := w.w1C.Lease.Ack(context.Background(), connect.NewRequest(ack(l).GetAck()))
			if err != nil {
				t.Fatal(err)
			}
			l = resp.Msg.Lease
			var msgs []*tetherv1.ChannelRequest
			for s := 1; s <= renews; s++ {
				msgs = append(msgs, renew(l, uint64(s)))
			}
			for s := 1; s <= progresses; s++ {
				msgs = append(msgs, progress(l, uint64(s), fmt.Sprintf("v%d", s)))
			}
			for i := 0; i < dupes && progresses > 0; i++ {
				msgs = append(msgs, progress(l, uint64(1+i%progresses), fmt.Sprintf("v%d", 1+i%progresses)))
			}
			if terminal {
				msgs = append(msgs, complete(l, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS))
			}
			return job{l, msgs}
		}
		inOrder, shuffled := mk(), mk()
		perm := rapid.Permutation(shuffled.msgs).Draw(t, "order")
		deliver(t, inOrder.msgs)
		deliver(t, perm)
		a, b := w.get(t, inOrder.l.JobId), w.get(t, shuffled.l.JobId)
		same := func(what string, x, y any) {
			if x != y {
				t.Fatalf("%s: in order %v, reordered %v", what, x, y)
			}
		}
		same("state", a.State, b.State)
		same("generation", a.LeaseGeneration, b.LeaseGeneration)
		same("holder", a.HolderIdentity, b.HolderIdentity)
		same("terminal result", a.TerminalResult, b.TerminalResult)
		same("lease id is the job's own", b.LeaseId, shuffled.l.LeaseId)
		if !terminal {
			same("renew sequence", a.RenewSequence, b.RenewSequence)
			same("renew time", a.RenewTime.AsTime(), b.RenewTime.AsTime())
			same("expires at", a.ExpiresAt.AsTime(), b.ExpiresAt.AsTime())
			same("progress sequence", a.ProgressSequence, b.ProgressSequence)
			same("progress value", a.ProgressValue, b.ProgressValue)
		}
	})
}

// Bad input: malformed requests are refused with InvalidArgument naming the
// field and never judged; well-formed messages the protocol refuses get a
// REJECTED decision. Neither changes the lease's state.
func TestLeaseBadInputChangesNothing(t *testing.T) {
	w := newLeaseWorld(t)
	ctx := context.Background()
	job := w.job()
	offered := w.offer(t, job, w.w1, time.Minute)
	active := w.job()
	la := w.offer(t, active, w.w1, time.Minute)
	la, _ = unary{w.w1C}.send(t, ack(la))

	for _, tc := range []struct {
		name  string
		job   string
		field string // InvalidArgument naming this field; "denied": PermissionDenied; "" means judged
		event tetherv1.AuditEvent
		call  func() (*tetherv1.Decision, error)
	}{
		{"zero duration", "job-new", "lease_duration", 0, func() (*tetherv1.Decision, error) {
			r, err := w.admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "job-new", HolderIdentity: w.w1, LeaseDuration: durationpb.New(0)}))
			return decisionOf(r, err)
		}},
		{"negative duration", "job-new", "lease_duration", 0, func() (*tetherv1.Decision, error) {
			r, err := w.admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "job-new", HolderIdentity: w.w1, LeaseDuration: durationpb.New(-time.Second)}))
			return decisionOf(r, err)
		}},
		{"duration above the policy", "job-new", "lease_duration", 0, func() (*tetherv1.Decision, error) {
			r, err := w.admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "job-new", HolderIdentity: w.w1, LeaseDuration: durationpb.New(time.Hour)}))
			return decisionOf(r, err)
		}},
		{"negative reassign duration", active, "lease_duration", 0, func() (*tetherv1.Decision, error) {
			r, err := w.admin.Lease.Reassign(ctx, connect.NewRequest(&tetherv1.ReassignRequest{JobId: active, HolderIdentity: w.w2, LeaseDuration: durationpb.New(-time.Second)}))
			return decisionOf(r, err)
		}},
		{"oversized progress value", active, "progress_value", 0, func() (*tetherv1.Decision, error) {
			r, err := w.w1C.Lease.Progress(ctx, connect.NewRequest(&tetherv1.ProgressRequest{JobId: active, LeaseId: la.LeaseId, LeaseGeneration: 1, ProgressSequence: 1, ProgressValue: strings.Repeat("x", 5000)}))
			return decisionOf(r, err)
		}},
		{"oversized job id", "", "job_id", 0, func() (*tetherv1.Decision, error) {
			r, err := w.w1C.Lease.Renew(ctx, connect.NewRequest(&tetherv1.RenewRequest{JobId: strings.Repeat("j", 300), LeaseId: la.LeaseId, LeaseGeneration: 1, RenewSequence: 1}))
			return decisionOf(r, err)
		}},
		{"renew sequence zero", active, "renew_sequence", 0, func() (*tetherv1.Decision, error) {
			r, err := w.w1C.Lease.Renew(ctx, connect.NewRequest(&tetherv1.RenewRequest{JobId: active, LeaseId: la.LeaseId, LeaseGeneration: 1}))
			return decisionOf(r, err)
		}},
		{"generation zero", active, "lease_generation", 0, func() (*tetherv1.Decision, error) {
			r, err := w.w1C.Lease.Renew(ctx, connect.NewRequest(&tetherv1.RenewRequest{JobId: active, LeaseId: la.LeaseId, RenewSequence: 1}))
			return decisionOf(r, err)
		}},
		{"success declared by the coordinator", active, "result", 0, func() (*tetherv1.Decision, error) {
			r, err := w.admin.Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{JobId: active, Result: tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS}))
			return decisionOf(r, err)
		}},
		{"unknown job", "job-nobody-offered", "denied", 0, func() (*tetherv1.Decision, error) {
			r, err := w.w1C.Lease.Renew(ctx, connect.NewRequest(&tetherv1.RenewRequest{JobId: "job-nobody-offered", LeaseId: "l_x", LeaseGeneration: 1, RenewSequence: 1}))
			return decisionOf(r, err)
		}},
		{"wrong lease id", active, "", tetherv1.AuditEvent_AUDIT_EVENT_UNKNOWN_LEASE, func() (*tetherv1.Decision, error) {
			r, err := w.w1C.Lease.Renew(ctx, connect.NewRequest(&tetherv1.RenewRequest{JobId: active, LeaseId: "l_not_it", LeaseGeneration: 1, RenewSequence: 1}))
			return decisionOf(r, err)
		}},
		{"a sibling acking an offer", job, "denied", 0, func() (*tetherv1.Decision, error) {
			r, err := w.w2C.Lease.Ack(ctx, connect.NewRequest(&tetherv1.AckRequest{JobId: job, LeaseId: offered.LeaseId, LeaseGeneration: 1}))
			return decisionOf(r, err)
		}},
		{"the coordinating lineage acking an offer", job, "", tetherv1.AuditEvent_AUDIT_EVENT_HOLDER_MISMATCH, func() (*tetherv1.Decision, error) {
			r, err := w.plannerC.Lease.Ack(ctx, connect.NewRequest(&tetherv1.AckRequest{JobId: job, LeaseId: offered.LeaseId, LeaseGeneration: 1}))
			return decisionOf(r, err)
		}},
		{"generation from the future", active, "", tetherv1.AuditEvent_AUDIT_EVENT_FUTURE_GENERATION, func() (*tetherv1.Decision, error) {
			r, err := w.w1C.Lease.Renew(ctx, connect.NewRequest(&tetherv1.RenewRequest{JobId: active, LeaseId: la.LeaseId, LeaseGeneration: 9, RenewSequence: 1}))
			return decisionOf(r, err)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, _ := w.admin.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: tc.job}))
			var rowsBefore int
			if before != nil {
				rowsBefore = len(w.evidence(t, tc.job))
			}
			d, err := tc.call()
			if tc.field == "denied" {
				if connect.CodeOf(err) != connect.CodePermissionDenied {
					t.Fatalf("got %v (decision %v), want permission_denied", err, d)
				}
			} else if tc.field != "" {
				if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), tc.field) {
					t.Fatalf("got %v (decision %v), want invalid_argument naming %s", err, d, tc.field)
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				wantDecision(t, tc.name, d, tetherv1.Outcome_OUTCOME_REJECTED, tc.event)
			}
			after, _ := w.admin.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: tc.job}))
			if (before == nil) != (after == nil) || (before != nil && !proto.Equal(before.Msg.Lease, after.Msg.Lease)) {
				t.Fatalf("state changed:\nbefore %v\nafter  %v", before, after)
			}
			if before == nil {
				return
			}
			// A judged rejection adds its evidence row; a malformed request adds none.
			wantRows := rowsBefore
			if tc.field == "" {
				wantRows++
			}
			if got := len(w.evidence(t, tc.job)); got != wantRows {
				t.Fatalf("%d evidence rows, want %d", got, wantRows)
			}
		})
	}

	t.Run("malformed on the channel", func(t *testing.T) {
		c := openChannel(t, w.w1C)
		before := w.get(t, active)
		if err := c.stream.Send(&tetherv1.ChannelRequest{CorrelationId: 77, Message: &tetherv1.ChannelRequest_Progress{Progress: &tetherv1.ProgressRequest{JobId: active, LeaseId: la.LeaseId, LeaseGeneration: 1, ProgressSequence: 1, ProgressValue: strings.Repeat("x", 5000)}}}); err != nil {
			t.Fatal(err)
		}
		resp, err := c.stream.Receive()
		if err != nil {
			t.Fatal(err)
		}
		if resp.CorrelationId != 77 || !strings.Contains(resp.Error, "progress_value") || resp.Decision != nil {
			t.Fatalf("answer: %v", resp)
		}
		if err := c.stream.Send(&tetherv1.ChannelRequest{CorrelationId: 78}); err != nil {
			t.Fatal(err)
		}
		if resp, err = c.stream.Receive(); err != nil || resp.CorrelationId != 78 || resp.Error == "" {
			t.Fatalf("empty message: %v, %v", resp, err)
		}
		if after := w.get(t, active); !proto.Equal(before, after) {
			t.Fatalf("state changed:\nbefore %v\nafter  %v", before, after)
		}
	})

	t.Run("wrong holder of an active lease", func(t *testing.T) {
		// A second identity of the coordinating lineage claiming the active
		// generation is an ownership conflict: recorded as evidence; the
		// holder's authority is as it was.
		before := w.get(t, active)
		_, d := unary{w.plannerC}.send(t, renew(la, 1))
		wantDecision(t, "renew by the planner", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_OWNERSHIP_CONFLICT)
		after := w.get(t, active)
		if after.HolderIdentity != before.HolderIdentity || after.RenewSequence != before.RenewSequence || !after.ExpiresAt.AsTime().Equal(before.ExpiresAt.AsTime()) ||
			after.State != before.State || !after.OwnershipConflict || after.ConflictHolder != w.planner {
			t.Fatalf("after the conflicting claim:\nbefore %v\nafter  %v", before, after)
		}
	})
}

func decisionOf[R any](r *connect.Response[R], err error) (*tetherv1.Decision, error) {
	if err != nil {
		return nil, err
	}
	return any(r.Msg).(interface{ GetDecision() *tetherv1.Decision }).GetDecision(), nil
}

func TestLeaseAuthorization(t *testing.T) {
	w := newLeaseWorld(t)
	ctx := context.Background()
	deny := func(what string, err error) {
		t.Helper()
		if connect.CodeOf(err) != connect.CodePermissionDenied {
			t.Fatalf("%s: %v, want permission_denied", what, err)
		}
	}
	_, err := w.w1C.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "self", HolderIdentity: w.w1}))
	deny("a worker offering itself a job", err)
	_, err = w.strangerC.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "x", HolderIdentity: w.w1}))
	deny("an unrelated agent offering", err)
	resp, err := w.plannerC.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "by-planner", HolderIdentity: w.w1}))
	if err != nil {
		t.Fatalf("an ancestor offering: %v", err)
	}
	if got := resp.Msg.Lease.LeaseDuration.AsDuration(); got != 30*time.Second {
		t.Fatalf("default lease duration %s", got)
	}
	_, err = w.admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "nobody", HolderIdentity: "n_00000000000000000000"}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("offer to an unregistered agent: %v", err)
	}
	_, err = w.w2C.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: "by-planner"}))
	deny("a sibling cancelling", err)
	_, err = w.w1C.Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{JobId: "by-planner", Result: tetherv1.TerminalResult_TERMINAL_RESULT_FAILED}))
	deny("the holder resolving its own job", err)
	_, err = w.plannerC.Lease.Reassign(ctx, connect.NewRequest(&tetherv1.ReassignRequest{JobId: "by-planner", HolderIdentity: w.stranger}))
	deny("reassigning to an agent outside the caller's subtree", err)
	_, err = w.w2C.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: "by-planner"}))
	deny("a sibling reading the lease", err)
	if _, err := w.plannerC.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: "by-planner"})); err != nil {
		t.Fatalf("an ancestor reading: %v", err)
	}
	if _, err := w.w1C.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: "by-planner"})); err != nil {
		t.Fatalf("the holder reading its evidence: %v", err)
	}
	_, err = w.admin.Lease.Renew(ctx, connect.NewRequest(&tetherv1.RenewRequest{JobId: "by-planner", LeaseId: "l", LeaseGeneration: 1, RenewSequence: 1}))
	deny("an operator renewing (holder binding: only the agent holds a lease)", err)
	list, err := w.w1C.Lease.ListLeases(ctx, connect.NewRequest(&tetherv1.ListLeasesRequest{}))
	if err != nil || len(list.Msg.Leases) != 1 || list.Msg.Leases[0].JobId != "by-planner" {
		t.Fatalf("the worker's own leases: %v, %v", list, err)
	}
	_, err = w.w1C.Lease.ListLeases(ctx, connect.NewRequest(&tetherv1.ListLeasesRequest{HolderIdentity: w.w2}))
	deny("listing a sibling's leases", err)
}

func TestGetLeaseShowsKubernetesStyleFields(t *testing.T) {
	w := newLeaseWorld(t)
	job := w.job()
	l := w.offer(t, job, w.w1, time.Minute)
	w.clock.Advance(time.Second)
	acked, _ := unary{w.w1C}.send(t, ack(l))
	w.clock.Advance(10 * time.Second)
	unary{w.w1C}.send(t, renew(acked, 1))
	got := w.get(t, job)
	if !got.AcquireTime.AsTime().Equal(epoch.Add(time.Second)) || !got.LastRenewTime.AsTime().Equal(epoch.Add(11*time.Second)) || got.LeaseTransitions != 0 {
		t.Fatalf("acquire %s, last renew %s, transitions %d", got.AcquireTime.AsTime(), got.LastRenewTime.AsTime(), got.LeaseTransitions)
	}
	w.reassign(t, job, w.w2, time.Minute)
	if got := w.get(t, job); got.LeaseTransitions != 1 || got.LeaseGeneration != 2 {
		t.Fatalf("after a reassignment: transitions %d generation %d", got.LeaseTransitions, got.LeaseGeneration)
	}
	pol, err := w.admin.Lease.GetPolicy(context.Background(), connect.NewRequest(&tetherv1.GetPolicyRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if p := pol.Msg.Policy; !strings.Contains(p.ClockSource, "coordinator") || !strings.HasPrefix(p.RestartBehavior, "extend") || p.SkewAllowance.AsDuration() != 2*time.Second {
		t.Fatalf("policy: %v", p)
	}
}

// kill -9 between an acknowledged renew and the next: the renew is there
// after the restart and the lease goes on.
func TestLeaseRenewSurvivesKill9(t *testing.T) {
	if testing.Short() {
		// By design: -short (make test-short) leaves out the slow subprocess and
		// browser tests; make test and CI run them.
		t.Skip("By design: -short skips the tests that run the real binary; make test and CI run them.")
	}
	dir := t.TempDir()
	proc, workerCred, l := processWithAckedJob(t, dir)
	ctx := context.Background()
	worker := proc.Clients(workerCred)
	for seq := uint64(1); seq <= 3; seq++ {
		_, d := unary{worker}.send(t, renew(l, seq))
		wantDecision(t, "renew", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RENEWED)
	}
	proc.Kill()

	proc = testserver.StartProcess(t, dir)
	worker = proc.Clients(workerCred)
	got, err := proc.Clients(proc.Admin).Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: "job"}))
	if err != nil {
		t.Fatal(err)
	}
	if g := got.Msg.Lease; g.RenewSequence != 3 || g.State != tetherv1.LeaseState_LEASE_STATE_ACTIVE || g.AcquireTime == nil || g.LastRenewTime == nil {
		t.Fatalf("after kill -9: %v", g)
	}
	_, d := unary{worker}.send(t, renew(l, 3))
	wantDecision(t, "the acknowledged renew resent", d, tetherv1.Outcome_OUTCOME_DUPLICATE, tetherv1.AuditEvent_AUDIT_EVENT_DUPLICATE_RENEW)
	_, d = unary{worker}.send(t, renew(l, 4))
	wantDecision(t, "the next renew", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RENEWED)
}

// A batched Channel request is judged message by message, and the answers
// may come back packed, each under its own correlation id.
func TestLeaseChannelBatches(t *testing.T) {
	w := newLeaseWorld(t)
	var leases []*tetherv1.Lease
	for range 5 {
		l := w.offer(t, w.job(), w.w1, time.Minute)
		l, _ = unary{w.w1C}.send(t, ack(l))
		leases = append(leases, l)
	}
	stream := w.w1C.Lease.Channel(context.Background())
	defer func() { _ = stream.CloseRequest(); _ = stream.CloseResponse() }()
	first := renew(leases[0], 1)
	first.CorrelationId = 100
	for i, l := range leases[1:] {
		m := renew(l, 1)
		m.CorrelationId = uint64(101 + i)
		first.Batch = append(first.Batch, m)
	}
	bad := progress(leases[0], 1, strings.Repeat("x", 5000))
	bad.CorrelationId = 200
	nested := renew(leases[1], 2)
	nested.CorrelationId = 201
	nested.Batch = []*tetherv1.ChannelRequest{renew(leases[2], 2)}
	first.Batch = append(first.Batch, bad, nested)
	if err := stream.Send(first); err != nil {
		t.Fatal(err)
	}
	got := map[uint64]*tetherv1.ChannelResponse{}
	for len(got) < 7 {
		resp, err := stream.Receive()
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range append([]*tetherv1.ChannelResponse{resp}, resp.Batch...) {
			if got[a.CorrelationId] != nil {
				t.Fatalf("answer %d twice", a.CorrelationId)
			}
			got[a.CorrelationId] = a
		}
	}
	for i, l := range leases {
		a := got[uint64(100+i)]
		wantDecision(t, "batched renew", a.GetDecision(), tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RENEWED)
		if a.Lease.JobId != l.JobId || a.Lease.RenewSequence != 1 {
			t.Fatalf("answer %d is about %s seq %d", 100+i, a.Lease.JobId, a.Lease.RenewSequence)
		}
	}
	if a := got[200]; !strings.Contains(a.Error, "progress_value") {
		t.Fatalf("malformed message in a batch: %v", a)
	}
	if a := got[201]; !strings.Contains(a.Error, "batch") {
		t.Fatalf("nested batch: %v", a)
	}
	if l := w.get(t, leases[1].JobId); l.RenewSequence != 1 {
		t.Fatalf("a refused nested batch changed the lease: seq %d", l.RenewSequence)
	}
}

// A termination cancels the leases its subtree holds and reconciles each
// one explicitly in the record; leases outside the subtree are untouched.
func TestTerminationReconcilesTheSubtreesLeases(t *testing.T) {
	w := newLeaseWorld(t)
	held := w.offer(t, "held", w.w1, 10*time.Minute)
	unary{w.w1C}.send(t, ack(held))
	w.offer(t, "offered", w.w1, 10*time.Minute)
	other := w.offer(t, "other", w.w2, 10*time.Minute)
	unary{w.w2C}.send(t, ack(other))

	term := terminate(t, w.admin, w.w1, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, time.Second, time.Second, 0)
	w.clock.Advance(2 * time.Second) // past the drain window and the cancel-ack timeout
	testserver.WaitFor(t, 20*time.Second, "the termination to finish", func() bool {
		return getTermination(t, w.admin, term.TerminationId).State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	rec := record(t, w.admin, term.TerminationId)
	got := map[string]tetherv1.LeaseOutcome{}
	for _, l := range rec.Leases {
		got[l.JobId] = l.Outcome
	}
	want := map[string]tetherv1.LeaseOutcome{
		"held":    tetherv1.LeaseOutcome_LEASE_OUTCOME_UNRESOLVED, // active, cancel never acknowledged
		"offered": tetherv1.LeaseOutcome_LEASE_OUTCOME_CANCELLED,  // never acked: never had authority
	}
	if len(got) != len(want) || got["held"] != want["held"] || got["offered"] != want["offered"] {
		t.Fatalf("record leases %v, want %v", got, want)
	}
	if l := w.get(t, "held"); !l.CancelRequested || l.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_UNRESOLVED || l.UnresolvedUntil == nil {
		t.Fatalf("held after the termination: %v", l)
	}
	if l := w.get(t, "other"); l.CancelRequested || l.State != tetherv1.LeaseState_LEASE_STATE_ACTIVE {
		t.Fatalf("a lease outside the subtree changed: %v", l)
	}
}

// processWithAckedJob starts the real binary on dir and gives it a root
// with one child, "w", holding the job "job" (a ten-minute lease, offered
// by the operator and acknowledged): the set-up of the kill -9 lease tests.
// It returns the process, the child's credential and the acknowledged lease.
func processWithAckedJob(t *testing.T, dir string) (*testserver.Process, string, *tetherv1.Lease) {
	t.Helper()
	proc := testserver.StartProcess(t, dir)
	admin := proc.Clients(proc.Admin)
	ctx := context.Background()
	root, err := admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "root"}))
	if err != nil {
		t.Fatal(err)
	}
	child, err := proc.Clients(root.Msg.Credential).Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: root.Msg.Node.NodeId, Name: "w"}))
	if err != nil {
		t.Fatal(err)
	}
	offered, err := admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "job", HolderIdentity: child.Msg.Node.NodeId, LeaseDuration: durationpb.New(10 * time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	l, _ := unary{proc.Clients(child.Msg.Credential)}.send(t, ack(offered.Msg.Lease))
	return proc, child.Msg.Credential, l
}

// endSession opens a session of node's (c its clients), ends it, and
// waits until its end is stored: the node has no session open and a
// session end, the first step of an agent that claims its exit.
func (w *leaseWorld) endSession(t *testing.T, c *testserver.Clients, node string) {
	t.Helper()
	sess, err := openSession(t, c, node)
	if err != nil {
		t.Fatal(err)
	}
	sess.close()
	testserver.WaitFor(t, 10*time.Second, "the session's end of "+node, func() bool {
		n := getNode(t, w.admin, node)
		return len(n.OpenSessions) == 0 && n.SessionClosedAt != nil
	})
}
