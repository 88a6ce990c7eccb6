package controlplane_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// Under the ack-miss policy reassign, a holder being stopped (draining
// under a termination with a long window) and a holder that claimed its
// own exit each let an offer's ACK deadline pass. The coordinator's
// automatic reassignment went to the same holder without reading its node
// (docs/design.md §11 before the thirty-fifth pass): each was offered
// generation 2, and 3, up to --lease-max-auto-reassigns times, where an
// offer or reassignment sent to the API for it is refused. Now the
// reassignment is withheld — one REJECTED row naming the holder's state —
// and the job stays EXPIRED at generation 1 as the policy expire leaves
// it, until the coordinating lineage moves it on. A running holder's job
// is reassigned automatically as before.
func TestRogue35EAStoppingOrExitedHolderIsNotReassignedAutomatically(t *testing.T) {
	clk := clock.NewManual(epoch)
	// The termination holds after marking its node draining, before it
	// revokes (and asks the node's jobs to cancel): a job offered to the
	// node just before its stop, which the termination's cancel has not
	// reached, or an ancestor's stop not yet marked down to it.
	hold, srv := startMarkHeld(t, 1, testserver.WithClock(clk), reassignPolicy(3))
	w := &leaseWorld{srv: srv, clock: clk, admin: srv.AdminClients()}
	root := register(t, w.admin, "planner")
	w.planner, w.plannerC = root.Node.NodeId, srv.Clients(root.Credential)
	ctx := context.Background()
	a := spawn(t, w.plannerC, w.planner, "w1")
	w.w1, w.w1C = a.Node.NodeId, srv.Clients(a.Credential)
	b := spawn(t, w.plannerC, w.planner, "w2")
	w.w2, w.w2C = b.Node.NodeId, srv.Clients(b.Credential)
	c := spawn(t, w.plannerC, w.planner, "w3")
	w3 := c.Node.NodeId

	draining, exited, running := w.job(), w.job(), w.job()
	w.offer(t, draining, w.w1, time.Minute)
	w.offer(t, exited, w.w2, time.Minute)
	w.offer(t, running, w3, time.Minute)

	hold.arm()
	terminate(t, w.admin, w.w1, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Hour, time.Minute, time.Hour)
	<-hold.reached
	if _, err := w.w2C.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: w.w2, Reason: "done"})); err != nil {
		t.Fatal(err)
	}

	// The three offers share their ACK deadline.
	passAckDeadline(t, w, running)
	for _, tc := range []struct{ job, holder, state string }{
		{draining, w.w1, "is draining"},
		{exited, w.w2, "is exited"},
	} {
		var l *tetherv1.Lease
		testserver.WaitFor(t, 20*time.Second, "the missed ACK of "+tc.job, func() bool {
			l = w.get(t, tc.job)
			return l.State != tetherv1.LeaseState_LEASE_STATE_OFFERED || l.LeaseGeneration > 1
		})
		if l.State != tetherv1.LeaseState_LEASE_STATE_EXPIRED || l.LeaseGeneration != 1 || l.AutoReassigns != 0 || l.HolderIdentity != tc.holder {
			t.Fatalf("%s (holder %s): %s generation %d, %d automatic reassignments; want EXPIRED generation 1, none",
				tc.job, tc.state, l.State, l.LeaseGeneration, l.AutoReassigns)
		}
		var withheld []*tetherv1.EvidenceRow
		for _, r := range w.evidence(t, tc.job) {
			if r.Message == "reassign" {
				withheld = append(withheld, r)
			}
		}
		if len(withheld) != 1 || withheld[0].Decision.Outcome != tetherv1.Outcome_OUTCOME_REJECTED ||
			!strings.Contains(withheld[0].Decision.Reason, "withheld") || !strings.Contains(withheld[0].Decision.Reason, tc.state) {
			for _, r := range w.evidence(t, tc.job) {
				t.Logf("%s %s %q", r.Message, r.Decision.Outcome, r.Decision.Reason)
			}
			t.Fatalf("%s: want one withheld automatic reassignment naming that its holder %s", tc.job, tc.state)
		}
	}
	if l := w.get(t, running); l.State != tetherv1.LeaseState_LEASE_STATE_OFFERED || l.LeaseGeneration != 2 || l.AutoReassigns != 1 {
		t.Fatalf("the running holder's job: %s generation %d, %d automatic reassignments; want OFFERED generation 2, 1", l.State, l.LeaseGeneration, l.AutoReassigns)
	}
	// The lineage moves the stopping holder's job on.
	if l := w.reassign(t, draining, w3, time.Minute); l.LeaseGeneration != 2 || l.HolderIdentity != w3 {
		t.Fatalf("the explicit reassignment: generation %d to %s", l.LeaseGeneration, l.HolderIdentity)
	}
	hold.free()
}
