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

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The seventeenth hostile pass on job leases (seed 000 §9, §12).

// TestRogue17AnAgentBeingStoppedCannotHaltAJobItCoordinates: an agent being
// stopped does not decide about jobs its lineage coordinates (it may not
// reassign, cancel or resolve them: seed7 test), but its claim on a job's
// active generation, which the lease machine records as an ownership
// conflict (seed §12), halted the job as surely as a cancel: the holder's
// renewals refused, its progress not applied, its result refused. In a
// tree R → {O → D, E}, O offers a job to its child D and R moves it to E,
// outside O's subtree: O, the job's owner, still coordinates it. An
// operator drains O (a tool call in flight holds the drain open); E is not
// being stopped. O, draining, claims E's generation — renew, progress,
// cancel ack and a result, unary and over a Channel. Each is refused
// failed_precondition naming O and its state, before the lease machine:
// the lease and its evidence are unchanged, and E renews and reports its
// SUCCESS as before. (Before, O's first claim recorded a conflict, and
// E's renewal and SUCCESS were refused until someone above resolved it.)
func TestRogue17AnAgentBeingStoppedCannotHaltAJobItCoordinates(t *testing.T) {
	ctx := context.Background()
	srv := testserver.Start(t, testserver.WithClock(clock.NewManual(epoch)))
	w := newHaltWorld(t, srv)
	for what, m := range w.claims() {
		_, err := sendUnary(ctx, w.oC, m)
		wantRefused(t, "the draining owner's unary "+what, err, connect.CodeFailedPrecondition, w.o, "draining")
		w.unchanged(t, "the draining owner's unary "+what)
	}
	ch := w.oC.Lease.Channel(ctx)
	t.Cleanup(func() { _ = ch.CloseRequest(); _ = ch.CloseResponse() })
	var correlation uint64
	for what, m := range w.claims() {
		correlation++
		m.CorrelationId = correlation
		if err := ch.Send(m); err != nil {
			t.Fatal(err)
		}
		resp, err := ch.Receive()
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(resp.Error, connect.CodeFailedPrecondition.String()+":") || !strings.Contains(resp.Error, w.o) || !strings.Contains(resp.Error, "draining") {
			t.Fatalf("the draining owner's %s on its channel: error %q, decision %v; want failed_precondition naming it draining", what, resp.Error, resp.Decision)
		}
		w.unchanged(t, "the draining owner's "+what+" on its channel")
	}
	w.holderGoesOn(t, w.eC)
}

// TestEtcdRogue17AnAgentBeingStoppedCannotHaltAJobThroughAFollower: the
// same, on three replicas over etcd, the draining owner's claims sent to
// each follower (which forwards them to the leader, where they are judged)
// and the holder's renewal and result through a follower too.
func TestEtcdRogue17AnAgentBeingStoppedCannotHaltAJobThroughAFollower(t *testing.T) {
	ctx := context.Background()
	replicas, lead, _ := startReplicas(t, 3)
	w := newHaltWorld(t, lead)
	followers := followersOf(replicas, lead)
	for _, f := range followers {
		for what, m := range w.claims() {
			_, err := sendUnary(ctx, f.Clients(w.oCredential), m)
			wantRefused(t, "the draining owner's "+what+" through a follower", err, connect.CodeFailedPrecondition, w.o, "draining")
			w.unchanged(t, "the draining owner's "+what+" through a follower")
		}
	}
	w.holderGoesOn(t, followers[0].Clients(w.eCredential))
}

// haltWorld is a tree R → {O → D, E}: O offered a job to its child D, R
// moved it to E, E holds it ACTIVE, and an operator drains O (a tool call
// of O's in flight holds the drain open). O, the job's owner, still
// coordinates it; E is not being stopped.
type haltWorld struct {
	admin, oC, eC            *testserver.Clients
	o, e                     string // node ids
	oCredential, eCredential string
	held                     *tetherv1.Lease
	before                   *tetherv1.Lease
	rows                     int
}

