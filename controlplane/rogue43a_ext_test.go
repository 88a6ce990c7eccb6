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
	if err := registerPrivilege(ctx, srv.Clients(honest.Credential), honest.Node.NodeId, "file-lock", answering.URL+"/revoke", clk.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	rogueClients := srv.Clients(rogue.Credential)
	if err := registerPrivilege(ctx, rogueClients, rogue.Node.NodeId, "lock-own", hung.URL+"/revoke", clk.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	const hooks = privilege.DefaultHookConcurrency
	for i := range hooks {
		child := spawn(t, rogueClients, rogue.Node.NodeId, fmt.Sprintf("hand-%d", i))
		if err := registerPrivilege(ctx, srv.Clients(child.Credential), child.Node.NodeId, fmt.Sprintf("lock-%d", i), hung.URL+"/revoke", clk.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}

	term := terminate(t, admin, root.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 0, 0)
	// Every slot is taken: the rogue's hooks hang in as many as there are
	// (with the honest agent's privilege called among the first, in all
	// but one).
	testserver.WaitFor(t, 10*time.Second, "the revocation's slots taken", func() bool {
		return hung.calls.Load()+answering.calls.Load() >= hooks
	})
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	called := answering.calls.Load()
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
