package controlplane_test

import (
	"context"
	"testing"
	"time"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/privilege"
)

// TestRogue42DRoguesHungHooksDoNotKeepTheOperatorsPrivilegeUnrevoked plays
// a rogue agent under an operator's tree that spawns as many children as a
// termination calls revoke hooks at once (privilege.DefaultHookConcurrency),
// each registering a privilege behind a hook that never answers. The
// operator stops the tree: its own privilege on an honest agent deeper in
// the tree (a cloud credential behind the operator's answering hook) came
// after the rogue's children in the revocation's queue, waited for a slot
// the rogue's hooks held until the hook deadline, and was never called —
// left live, the record reading revoke_failed "no answer". An operator's
// privilege is now called before any an agent registered: the rogue's
// hooks hold no slot it needs.
func TestRogue42DRoguesHungHooksDoNotKeepTheOperatorsPrivilegeUnrevoked(t *testing.T) {
	r := newHungHookRogue(t)
	clk, srv, admin, hung := r.clk, r.srv, r.admin, r.hung
	ctx := context.Background()
	honest := r.honestBranch(t)
	if err := registerPrivilege(ctx, admin, honest.Node.NodeId, "cloud-credential", r.answering.URL+"/revoke", clk.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	const hooks = privilege.DefaultHookConcurrency
	r.spawnHungHands(t, ctx)

	// Every slot is taken: the rogue's hooks hang in as many as there are
	// (with the operator's privilege called first, in all but one).
	term, called := r.stopWithSlotsTaken(t)
	clk.Advance(controlplaneHookTimeout + time.Second)
	done := waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	p, ok := privilegeOutcomes(record(t, admin, done.TerminationId))["cloud-credential"]
	if !ok {
		t.Fatal("the record does not list the operator's privilege")
	}
	t.Logf("the operator's hook called %d time(s) before the deadline; the rogue's hung hooks called %d times; the operator's privilege %s %q",
		called, hung.calls.Load(), p.Outcome, p.Error)
	if called == 0 || p.Outcome != tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_REVOKED {
		t.Fatalf("the operator's privilege on an honest agent reads %s %q, its hook called %d times before the deadline: a rogue's %d hung hooks kept it from being called",
			p.Outcome, p.Error, called, hooks)
	}
}
