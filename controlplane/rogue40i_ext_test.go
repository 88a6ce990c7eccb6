package controlplane_test

import (
	"bytes"
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// revokeCommitHoldingStore is the server's real store (Badger, or etcd),
// which holds open the transaction of a termination's revocation that
// records it revoked (the chunk's commit: the termination's "revoked"
// written from Supervisor.revoke) until the server stops, and so never
// commits it: the control plane stopped after the chunk's privilege
// revocations began and before the chunk committed. Everything else is
// the store's, unchanged.
type revokeCommitHoldingStore struct {
	store.Store
	held     chan struct{} // closed when the commit is held
	heldOnce sync.Once
}

type revokeCommitTxn struct {
	store.Txn
	commit *bool
}

func (x revokeCommitTxn) Put(key, value []byte) error {
	if bytes.HasPrefix(key, []byte("terminations/")) && bytes.Contains(value, []byte(`"revoked":true`)) {
		*x.commit = true
	}
	return x.Txn.Put(key, value)
}

func (s *revokeCommitHoldingStore) Update(ctx context.Context, fn func(tx store.Txn) error) error {
	if !strings.Contains(openerStack(), "supervisor.(*Supervisor).revoke") {
		return s.Store.Update(ctx, fn)
	}
	return s.Store.Update(ctx, func(tx store.Txn) error {
		commit := false
		if err := fn(revokeCommitTxn{Txn: tx, commit: &commit}); err != nil || !commit {
			return err
		}
		s.heldOnce.Do(func() { close(s.held) })
		<-ctx.Done()
		return ctx.Err()
	})
}

// rogue40IRestartBeforeTheChunkCommits: a rogue registers a privilege
// declared to expire within the hook window, behind a hook that hangs; its
// termination's revocation chunk starts the hook's call, and the control
// plane stops before that chunk commits. It starts again on the same data
// once the declared expiry passed, before the hook deadline. It returns the
// restarted server, its clock, the termination, the rogue's node and the
// declared expiry; down runs while the control plane is down.
func rogue40IRestartBeforeTheChunkCommits(t *testing.T, hook *restartHook, down func()) (*testserver.Server, *clock.Manual, string, string, time.Time) {
	t.Helper()
	clk := clock.NewManual(epoch)
	dir := t.TempDir()
	st := &revokeCommitHoldingStore{held: make(chan struct{})}
	var own store.Store // Badger, opened here; an etcd store is the test server's
	srv := testserver.StartIn(t, dir, testserver.WithClock(clk), testserver.AllowPrivilegeHooks("127.0.0.1"), func(cfg *controlplane.Config) {
		if cfg.Store == nil {
			b, err := badgerstore.OpenBadger(filepath.Join(dir, "store"), badgerstore.BadgerOptions{})
			if err != nil {
				t.Fatal(err)
			}
			own, cfg.Store = b, b
		}
		st.Store, cfg.Store = cfg.Store, st
	})
	admin := srv.AdminClients()
	rogue := register(t, admin, "rogue")
	expires := clk.Now().Add(controlplaneHookTimeout / 2)
	if err := registerPrivilege(context.Background(), srv.Clients(rogue.Credential), rogue.Node.NodeId, "lock-short", hook.URL+"/revoke", expires); err != nil {
		t.Fatal(err)
	}
	term := terminate(t, admin, rogue.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 0, 0)
	testserver.WaitFor(t, 10*time.Second, "the hook called while the privilege is live", func() bool { return hook.calls.Load() == 1 })
	select {
	case <-st.held:
	case <-time.After(time.Minute):
		t.Fatal("the revocation chunk never reached its commit")
	}
	srv.Stop()
	if own != nil {
		if err := own.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// The control plane is down while the declared expiry passes, and
	// starts again before the hook deadline.
	clk.Advance(controlplaneHookTimeout/2 + time.Second)
	if down != nil {
		down()
	}
	return testserver.StartIn(t, dir, testserver.WithClock(clk), testserver.AllowPrivilegeHooks("127.0.0.1")), clk, term.TerminationId, rogue.Node.NodeId, expires
}

// TestRogue40IAHungHookIsNotRecordedExpiredAfterARestartBeforeItsChunkCommits:
// the privilege's revocation began (its hook called) while it was live;
// the restarted control plane, running the uncommitted chunk again, calls
// the hook again and, the hook hanging still, records the privilege
// revoke_failed at the hook deadline, not expired on the rogue's word.
func TestRogue40IAHungHookIsNotRecordedExpiredAfterARestartBeforeItsChunkCommits(t *testing.T) {
	hook := newRestartHook(t)
	again, clk, termID, node, expires := rogue40IRestartBeforeTheChunkCommits(t, hook, nil)
	testserver.WaitFor(t, 10*time.Second, "the restarted control plane to decide the privilege or call its hook again", func() bool {
		if hook.calls.Load() >= 2 {
			return true
		}
		list, err := again.AdminClients().Supervisor.ListPrivileges(context.Background(), connect.NewRequest(&tetherv1.ListPrivilegesRequest{NodeId: node}))
		return err == nil && len(list.Msg.Privileges) == 1 && list.Msg.Privileges[0].Outcome != tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_UNSPECIFIED
	})
	clk.Advance(controlplaneHookTimeout + time.Second)
	done := waitState(t, again, termID, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	p, ok := privilegeOutcomes(record(t, again.AdminClients(), done.TerminationId))["lock-short"]
	if !ok {
		t.Fatal("the record does not list the rogue's privilege")
	}
	if p.Outcome != tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_REVOKE_FAILED || !strings.Contains(p.Error, "deadline") {
		t.Fatalf("a privilege whose hook hung across a restart before its chunk committed reads %s %q (hook called %d times): want revoke_failed at the hook deadline, not the rogue's declared expiry", p.Outcome, p.Error, hook.calls.Load())
	}
	if !p.ExpiresAt.AsTime().Equal(expires) {
		t.Fatalf("the record's expiry %s, want the declared %s", p.ExpiresAt.AsTime(), expires)
	}
}

// TestRogue40IAHookAnsweringAfterARestartBeforeItsChunkCommitsIsRevoked:
// the honest side of it: the hook, called again by the restarted control
// plane, answers, and the record reads revoked.
func TestRogue40IAHookAnsweringAfterARestartBeforeItsChunkCommitsIsRevoked(t *testing.T) {
	hook := newRestartHook(t)
	again, _, termID, _, _ := rogue40IRestartBeforeTheChunkCommits(t, hook, func() { hook.answer.Store(http.StatusNoContent) })
	done := waitState(t, again, termID, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	p, ok := privilegeOutcomes(record(t, again.AdminClients(), done.TerminationId))["lock-short"]
	if !ok {
		t.Fatal("the record does not list the privilege")
	}
	if p.Outcome != tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_REVOKED || hook.calls.Load() != 2 {
		t.Fatalf("a hook that answers when called again after the restart: privilege %s %q, hook called %d times; want revoked by the second call", p.Outcome, p.Error, hook.calls.Load())
	}
}
