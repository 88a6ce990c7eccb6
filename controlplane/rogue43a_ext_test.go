package controlplane_test

import (
	"context"
	"testing"
	"time"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/privilege"
)

// TestRogue43AHonestAgentsPrivilegeIsNotQueuedBehindARoguesHungHooks plays
// a rogue agent under an operator's tree that spawns as many children as a
// termination calls revoke hooks at once (privilege.DefaultHookConcurrency),
// each registering a privilege of its own behind a hook that never
// answers, and one more on its own node. An honest agent elsewhere in the
// tree registered its own privilege (a lock behind its answering hook).
// The operator stops the tree: the honest agent's privilege came after the
// rogue's children in the revocation's queue (the nodes in turn, in the
// mark's order), waited for a slot the rogue's hooks held until the hook
// deadline, and was never called — left live, the record reading
// revoke_failed "no answer within the deadline" for a hook nobody called.
// The agents' privileges are now queued by the tree, each branch in turn
// at every level: the rogue's whole subtree is one branch beside the
// honest agent's, however many children it spawns.
func TestRogue43AHonestAgentsPrivilegeIsNotQueuedBehindARoguesHungHooks(t *testing.T) {
	r := newHungHookRogue(t)
	clk, srv, admin, hung, rogue := r.clk, r.srv, r.admin, r.hung, r.rogue
	ctx := context.Background()
	honest := r.honestBranch(t)
	if err := registerPrivilege(ctx, srv.Clients(honest.Credential), honest.Node.NodeId, "file-lock", r.answering.URL+"/revoke", clk.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := registerPrivilege(ctx, srv.Clients(rogue.Credential), rogue.Node.NodeId, "lock-own", hung.URL+"/revoke", clk.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	const hooks = privilege.DefaultHookConcurrency
	r.spawnHungHands(t, ctx)

	// Every slot is taken: the rogue's hooks hang in as many as there are
	// (with the honest agent's privilege called among the first, in all
	// but one).
	term, called := r.stopWithSlotsTaken(t)
	clk.Advance(controlplaneHookTimeout + time.Second)
	done := waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	p, ok := privilegeOutcomes(record(t, admin, done.TerminationId))["file-lock"]
	if !ok {
		t.Fatal("the record does not list the honest agent's privilege")
	}
	t.Logf("the honest agent's hook called %d time(s) before the deadline; the rogue's hung hooks called %d times; its privilege %s %q",
		called, hung.calls.Load(), p.Outcome, p.Error)
	if called == 0 || p.Outcome != tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_REVOKED {
		t.Fatalf("the honest agent's own privilege reads %s %q, its hook called %d times before the deadline: a rogue's %d hung hooks kept it from being called",
			p.Outcome, p.Error, called, hooks+1)
	}
}
