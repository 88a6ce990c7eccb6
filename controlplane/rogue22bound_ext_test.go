package controlplane_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue22ARogueCannotHoldTheOperatorToItsLineagesBound: the bound on a
// lineage's open leases (--lease-max-open-per-lineage) held every offer
// and reassignment to an agent of the lineage, an operator's too. A rogue
// offered its own child as many jobs as the lineage may hold open and had
// it never acknowledge them: past their ACK deadlines the leases are
// expired, still open (an expired generation is never revived; the job
// ends only by a reassignment or a resolution, and until then it is the
// server's memory and a cancel and a resolution in its holder's stop), so
// they still count — and every offer to the lineage's honest agents was
// refused resource_exhausted, the operator's included: 8 of 8 places
// taken, the operator's offer refused. An operator's offer or
// reassignment is now held to the bound per holder only (its lease still
// counts in the lineage's): a rogue can fill its lineage's share for its
// lineage's agents, not lock its operators out. Its ancestors can free
// the places (stop it: its subtree's leases end with the stop). (Fails if
// the operator's offer is refused, or if an operator may give one holder
// more than its bound.)
func TestRogue22ARogueCannotHoldTheOperatorToItsLineagesBound(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.StartIn(t, t.TempDir(), testserver.WithClock(clk), func(cfg *controlplane.Config) {
		cfg.LeaseMaxOpenPerHolder = 8
		// The lineage's bound counts the leases each agent holds past its
		// own controlplane.LeaseReservePerNode (rogue24bound): the kid's 8
		// fill it.
		cfg.LeaseMaxOpenPerLineage = 8 - controlplane.LeaseReservePerNode
	})
	admin := srv.AdminClients()
	bg := context.Background()
	root := register(t, admin, "ops")
	rootC := srv.Clients(root.Credential)
	rogueNode := spawn(t, rootC, root.Node.NodeId, "rogue")
	honest := spawn(t, rootC, root.Node.NodeId, "honest")
	rogue := srv.Clients(rogueNode.Credential)
	kid := spawn(t, rogue, rogueNode.Node.NodeId, "kid")
	for i := range 8 {
		if _, err := offerTo(rogue, kid.Node.NodeId, fmt.Sprintf("r22-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	clk.Advance(time.Minute) // never acknowledged: the offers' ACK deadlines (10 s) pass
	testserver.WaitFor(t, 30*time.Second, "the unacknowledged offers to expire", func() bool {
		r, err := admin.Lease.GetLease(bg, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: "r22-7"}))
		return err == nil && r.Msg.Lease.State == tetherv1.LeaseState_LEASE_STATE_EXPIRED
	})

	// The lineage's agents share its bound past their own shares: the
	// honest parent's offers take the honest agent's own share, and the
	// next is refused, saying so.
	for i := range controlplane.LeaseReservePerNode {
		if _, err := offerTo(rootC, honest.Node.NodeId, fmt.Sprintf("r22-own-%d", i)); err != nil {
			t.Fatalf("the parent's offer %d to the honest agent, within its own share: %v", i, err)
		}
	}
	_, err := offerTo(rootC, honest.Node.NodeId, "r22-from-the-parent")
	refusedForTooMany(t, err, "lineage")
	// The operator's is not.
	if _, err := offerTo(admin, honest.Node.NodeId, "r22-from-the-operator"); err != nil {
		t.Fatalf("an operator's offer to an honest agent of a lineage a rogue filled: %v, want it accepted", err)
	}
	// Nor its reassignment of one of the rogue's expired jobs.
	if _, err := admin.Lease.Reassign(bg, connect.NewRequest(&tetherv1.ReassignRequest{JobId: "r22-0", HolderIdentity: honest.Node.NodeId})); err != nil {
		t.Fatalf("an operator's reassignment to an honest agent of a lineage a rogue filled: %v, want it accepted", err)
	}
	// The bound per holder still holds an operator: the kid holds 7 open
	// leases, the operator may give it one more, not two.
	if _, err := offerTo(admin, kid.Node.NodeId, "r22-operator-to-kid-1"); err != nil {
		t.Fatalf("the operator's offer of the kid's eighth open lease: %v, want it accepted", err)
	}
	_, err = offerTo(admin, kid.Node.NodeId, "r22-operator-to-kid-2")
	refusedForTooMany(t, err, kid.Node.NodeId)

	// The honest parent frees its lineage by stopping the rogue: the
	// rogue's subtree's leases end with the stop.
	term, err := rootC.Supervisor.Terminate(bg, connect.NewRequest(&tetherv1.TerminateRequest{NodeId: rogueNode.Node.NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT, Reason: "it filled the lineage"}))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{rogueNode.Node.NodeId, kid.Node.NodeId} {
		if _, err := rootC.Agent.ConfirmExit(bg, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: n})); err != nil {
			t.Fatal(err)
		}
	}
	waitState(t, srv, term.Msg.Termination.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	testserver.WaitFor(t, 30*time.Second, "the parent's offer to be accepted once the rogue is stopped", func() bool {
		_, err := offerTo(rootC, honest.Node.NodeId, "r22-from-the-parent")
		return err == nil
	})
}
