package controlplane_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// hangingHook is a revoke webhook that never answers until the test ends
// (or the caller gives up): it counts the calls that reached it.
type hangingHook struct {
	*httptest.Server
	calls atomic.Int32
}

func newHangingHook(t *testing.T) *hangingHook {
	t.Helper()
	h := &hangingHook{}
	release := make(chan struct{})
	h.Server = httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		h.calls.Add(1)
		select {
		case <-release:
		case <-r.Context().Done():
		}
		rw.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(func() { close(release); h.Close() })
	return h
}

func registerPrivilege(ctx context.Context, c *testserver.Clients, node, kind, url string, expires time.Time) error {
	_, err := c.Supervisor.RegisterPrivilege(ctx, connect.NewRequest(&tetherv1.RegisterPrivilegeRequest{
		NodeId: node, Kind: kind, ExternalId: kind + "-1", ExpiresAt: timestamppb.New(expires), RevokeUrl: url,
	}))
	return err
}

func privilegeOutcomes(rec *tetherv1.ReconciliationRecord) map[string]*tetherv1.RecordPrivilege {
	out := map[string]*tetherv1.RecordPrivilege{}
	for _, p := range rec.Privileges {
		if p.Kind != "grant" {
			out[p.Kind] = p
		}
	}
	return out
}

// TestHangingHooksOfOneAgentDelayNoOtherTermination plays a rogue agent
// that registers a dozen revoke webhooks that never answer. They are
// called in parallel, off the reconciler's path: an unrelated operator
// abort completes while they hang (the clock never moves), and the rogue's
// own record is written at its hook deadline with every hook revoke_failed.
func TestHangingHooksOfOneAgentDelayNoOtherTermination(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), testserver.AllowPrivilegeHooks("127.0.0.1"))
	admin := srv.AdminClients()
	ctx := context.Background()
	hook := newHangingHook(t)
	rogue := register(t, admin, "rogue")
	bystander := register(t, admin, "bystander")
	const hooks = 12
	for i := range hooks {
		kind := "lock-" + string(rune('a'+i))
		if err := registerPrivilege(ctx, srv.Clients(rogue.Credential), rogue.Node.NodeId, kind, hook.URL+"/revoke", clk.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	rogueTerm := terminate(t, admin, rogue.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 0, 0)
	testserver.WaitFor(t, 10*time.Second, "every hook called at once (in parallel)", func() bool {
		return hook.calls.Load() == hooks
	})
	// The hooks are called as the revocation's chunk runs, and the
	// termination enters reconciling when that chunk commits: it gets
	// there with every hook still hanging and the clock standing still.
	waitState(t, srv, rogueTerm.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	// An unrelated operator abort is not delayed: it completes with the
	// clock standing still while the rogue's hooks hang.
	other := terminate(t, admin, bystander.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 0, 0)
	waitState(t, srv, other.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	if st := getTermination(t, admin, rogueTerm.TerminationId).State; st != tetherv1.TerminationState_TERMINATION_STATE_RECONCILING {
		t.Fatalf("the rogue's termination is %s before its hook deadline", st)
	}
	// The deadline passes on the control plane's clock: revoke_failed.
	clk.Advance(controlplaneHookTimeout + time.Second)
	done := waitState(t, srv, rogueTerm.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	privs := privilegeOutcomes(record(t, admin, done.TerminationId))
	if len(privs) != hooks {
		t.Fatalf("record lists %d privileges, want %d", len(privs), hooks)
	}
	for kind, p := range privs {
		if p.Outcome != tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_REVOKE_FAILED || !strings.Contains(p.Error, "deadline") {
			t.Fatalf("privilege %s: %s %q, want revoke_failed at the deadline", kind, p.Outcome, p.Error)
		}
	}
}

// controlplaneHookTimeout is the default hook deadline (serve
// --privilege-hook-timeout).
const controlplaneHookTimeout = 10 * time.Second

// TestRevokeHooksOutsideTheAllowListAreRefused: by default no destination
// is allowed; with an allow-list, only its hosts and URL prefixes are, at a
// path boundary. A refusal names the flag, never the URL's secrets, and
// stores nothing.
func TestRevokeHooksOutsideTheAllowListAreRefused(t *testing.T) {
	ctx := context.Background()
	t.Run("default", func(t *testing.T) {
		srv := testserver.Start(t)
		agent := register(t, srv.AdminClients(), "agent")
		err := registerPrivilege(ctx, srv.Clients(agent.Credential), agent.Node.NodeId, "lock", "https://hooks.example/revoke?token=s3cret", time.Now().Add(time.Hour))
		if connect.CodeOf(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), "--privilege-hook-allow") || strings.Contains(err.Error(), "s3cret") {
			t.Fatalf("a hook with no allow-list: %v, want permission_denied naming the flag and not the URL's secret", err)
		}
		term := terminate(t, srv.AdminClients(), agent.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 0, 0)
		waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
		if privs := privilegeOutcomes(record(t, srv.AdminClients(), term.TerminationId)); len(privs) != 0 {
			t.Fatalf("a refused registration left privileges %v", privs)
		}
	})
	t.Run("allow-list", func(t *testing.T) {
		srv := testserver.Start(t, testserver.AllowPrivilegeHooks("hooks.example:8443", "https://revoke.example/v1/"))
		agent := register(t, srv.AdminClients(), "agent")
		c := srv.Clients(agent.Credential)
		for _, tc := range []struct {
			url  string
			want connect.Code
		}{
			{"https://hooks.example:8443/anything", 0},
			{"https://hooks.example/anything", connect.CodePermissionDenied}, // another port
			{"https://revoke.example/v1/lock", 0},
			{"https://revoke.example/v1", 0},
			{"https://revoke.example/v10/lock", connect.CodePermissionDenied},
			{"https://revoke.example.evil.io/v1/lock", connect.CodePermissionDenied},
			{"http://revoke.example/v1/lock", connect.CodePermissionDenied}, // another scheme
			{"https://user:pw@revoke.example/v1/lock", connect.CodeInvalidArgument},
			{"ftp://revoke.example/v1/lock", connect.CodeInvalidArgument},
		} {
			err := registerPrivilege(ctx, c, agent.Node.NodeId, "lock", tc.url, time.Now().Add(time.Hour))
			if connect.CodeOf(err) != tc.want && !(tc.want == 0 && err == nil) {
				t.Errorf("%s: %v, want %v", tc.url, err, tc.want)
			}
		}
	})
}

// TestPrivilegesPerNodeAreCapped: one agent cannot register thousands of
// privileges; expired ones free their place.
func TestPrivilegesPerNodeAreCapped(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), testserver.AllowPrivilegeHooks("127.0.0.1"),
		func(cfg *controlplane.Config) { cfg.PrivilegeMaxPerNode = 3 })
	agent := register(t, srv.AdminClients(), "agent")
	c := srv.Clients(agent.Credential)
	ctx := context.Background()
	for i := range 3 {
		if err := registerPrivilege(ctx, c, agent.Node.NodeId, "lock", "http://127.0.0.1:1/revoke", clk.Now().Add(time.Duration(i+1)*time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	err := registerPrivilege(ctx, c, agent.Node.NodeId, "lock", "http://127.0.0.1:1/revoke", clk.Now().Add(time.Hour))
	if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "--privilege-max-per-node") {
		t.Fatalf("a fourth privilege: %v, want resource_exhausted naming the flag", err)
	}
	clk.Advance(90 * time.Second) // the first has expired
	if err := registerPrivilege(ctx, c, agent.Node.NodeId, "lock", "http://127.0.0.1:1/revoke", clk.Now().Add(time.Hour)); err != nil {
		t.Fatalf("after one expired: %v", err)
	}
}

// TestRevokeHooksDoNotFollowRedirects: a hook that answers with a redirect
// (towards a destination the operator never allowed) is revoke_failed, and
// the redirect's target is never called.
func TestRevokeHooksDoNotFollowRedirects(t *testing.T) {
	var reached atomic.Int32
	target := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		reached.Add(1)
		rw.WriteHeader(http.StatusNoContent)
	}))
	defer target.Close()
	redirecting := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		http.Redirect(rw, r, target.URL+"/steal", http.StatusTemporaryRedirect)
	}))
	defer redirecting.Close()
	clk := clock.NewManual(epoch)
	// Only the redirecting server's address is allowed.
	srv := testserver.Start(t, testserver.WithClock(clk), testserver.AllowPrivilegeHooks(strings.TrimPrefix(redirecting.URL, "http://")))
	admin := srv.AdminClients()
	agent := register(t, admin, "agent")
	if err := registerPrivilege(context.Background(), srv.Clients(agent.Credential), agent.Node.NodeId, "lock", redirecting.URL+"/revoke", clk.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	term := terminate(t, admin, agent.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 0, 0)
	rec := record(t, admin, waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED).TerminationId)
	p := privilegeOutcomes(rec)["lock"]
	if p == nil || p.Outcome != tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_REVOKE_FAILED || !strings.Contains(p.Error, "redirect") {
		t.Fatalf("privilege behind a redirect: %v, want revoke_failed naming the redirect", p)
	}
	if reached.Load() != 0 {
		t.Fatal("the redirect was followed")
	}
}

