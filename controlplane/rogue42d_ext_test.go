package controlplane_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
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
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), testserver.AllowPrivilegeHooks("127.0.0.1"))
	admin := srv.AdminClients()
	ctx := context.Background()
	hung := newHangingHook(t)
	answering := newRestartHook(t)
	answering.answer.Store(http.StatusNoContent)

	root := register(t, admin, "planner")
	planner := srv.Clients(root.Credential)
	rogue := spawn(t, planner, root.Node.NodeId, "rogue")
	branch := spawn(t, planner, root.Node.NodeId, "branch")
	team := spawn(t, srv.Clients(branch.Credential), branch.Node.NodeId, "team")
	honest := spawn(t, srv.Clients(team.Credential), team.Node.NodeId, "honest")
	if err := registerPrivilege(ctx, admin, honest.Node.NodeId, "cloud-credential", answering.URL+"/revoke", clk.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	const hooks = privilege.DefaultHookConcurrency
	for i := range hooks {
		child := spawn(t, srv.Clients(rogue.Credential), rogue.Node.NodeId, fmt.Sprintf("hand-%d", i))
		if err := registerPrivilege(ctx, srv.Clients(child.Credential), child.Node.NodeId, fmt.Sprintf("lock-%d", i), hung.URL+"/revoke", clk.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}

	term := terminate(t, admin, root.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 0, 0)
	// Every slot is taken: the rogue's hooks hang in as many as there are
	// (with the operator's privilege called first, in all but one).
	testserver.WaitFor(t, 10*time.Second, "the revocation's slots taken", func() bool {
		return hung.calls.Load()+answering.calls.Load() >= hooks
	})
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	called := answering.calls.Load()
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