func newHaltWorld(t *testing.T, srv *testserver.Server) *haltWorld {
	t.Helper()
	ctx := context.Background()
	admin := srv.AdminClients()
	r := register(t, admin, "root")
	rC := srv.Clients(r.Credential)
	o := spawn(t, rC, r.Node.NodeId, "owner")
	oC := srv.Clients(o.Credential)
	e := spawn(t, rC, r.Node.NodeId, "worker")
	eC := srv.Clients(e.Credential)
	d := spawn(t, oC, o.Node.NodeId, "owners-child")

	const job = "rogue17-halt"
	if _, err := oC.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: d.Node.NodeId, LeaseDuration: durationpb.New(10 * time.Minute)})); err != nil {
		t.Fatalf("the owner's offer: %v", err)
	}
	moved, err := rC.Lease.Reassign(ctx, connect.NewRequest(&tetherv1.ReassignRequest{JobId: job, HolderIdentity: e.Node.NodeId, LeaseDuration: durationpb.New(10 * time.Minute), Reason: "E has the data"}))
	if err != nil {
		t.Fatalf("the root's reassignment: %v", err)
	}
	wantDecision(t, "reassign", moved.Msg.Decision, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_REASSIGNED)
	held, dec := unary{eC}.send(t, ack(moved.Msg.Lease))
	wantDecision(t, "E's ack", dec, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_ACKED)

	// O, running, still coordinates the job it offered: it reads it.
	if _, err := oC.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: job})); err != nil {
		t.Fatalf("the owner's read of its job: %v", err)
	}

	gR := issueRoot(t, admin, r.Node.NodeId, time.Hour, "tool:*")
	gO := delegate(t, rC, gR, o.Node.NodeId, "tool:shell")
	gate := srv.Clients(srv.ToolServerToken(t, "gate-1"))
	if _, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: gO.token, Tool: "shell", GateId: "gate-1"})); err != nil {
		t.Fatal(err)
	}
	term := terminate(t, admin, o.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Hour, time.Minute, time.Minute)
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)

	w := &haltWorld{admin: admin, oC: oC, eC: eC, o: o.Node.NodeId, e: e.Node.NodeId, oCredential: o.Credential, eCredential: e.Credential, held: held}
	w.before = leaseOf(t, admin, job)
	w.rows = len(evidenceRows(t, admin, job))
	return w
}

// claims are O's worker messages claiming E's generation.
func (w *haltWorld) claims() map[string]*tetherv1.ChannelRequest {
	return map[string]*tetherv1.ChannelRequest{
		"renew":      renew(w.held, 7),
		"progress":   progress(w.held, 7, "done by O"),
		"cancel ack": {Message: &tetherv1.ChannelRequest_CancelAck{CancelAck: &tetherv1.LeaseServiceCancelAckRequest{JobId: w.held.JobId, LeaseId: w.held.LeaseId, LeaseGeneration: w.held.LeaseGeneration}}},
		"complete":   complete(w.held, tetherv1.TerminalResult_TERMINAL_RESULT_FAILED),
	}
}

// unchanged checks that a refused claim left the lease and its evidence
// as they were.
func (w *haltWorld) unchanged(t *testing.T, what string) {
	t.Helper()
	if after := leaseOf(t, w.admin, w.held.JobId); !proto.Equal(after, w.before) {
		t.Fatalf("%s changed the lease:\nbefore %v\nafter  %v", what, w.before, after)
	}
	if n := len(evidenceRows(t, w.admin, w.held.JobId)); n != w.rows {
		t.Fatalf("%s left %d evidence rows, want none", what, n-w.rows)
	}
}

// holderGoesOn has E, not being stopped, renew and report SUCCESS.
func (w *haltWorld) holderGoesOn(t *testing.T, e *testserver.Clients) {
	t.Helper()
	_, dec := unary{e}.send(t, renew(w.held, 1))
	wantDecision(t, "E's renewal", dec, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RENEWED)
	done, dec := unary{e}.send(t, complete(w.held, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS))
	wantDecision(t, "E's result", dec, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_TERMINAL_ACCEPTED)
	if done.OwnershipConflict || done.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS {
		t.Fatalf("E's job ended %s with conflict %v, want SUCCESS and no conflict", done.TerminalResult, done.OwnershipConflict)
	}
}

func leaseOf(t *testing.T, c *testserver.Clients, job string) *tetherv1.Lease {
	t.Helper()
	resp, err := c.Lease.GetLease(context.Background(), connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: job}))
	if err != nil {
		t.Fatalf("get %s: %v", job, err)
	}
	return resp.Msg.Lease
}

func evidenceRows(t *testing.T, c *testserver.Clients, job string) []*tetherv1.EvidenceRow {
	t.Helper()
	resp, err := c.Lease.Evidence(context.Background(), connect.NewRequest(&tetherv1.EvidenceRequest{JobId: job}))
	if err != nil {
		t.Fatalf("evidence %s: %v", job, err)
	}
	return resp.Msg.Rows
}

