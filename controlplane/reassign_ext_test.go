package controlplane_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/lease"
)

// reassignPolicy is the ACK-miss policy reassign with its bound.
func reassignPolicy(max uint64) testserver.Option {
	return func(cfg *controlplane.Config) {
		p := lease.DefaultPolicy()
		p.AckMiss = lease.AckMissReassign
		p.MaxAutoReassigns = max
		p.DefaultAckTimeout = 5 * time.Second
		cfg.LeasePolicy = &p
	}
}

// newReassignWorld is newLeaseWorld under the reassign policy, on a data
// directory and clock the test keeps so that it can restart the server.
func newReassignWorld(t *testing.T, dir string, clk *clock.Manual, max uint64) *leaseWorld {
	t.Helper()
	srv := testserver.StartIn(t, dir, testserver.WithClock(clk), reassignPolicy(max))
	w := &leaseWorld{srv: srv, clock: clk, admin: srv.AdminClients()}
	root := register(t, w.admin, "planner")
	w.planner, w.plannerC = root.Node.NodeId, srv.Clients(root.Credential)
	a := spawn(t, w.plannerC, w.planner, "w1")
	w.w1, w.w1C = a.Node.NodeId, srv.Clients(a.Credential)
	return w
}

// passAckDeadline moves the coordinator's clock to the job's ACK deadline
// and waits until the coordinator has acted on it: the generation expired
// and stayed so, or a new generation with a later deadline was offered (the
// tick and the automatic reassignment commit together, so a reader never
// sees the one without the other).
func passAckDeadline(t *testing.T, w *leaseWorld, job string) *tetherv1.Lease {
	t.Helper()
	l := w.get(t, job)
	if l.State != tetherv1.LeaseState_LEASE_STATE_OFFERED {
		t.Fatalf("%s is %s, not waiting for an ACK", job, l.State)
	}
	deadline := l.AckDeadline.AsTime()
	w.clock.Set(deadline)
	var now *tetherv1.Lease
	testserver.WaitFor(t, 20*time.Second, "the coordinator to act on the ACK deadline", func() bool {
		now = w.get(t, job)
		return now.State == tetherv1.LeaseState_LEASE_STATE_EXPIRED || now.AckDeadline.AsTime().After(deadline)
	})
	return now
}

