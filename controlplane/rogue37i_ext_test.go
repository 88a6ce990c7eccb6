package controlplane_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue37IAHungHookIsNotRecordedExpiredOnTheRoguesWord plays a rogue
// that registers a privilege declared to expire a few seconds after its
// stop begins, behind a revoke hook that never answers. The control plane
// called the hook while the privilege was live and heard nothing: the
// record must say so (revoke_failed at the hook deadline), not read
// "expired" on the rogue's own declaration, and the termination waits
// for the hook as for any other, up to its deadline.
func TestRogue37IAHungHookIsNotRecordedExpiredOnTheRoguesWord(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), testserver.AllowPrivilegeHooks("127.0.0.1"))
	admin := srv.AdminClients()
	ctx := context.Background()
	hook := newHangingHook(t)
	rogue := register(t, admin, "rogue")
	expires := clk.Now().Add(controlplaneHookTimeout / 2)
	if err := registerPrivilege(ctx, srv.Clients(rogue.Credential), rogue.Node.NodeId, "lock-short", hook.URL+"/revoke", expires); err != nil {
		t.Fatal(err)
	}
	term := terminate(t, admin, rogue.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 0, 0)
	testserver.WaitFor(t, 10*time.Second, "the hook called while the privilege is live", func() bool {
		return hook.calls.Load() == 1
	})
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	// The declared expiry passes, the hook still hanging...
	clk.Advance(controlplaneHookTimeout/2 + time.Second)
	// ...and then the hook deadline.
	clk.Advance(controlplaneHookTimeout)
	done := waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	p, ok := privilegeOutcomes(record(t, admin, done.TerminationId))["lock-short"]
	if !ok {
		t.Fatal("the record does not list the rogue's privilege")
	}
	if p.Outcome != tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_REVOKE_FAILED || !strings.Contains(p.Error, "deadline") {
		t.Fatalf("a privilege whose revoke hook was called while it was live and never answered reads %s %q: want revoke_failed at the hook deadline, not the rogue's declared expiry", p.Outcome, p.Error)
	}
	if !p.ExpiresAt.AsTime().Equal(expires) {
		t.Fatalf("the record's expiry %s, want the declared %s", p.ExpiresAt.AsTime(), expires)
	}
}
