package agentsdk_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The thirty-sixth hostile pass on the agent SDKs' side of a stop. The Go
// SDK ran OnDrain's and OnAbort's callbacks on the session's receiving
// goroutine: a callback that waited (an honest agent's "finish what is in
// flight" in OnDrain, or its Exit there) held the session's reading, so
// the abort that escalated the drain was never read — the agent's context
// never ended and its work went on through the abort, to be cut off and
// recorded so — and neither were its refreshed credentials; an Exit
// called from OnDrain waited for the end of the session whose goroutine
// it held, for ever. The TypeScript SDK runs no callback that can wait
// (an async one's promise is not awaited), and the Python SDK sets its
// events before its callbacks and hears the abort by its heartbeat thread
// as well (their rogue36a tests).

// rogue36aAgent registers a root agent on a fresh control plane; its
// session runs until the test ends.
func rogue36aAgent(t *testing.T, name string) (*agentsdk.Agent, *agentsdk.Conn, func(func(*agentsdk.Agent))) {
	t.Helper()
	ctx := context.Background()
	srv := startEmbedded(t)
	operator := agentsdk.Dial(srv.URL, srv.AdminToken)
	a, err := agentsdk.RegisterRoot(ctx, operator, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	run := func(register func(*agentsdk.Agent)) {
		register(a)
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		t.Cleanup(func() { stop(); <-done })
		go func() { defer close(done); _ = a.Run(runCtx) }()
		<-a.Opened()
	}
	return a, operator, run
}

func rogue36aTerminate(t *testing.T, operator *agentsdk.Conn, node string, mode tetherv1.TerminationMode) {
	t.Helper()
	req := &tetherv1.TerminateRequest{NodeId: node, Mode: mode, Reason: "rogue36a"}
	if mode == tetherv1.TerminationMode_TERMINATION_MODE_DRAIN {
		req.DrainWindow = durationpb.New(time.Hour)
	}
	if _, err := operator.Supervisor.Terminate(context.Background(), connect.NewRequest(req)); err != nil {
		t.Fatal(err)
	}
}

// TestRogue36AnAbortReachesAnAgentWhoseDrainCallbackWaits: the agent's
// OnDrain waits for its work, which ends when the agent is aborted (its
// Context). An operator drains it, then aborts it: the abort must end the
// agent's context, and its OnAbort callbacks run, while OnDrain waits.
func TestRogue36AnAbortReachesAnAgentWhoseDrainCallbackWaits(t *testing.T) {
	a, operator, run := rogue36aAgent(t, "rogue36a-waiting-drain")
	inDrain := make(chan agentsdk.Signal, 1)
	aborted := make(chan agentsdk.Signal, 1)
	release := make(chan struct{}) // the test's end, should the abort never come
	run(func(a *agentsdk.Agent) {
		a.OnDrain(func(s agentsdk.Signal) {
			inDrain <- s
			select { // "finish what is in flight": the work stops on abort
			case <-a.Context().Done():
			case <-release:
			}
		})
		a.OnAbort(func(s agentsdk.Signal) { aborted <- s })
	})
	t.Cleanup(func() { close(release) }) // before the session's end is waited for
	rogue36aTerminate(t, operator, a.NodeID(), tetherv1.TerminationMode_TERMINATION_MODE_DRAIN)
	if s := <-inDrain; s.Abort {
		t.Fatalf("the first signal was %+v, want the drain", s)
	}
	rogue36aTerminate(t, operator, a.NodeID(), tetherv1.TerminationMode_TERMINATION_MODE_ABORT)
	select {
	case <-a.Context().Done():
	case <-time.After(20 * time.Second): // a guard against the hang, not a timing
		t.Fatal("the agent's context did not end on its abort: the session's reading was held by its waiting OnDrain callback")
	}
	if !errors.Is(context.Cause(a.Context()), agentsdk.ErrAborted) {
		t.Fatalf("the agent's context ended with %v, want ErrAborted", context.Cause(a.Context()))
	}
	select {
	case s := <-aborted:
		if !s.Abort {
			t.Fatalf("OnAbort was told %+v, want the abort", s)
		}
	case <-time.After(20 * time.Second): // a guard against the hang, not a timing
		t.Fatal("OnAbort was not called")
	}
}

// TestRogue36AnExitClaimedFromOnDrainIsStored: the agent claims its exit
// from its OnDrain callback (it had nothing in flight). Exit waited for
// the end of a session whose reading its own callback held: for ever.
func TestRogue36AnExitClaimedFromOnDrainIsStored(t *testing.T) {
	a, operator, run := rogue36aAgent(t, "rogue36a-exit-in-drain")
	exited := make(chan error, 1)
	run(func(a *agentsdk.Agent) {
		a.OnDrain(func(agentsdk.Signal) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // a guard against the hang, not a timing
			defer cancel()
			exited <- a.Exit(ctx, "drained, nothing in flight")
		})
	})
	rogue36aTerminate(t, operator, a.NodeID(), tetherv1.TerminationMode_TERMINATION_MODE_DRAIN)
	if err := <-exited; err != nil {
		t.Fatalf("Exit from OnDrain: %v, want the claim stored", err)
	}
	node, err := operator.Agent.GetNode(context.Background(), connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: a.NodeID()}))
	if err != nil {
		t.Fatal(err)
	}
	if node.Msg.Node.GetExitedAt() == nil {
		t.Fatalf("the node after its Exit: %v, want its exit claim stored", node.Msg.Node)
	}
}

// TestRogue36ACallbacksRegisteredAfterTheSignalRun: a child spawned just
// before its parent's stop joins into it: its session's first word is the
// signal, which can arrive before the agent registers its callbacks (once
// Opened, say). OnDrain and OnAbort registered after their signal never
// ran, and the agent never drained; the Python SDK runs them at once.
func TestRogue36ACallbacksRegisteredAfterTheSignalRun(t *testing.T) {
	a, operator, run := rogue36aAgent(t, "rogue36a-late-callbacks")
	run(func(*agentsdk.Agent) {})
	rogue36aTerminate(t, operator, a.NodeID(), tetherv1.TerminationMode_TERMINATION_MODE_ABORT)
	<-a.Context().Done()
	drained := make(chan agentsdk.Signal, 1)
	aborted := make(chan agentsdk.Signal, 1)
	a.OnDrain(func(s agentsdk.Signal) { drained <- s })
	a.OnAbort(func(s agentsdk.Signal) { aborted <- s })
	for name, ch := range map[string]chan agentsdk.Signal{"OnDrain": drained, "OnAbort": aborted} {
		select {
		case s := <-ch:
			if !s.Abort {
				t.Fatalf("%s registered after the abort was told %+v, want the abort", name, s)
			}
		case <-time.After(20 * time.Second): // a guard against the hang, not a timing
			t.Fatalf("%s registered after its signal arrived never ran", name)
		}
	}
}