// Seed 000 §5: if the ACK does not arrive by the deadline, the coordinator
// expires or reassigns the lease, per its policy. Under reassign, a holder
// that never ACKs (dead, or hostile: it keeps the job from finishing and
// grows its evidence) used to be offered a new generation at every
// deadline, two evidence rows each time, for ever. Now the policy reassigns
// at most MaxAutoReassigns times in a row — a restart in between does not
// reset the count, which is stored with the lease — and the next missed
// ACK leaves the job EXPIRED, as policy expire would, with one row saying
// why; the job then waits for the coordinator, whose explicit reassignment
// starts a fresh run. Seen failing before the fix (the job was OFFERED as
// generation 9 after eight deadlines, two more rows each time).
func TestLeaseReassignPolicyStopsAfterItsBound(t *testing.T) {
	const max = 3
	dir := t.TempDir()
	clk := clock.NewManual(epoch)
	w := newReassignWorld(t, dir, clk, max)
	ctx := context.Background()

	pol, err := w.admin.Lease.GetPolicy(ctx, connect.NewRequest(&tetherv1.GetPolicyRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if p := pol.Msg.Policy; p.MaxAutoReassigns != max || !strings.HasPrefix(p.AckMissPolicy, "reassign") || !strings.Contains(p.AckMissPolicy, fmt.Sprintf("at most %d times", max)) {
		t.Fatalf("the published policy: max %d, %q", p.MaxAutoReassigns, p.AckMissPolicy)
	}

	job := w.job()
	if _, err := w.plannerC.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: w.w1,
		LeaseDuration: durationpb.New(time.Minute)})); err != nil {
		t.Fatal(err)
	}
	// The holder never ACKs. Eight deadlines pass; the server restarts
	// after the second.
	const deadlines = 8
	var l *tetherv1.Lease
	for i := 1; i <= deadlines; i++ {
		if l = w.get(t, job); l.State == tetherv1.LeaseState_LEASE_STATE_EXPIRED {
			clk.Advance(time.Hour) // nothing is due: nothing may happen
			continue
		}
		l = passAckDeadline(t, w, job)
		if i == 2 {
			w.srv.Stop()
			w.srv = testserver.StartIn(t, dir, testserver.WithClock(clk), reassignPolicy(max))
			w.admin = w.srv.AdminClients()
			if got := w.get(t, job); got.AutoReassigns != 2 || got.LeaseGeneration != 3 {
				t.Fatalf("after the restart: generation %d, %d automatic reassignments; want 3 and 2", got.LeaseGeneration, got.AutoReassigns)
			}
		}
	}
	l = w.get(t, job)
	if l.State != tetherv1.LeaseState_LEASE_STATE_EXPIRED || l.AckState != tetherv1.AckState_ACK_STATE_MISSED ||
		l.LeaseGeneration != max+1 || l.AutoReassigns != max || l.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_UNSPECIFIED {
		t.Fatalf("after %d missed deadlines: %s, ack %s, generation %d, %d automatic reassignments, result %s; want EXPIRED, MISSED, generation %d, %d, no result",
			deadlines, l.State, l.AckState, l.LeaseGeneration, l.AutoReassigns, l.TerminalResult, max+1, max)
	}
	// One row for the offer, a tick and a reassignment per automatic
	// reassignment, the restart's extension of the pending ACK deadline,
	// and one tick that says why no reassignment followed.
	ev := w.evidence(t, job)
	if want := 1 + 2*max + 1 + 1; len(ev) != want {
		for _, r := range ev {
			t.Logf("row %d %s %s %q", r.Row, r.Message, r.Decision.AuditEvent, r.Decision.Reason)
		}
		t.Fatalf("%d evidence rows, want %d", len(ev), want)
	}
	last := ev[len(ev)-1]
	if last.Message != "tick" || last.Decision.AuditEvent != tetherv1.AuditEvent_AUDIT_EVENT_ACK_DEADLINE_MISSED ||
		!strings.Contains(last.Decision.Reason, fmt.Sprintf("already reassigned automatically %d times in a row", max)) ||
		!strings.Contains(last.Decision.Reason, "stays EXPIRED until the coordinator reassigns or resolves it") {
		t.Fatalf("the last row does not say why the job stays expired: %s %s %q", last.Message, last.Decision.AuditEvent, last.Decision.Reason)
	}

	// The holder's late ACK revives nothing.
	a, err := w.srv.Clients(credentialOf(t, w.srv, w.w1)).Lease.Ack(ctx, connect.NewRequest(&tetherv1.AckRequest{JobId: job, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration}))
	if err != nil {
		t.Fatal(err)
	}
	wantDecision(t, "the late ACK", a.Msg.Decision, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_ACK_DEADLINE_MISSED)
	if got := w.get(t, job); got.State != tetherv1.LeaseState_LEASE_STATE_EXPIRED || got.LeaseGeneration != max+1 {
		t.Fatalf("after the late ACK: %s, generation %d", got.State, got.LeaseGeneration)
	}

	// The coordinator moves the job on; automatic reassignments start afresh.
	r := w.reassign(t, job, w.w1, time.Minute)
	if r.LeaseGeneration != max+2 || r.AutoReassigns != 0 {
		t.Fatalf("the explicit reassignment: generation %d, %d automatic reassignments", r.LeaseGeneration, r.AutoReassigns)
	}
	if l = passAckDeadline(t, w, job); l.LeaseGeneration != max+3 || l.AutoReassigns != 1 || l.State != tetherv1.LeaseState_LEASE_STATE_OFFERED {
		t.Fatalf("after the explicit reassignment's missed ACK: %s, generation %d, %d automatic reassignments", l.State, l.LeaseGeneration, l.AutoReassigns)
	}
}
