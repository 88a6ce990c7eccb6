package controlplane_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/privilege"
)

// TestRogue43JRecordTellsAHookNeverCalledFromOneThatDidNotAnswer plays a
// rogue agent that spawns as many children as a termination calls revoke
// hooks at once (privilege.DefaultHookConcurrency), each registering a
// privilege behind a hook that never answers, and one child more, a rogue
// too, that registers its own hung privilege and spawns an honest agent,
// whose privilege's hook answers at once. The queue takes the branches of
// the rogue's node in turn (treeBranch): the first round is the 33 hung
// privileges, the honest agent's comes in the second, and the rogue's
// hooks hold every slot until the hook deadline (design §11: a rogue
// ancestor decides the branches beside the honest agent). The honest
// agent's hook is never called. The record read its privilege
// revoke_failed "no answer within the deadline" — the words of the
// rogue's hooks that were called and kept silent: the security team,
// reading it, would blame the honest agent's hook server for a call the
// control plane never made. The record now says its hook was never
// called, and still reads "no answer" for a hook called and silent.
func TestRogue43JRecordTellsAHookNeverCalledFromOneThatDidNotAnswer(t *testing.T) {
	r := newHungHookRogue(t)
	clk, srv, admin, hung, answering, rogue := r.clk, r.srv, r.admin, r.hung, r.answering, r.rogue
	ctx := context.Background()
	const hooks = privilege.DefaultHookConcurrency
	r.spawnHungHands(t, ctx)
	team := spawn(t, srv.Clients(rogue.Credential), rogue.Node.NodeId, "team")
	if err := registerPrivilege(ctx, srv.Clients(team.Credential), team.Node.NodeId, "team-lock", hung.URL+"/revoke", clk.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	honest := spawn(t, srv.Clients(team.Credential), team.Node.NodeId, "honest")
	if err := registerPrivilege(ctx, srv.Clients(honest.Credential), honest.Node.NodeId, "honest-lock", answering.URL+"/revoke", clk.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}

	term, called := r.stopWithSlotsTaken(t)
	if called != 0 {
		t.Fatalf("the honest agent's hook was called %d time(s) before the deadline: the rogue's %d hung hooks did not hold every slot, the test proves nothing", called, hooks)
	}
	clk.Advance(controlplaneHookTimeout + time.Second)
	done := waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	outcomes := privilegeOutcomes(record(t, admin, done.TerminationId))
	p, ok := outcomes["honest-lock"]
	if !ok {
		t.Fatal("the record does not list the honest agent's privilege")
	}
	t.Logf("the honest agent's hook called %d time(s); its privilege %s %q", answering.calls.Load(), p.Outcome, p.Error)
	if p.Outcome != tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_REVOKE_FAILED {
		t.Fatalf("the honest agent's privilege, its hook never called, reads %s", p.Outcome)
	}
	if !strings.Contains(p.Error, "never called") || strings.Contains(p.Error, "no answer") {
		t.Fatalf("the honest agent's privilege, its hook never called, reads %q: the record says the hook was called and did not answer", p.Error)
	}
	// The rogue's hooks: 32 of its 33 were called and kept silent ("no
	// answer"); the one the slots left (whichever it was) never called.
	silent, uncalled := 0, 0
	for _, name := range append(lockNames(hooks), "team-lock") {
		r := outcomes[name]
		if r == nil || r.Outcome != tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_REVOKE_FAILED {
			t.Fatalf("the rogue's %s reads %v", name, r)
		}
		switch {
		case strings.Contains(r.Error, "never called"):
			uncalled++
		case strings.Contains(r.Error, "no answer"):
			silent++
		}
	}
	if silent != hooks || uncalled != 1 || hung.calls.Load() != hooks {
		t.Fatalf("%d of the rogue's %d hung hooks read \"no answer\", %d \"never called\" (%d called)", silent, hooks+1, uncalled, hung.calls.Load())
	}
}

// lockNames names the rogue's children's privileges, lock-0 to lock-(n-1).
func lockNames(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("lock-%d", i)
	}
	return names
}