// TestAHookInterruptedByARestartIsCalledAgain: the server stops while a
// hook hangs (its outcome undecided, nothing persisted); restarted on the
// same data directory, the reconciler calls it again, and the answer it
// then gives is the record's.
func TestAHookInterruptedByARestartIsCalledAgain(t *testing.T) {
	var answer atomic.Int32 // 0: hang; otherwise the status to answer
	var calls atomic.Int32
	release := make(chan struct{})
	hook := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if code := answer.Load(); code != 0 {
			rw.WriteHeader(int(code))
			return
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer hook.Close()
	defer close(release)
	clk := clock.NewManual(epoch)
	dir := t.TempDir()
	srv := testserver.StartIn(t, dir, testserver.WithClock(clk), testserver.AllowPrivilegeHooks("127.0.0.1"))
	admin := srv.AdminClients()
	agent := register(t, admin, "agent")
	if err := registerPrivilege(context.Background(), srv.Clients(agent.Credential), agent.Node.NodeId, "lock", hook.URL+"/revoke", clk.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	term := terminate(t, admin, agent.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 0, 0)
	testserver.WaitFor(t, 10*time.Second, "the hook to be called", func() bool { return calls.Load() == 1 })
	srv.Stop()

	answer.Store(http.StatusNoContent)
	again := testserver.StartIn(t, dir, testserver.WithClock(clk), testserver.AllowPrivilegeHooks("127.0.0.1"))
	rec := record(t, again.AdminClients(), waitState(t, again, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED).TerminationId)
	if p := privilegeOutcomes(rec)["lock"]; p == nil || p.Outcome != tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_REVOKED || calls.Load() != 2 {
		t.Fatalf("after the restart: privilege %v, hook called %d times; want revoked by the second call", p, calls.Load())
	}
}
