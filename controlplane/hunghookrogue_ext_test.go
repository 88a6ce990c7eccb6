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

// hungHookRogue is the fixture of the privilege revocation tests
// (TestRogue43A*, TestRogue42D*, TestRogue43J*): a control plane on a
// manual clock that allows local revoke hooks, a hook that never answers
// (hung), one that answers at once (answering), an operator's root
// (planner) and a rogue agent spawned under it.
type hungHookRogue struct {
	clk       *clock.Manual
	srv       *testserver.Server
	admin     *testserver.Clients
	hung      *hangingHook
	answering *restartHook
	root      *tetherv1.RegisterRootResponse
	planner   *testserver.Clients
	rogue     *tetherv1.SpawnResponse
}

func newHungHookRogue(t *testing.T) *hungHookRogue {
	t.Helper()
	r := &hungHookRogue{clk: clock.NewManual(epoch)}
	r.srv = testserver.Start(t, testserver.WithClock(r.clk), testserver.AllowPrivilegeHooks("127.0.0.1"))
	r.admin = r.srv.AdminClients()
	r.hung = newHangingHook(t)
	r.answering = newRestartHook(t)
	r.answering.answer.Store(http.StatusNoContent)
	r.root = register(t, r.admin, "planner")
	r.planner = r.srv.Clients(r.root.Credential)
	r.rogue = spawn(t, r.planner, r.root.Node.NodeId, "rogue")
	return r
}

// honestBranch spawns branch → team → honest under the root, beside the
// rogue, and returns the honest agent.
func (r *hungHookRogue) honestBranch(t *testing.T) *tetherv1.SpawnResponse {
	t.Helper()
	branch := spawn(t, r.planner, r.root.Node.NodeId, "branch")
	team := spawn(t, r.srv.Clients(branch.Credential), branch.Node.NodeId, "team")
	return spawn(t, r.srv.Clients(team.Credential), team.Node.NodeId, "honest")
}

// spawnHungHands has the rogue spawn as many children as a termination
// calls revoke hooks at once (privilege.DefaultHookConcurrency), hand-0 to
// hand-(n-1), each registering a privilege lock-i behind the hung hook.
func (r *hungHookRogue) spawnHungHands(t *testing.T, ctx context.Context) {
	t.Helper()
	for i := range privilege.DefaultHookConcurrency {
		child := spawn(t, r.srv.Clients(r.rogue.Credential), r.rogue.Node.NodeId, fmt.Sprintf("hand-%d", i))
		if err := registerPrivilege(ctx, r.srv.Clients(child.Credential), child.Node.NodeId, fmt.Sprintf("lock-%d", i), r.hung.URL+"/revoke", r.clk.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
}

// stopWithSlotsTaken has the operator abort the root's tree, waits until
// every slot of the revocation is taken (the hooks of both kinds called
// privilege.DefaultHookConcurrency times) and the termination reconciling,
// and returns it with the answering hook's calls by then.
func (r *hungHookRogue) stopWithSlotsTaken(t *testing.T) (*tetherv1.Termination, int32) {
	t.Helper()
	term := terminate(t, r.admin, r.root.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 0, 0)
	testserver.WaitFor(t, 10*time.Second, "the revocation's slots taken", func() bool {
		return r.hung.calls.Load()+r.answering.calls.Load() >= privilege.DefaultHookConcurrency
	})
	waitState(t, r.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	return term, r.answering.calls.Load()
}
