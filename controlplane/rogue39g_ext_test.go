package controlplane_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// restartHook is a revoke webhook that hangs (until the test ends or the
// caller gives up) while answer is 0, and otherwise answers that status.
type restartHook struct {
	*httptest.Server
	answer atomic.Int32
	calls  atomic.Int32
}

func newRestartHook(t *testing.T) *restartHook {
	t.Helper()
	h := &restartHook{}
	release := make(chan struct{})
	h.Server = httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		h.calls.Add(1)
		if code := h.answer.Load(); code != 0 {
			rw.WriteHeader(int(code))
			return
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { close(release); h.Close() })
	return h
}

// rogue39GRestartPastTheExpiry: a rogue registers a privilege declared to
// expire within the hook window, behind a hook that hangs; the control
// plane stops while the hook hangs, and starts again on the same data once
// the declared expiry passed, before the hook deadline. It returns the
// restarted server, its clock, the termination and the rogue's declared
// expiry; down runs while the control plane is down.
func rogue39GRestartPastTheExpiry(t *testing.T, hook *restartHook, down func()) (*testserver.Server, *clock.Manual, string, time.Time) {
	t.Helper()
	clk := clock.NewManual(epoch)
	dir := t.TempDir()
	srv := testserver.StartIn(t, dir, testserver.WithClock(clk), testserver.AllowPrivilegeHooks("127.0.0.1"))
	admin := srv.AdminClients()
	rogue := register(t, admin, "rogue")
	expires := clk.Now().Add(controlplaneHookTimeout / 2)
	if err := registerPrivilege(context.Background(), srv.Clients(rogue.Credential), rogue.Node.NodeId, "lock-short", hook.URL+"/revoke", expires); err != nil {
		t.Fatal(err)
	}
	term := terminate(t, admin, rogue.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 0, 0)
	testserver.WaitFor(t, 10*time.Second, "the hook called while the privilege is live", func() bool { return hook.calls.Load() == 1 })
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	srv.Stop()
	// The control plane is down while the declared expiry passes, and
	// starts again before the hook deadline.
	clk.Advance(controlplaneHookTimeout/2 + time.Second)
	if down != nil {
		down()
	}
	return testserver.StartIn(t, dir, testserver.WithClock(clk), testserver.AllowPrivilegeHooks("127.0.0.1")), clk, term.TerminationId, expires
}

// TestRogue39GAHungHookIsNotRecordedExpiredAfterARestart: the
// restarted control plane calls the hook again (its revocation began while
// the privilege was live) and, the hook hanging still, records it
// revoke_failed at the hook deadline, not expired on the rogue's word.
func TestRogue39GAHungHookIsNotRecordedExpiredAfterARestart(t *testing.T) {
	hook := newRestartHook(t)
	again, clk, termID, expires := rogue39GRestartPastTheExpiry(t, hook, nil)
	testserver.WaitFor(t, 10*time.Second, "the restarted control plane to call the hook again", func() bool { return hook.calls.Load() >= 2 })
	clk.Advance(controlplaneHookTimeout)
	done := waitState(t, again, termID, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	p, ok := privilegeOutcomes(record(t, again.AdminClients(), done.TerminationId))["lock-short"]
	if !ok {
		t.Fatal("the record does not list the rogue's privilege")
	}
	if p.Outcome != tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_REVOKE_FAILED || !strings.Contains(p.Error, "deadline") {
		t.Fatalf("a privilege whose hook hung across a restart reads %s %q: want revoke_failed at the hook deadline, not the rogue's declared expiry", p.Outcome, p.Error)
	}
	if !p.ExpiresAt.AsTime().Equal(expires) {
		t.Fatalf("the record's expiry %s, want the declared %s", p.ExpiresAt.AsTime(), expires)
	}
}

// TestRogue39GAHookAnsweringAfterARestartPastTheExpiryIsRevoked: the
// honest side of it: the hook called again after the restart answers, and
// the record reads revoked.
func TestRogue39GAHookAnsweringAfterARestartPastTheExpiryIsRevoked(t *testing.T) {
	hook := newRestartHook(t)
	again, _, termID, _ := rogue39GRestartPastTheExpiry(t, hook, func() { hook.answer.Store(http.StatusNoContent) })
	done := waitState(t, again, termID, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	p, ok := privilegeOutcomes(record(t, again.AdminClients(), done.TerminationId))["lock-short"]
	if !ok {
		t.Fatal("the record does not list the privilege")
	}
	if p.Outcome != tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_REVOKED || hook.calls.Load() != 2 {
		t.Fatalf("a hook that answers when called again after the restart: privilege %s %q, hook called %d times; want revoked by the second call", p.Outcome, p.Error, hook.calls.Load())
	}
}