// sendUnary sends a worker message as its unary call and returns its
// decision, or the call's refusal.
func sendUnary(ctx context.Context, c *testserver.Clients, m *tetherv1.ChannelRequest) (*tetherv1.Decision, error) {
	switch m := m.Message.(type) {
	case *tetherv1.ChannelRequest_Ack:
		return decisionOf(c.Lease.Ack(ctx, connect.NewRequest(m.Ack)))
	case *tetherv1.ChannelRequest_Renew:
		return decisionOf(c.Lease.Renew(ctx, connect.NewRequest(m.Renew)))
	case *tetherv1.ChannelRequest_Progress:
		return decisionOf(c.Lease.Progress(ctx, connect.NewRequest(m.Progress)))
	case *tetherv1.ChannelRequest_CancelAck:
		return decisionOf(c.Lease.CancelAck(ctx, connect.NewRequest(m.CancelAck)))
	case *tetherv1.ChannelRequest_Complete:
		return decisionOf(c.Lease.Complete(ctx, connect.NewRequest(m.Complete)))
	}
	return nil, nil
}

// TestRogue17AStaleMessageInASiblingsBatchDoesNotSinkItsUpkeep: once a
// rogue spent its lineage's shared budget, a sibling's batched upkeep of
// the leases it holds is admitted from each lease's allowance (leasereserve
// tests). But a batch was admitted from the allowances only up to its first
// message that was not such upkeep, and the rest charged to the node's
// small reserve together: one stale message — here a renewal of a
// generation the coordinator superseded a moment before, which the holder
// had not heard of yet, the ordinary race of a lease — first in a batch of
// a hundred renewals had the whole batch refused resource_exhausted and
// the sibling's lease stream ended, its 99 leases unrenewed. Each message
// is now admitted on its own: the 99 renewals from their leases'
// allowances, the stale one from the node's reserve (judged, and refused
// as stale), and the stream goes on.
func TestRogue17AStaleMessageInASiblingsBatchDoesNotSinkItsUpkeep(t *testing.T) {
	w := newLeaseReserveWorld(t)
	const jobs = 100
	leases := make([]*tetherv1.Lease, jobs)
	for i := range leases {
		leases[i] = w.offer(t, fmt.Sprintf("job-%03d", i), w.honestNode)
	}
	channel := openChannel(t, w.honestC)
	msgs := make([]*tetherv1.ChannelRequest, jobs)
	for i, l := range leases {
		msgs[i] = ack(l)
	}
	for i, a := range channel.sendBatch(t, msgs) {
		if a.Error != "" {
			t.Fatalf("the sibling's ACK %d: %s", i+1, a.Error)
		}
		leases[i] = a.Lease
	}
	// The coordinator moves job-001 to a new generation (the sibling's
	// again) just before the sibling's next round of renewals.
	w.clk.Advance(10 * time.Second)
	const moved = 1 // the first message of the batch the carrier carries
	if _, err := w.admin.Lease.Reassign(context.Background(), connect.NewRequest(&tetherv1.ReassignRequest{JobId: leases[moved].JobId, HolderIdentity: w.honestNode, Reason: "restart it"})); err != nil {
		t.Fatal(err)
	}
	spendLineage(t, w.rogueC, w.rogueNode)
	for i, l := range leases {
		msgs[i] = renew(l, 1)
	}
	answers := channel.sendBatch(t, msgs)
	for i, a := range answers {
		if i == moved {
			continue
		}
		if a.Error != "" {
			t.Fatalf("the sibling's renewal of lease %d of %d, in a batch with a stale one, once the rogue spent the lineage's budget: %s", i+1, jobs, a.Error)
		}
		wantDecision(t, "the sibling's renewal", a.Decision, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RENEWED)
	}
	if a := answers[moved]; a.Error != "" {
		t.Fatalf("the stale renewal, within the node's reserve: %s", a.Error)
	} else {
		wantDecision(t, "the stale renewal", a.Decision, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_STALE_GENERATION)
	}
	// The stream is still open: the sibling ACKs the new generation on it.
	current := (&leaseWorld{admin: w.admin}).get(t, leases[moved].JobId)
	_, d, errText := channel.try(t, ack(current))
	if errText != "" {
		t.Fatalf("the sibling's ACK of the new generation on the same stream: %s", errText)
	}
	wantDecision(t, "the sibling's ACK of the new generation", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_ACKED)
}
