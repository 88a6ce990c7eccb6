package controlplane_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor"
)

// TestRogue40RDrainFollowerSurvivesAFailedTerminationWatch: an agent with
// a call in flight is drained (a day's window, a minute's confirmation
// wait); its signal stream follows the stop's deadline by the
// supervisor's shared termination watch. That watch then falls behind
// (a flood of termination writes, a rogue's own stops among them) and
// cannot be opened again at once (a store without a quorum): the
// following ends with the error. The call then ends, so does the drain,
// and the record waits a minute for the agent's exit, nothing written to
// its node. Before, the following was never started again and the agent
// was never told the minute (it planned the day, and was counted
// unaccounted); now it starts again after a backoff on the clock and
// sends the drain signal again with the confirmation deadline.
func TestRogue40RDrainFollowerSurvivesAFailedTerminationWatch(t *testing.T) {
	b, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	st := &laggingStore{Store: b}
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) { cfg.Store = st })
	admin := srv.AdminClients()
	root := register(t, admin, "worker")
	node := root.Node.NodeId
	grant := issueRoot(t, admin, node, time.Hour, "tool:*")
	tool := srv.Clients(srv.ToolServerToken(t, "resource-1"))
	// A bound so that a missing signal fails the test instead of hanging
	// it; nothing waits for it to pass.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	call, err := tool.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: grant.token, Tool: "shell", GateId: "resource-1"}))
	if err != nil {
		t.Fatal(err)
	}
	stream, err := srv.Clients(root.Credential).Agent.WatchSignals(ctx, connect.NewRequest(&tetherv1.WatchSignalsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	if !stream.Receive() || stream.Msg().GetOpened() == nil {
		t.Fatalf("first message %v (%v)", stream.Msg(), stream.Err())
	}

	term := terminate(t, admin, node, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, 24*time.Hour, time.Minute, time.Minute)
	sup := &supervisor.Supervisor{Store: b}
	var drain time.Time
	testserver.WaitFor(t, 20*time.Second, "the mark to set the drain deadline", func() bool {
		tm, err := sup.Get(ctx, term.TerminationId)
		if err != nil {
			t.Fatal(err)
		}
		drain = tm.DrainDeadline
		return !drain.IsZero()
	})
	for {
		sig := nextSignal(t, stream)
		if sig.Kind != tetherv1.SignalKind_SIGNAL_KIND_DRAIN || sig.TerminationId != term.TerminationId {
			t.Fatalf("pushed %v, want the drain of %s", sig, term.TerminationId)
		}
		if sig.GetDeadline() != nil && sig.GetDeadline().AsTime().Equal(drain) {
			break
		}
	}

	// The shared termination watch (the follower's) falls behind and
	// cannot be opened again.
	const start, reopen = "supervisor.(*terminationWatches).start", "supervisor.(*terminationWatches).follow"
	testserver.WaitFor(t, 20*time.Second, "the follower's termination watch", func() bool { return st.opened(start) > 0 })
	heal := st.fail(reopen, errors.New("rogue40r: the store could not open a watch"))
	if n := st.lag(start); n != 1 {
		t.Fatalf("lagged %d shared termination watches, want 1", n)
	}
	if _, err := tool.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: call.Msg.Call.CallId, GateId: "resource-1"})); err != nil {
		t.Fatal(err)
	}
	var confirm time.Time
	testserver.WaitFor(t, 20*time.Second, "the drain to end and the grants to be revoked", func() bool {
		tm, err := sup.Get(ctx, term.TerminationId)
		if err != nil {
			t.Fatal(err)
		}
		confirm = tm.ConfirmDeadline
		return tm.Phase == supervisor.PhaseReconciling && tm.Revoked
	})
	heal()
	// The following starts again after a second on the clock
	// (reconcile.Passes' first backoff): the clock moves once that retry
	// is armed. Before the fix nothing was armed: the following had ended.
	retry := clk.Now().Add(time.Second)
	testserver.WaitFor(t, 20*time.Second, "the drain follower to arm its retry", func() bool { return clk.Armed(retry) })
	clk.Advance(time.Second)
	sig := nextSignal(t, stream)
	if sig.Kind != tetherv1.SignalKind_SIGNAL_KIND_DRAIN || sig.TerminationId != term.TerminationId || sig.GetDeadline() == nil || !sig.GetDeadline().AsTime().Equal(confirm) {
		t.Fatalf("pushed %v, want the drain of %s again with the confirmation deadline %v", sig, term.TerminationId, confirm)
	}
}
