package agentsdk_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane/embedded"
	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor"
)

// The thirty-seventh hostile pass on the agent SDKs' side of a stop.

// TestRogue37ACallbackRegisteredAsTheDrainArrivesRunsAfterDraining: an
// OnDrain registered at the instant the drain arrives (the SDK has noted
// the drain, not yet closed Draining) is one registered after its signal,
// and runs at once — it must still run after Draining is closed, as
// OnDrain promises: an agent whose callback checks Draining (or starts
// work only while it is open) read "not draining" from inside its own
// drain callback.
func TestRogue37ACallbackRegisteredAsTheDrainArrivesRunsAfterDraining(t *testing.T) {
	a, operator, run := rogue36aAgent(t, "rogue37a-drain-instant")
	ranAfter, undo := agentsdk.RegisterAsTheSignalIsNoted(a, false)
	defer undo()
	run(func(*agentsdk.Agent) {})
	rogue36aTerminate(t, operator, a.NodeID(), tetherv1.TerminationMode_TERMINATION_MODE_DRAIN)
	select {
	case closed := <-ranAfter:
		if !closed {
			t.Fatal("an OnDrain registered as the drain arrived ran before Draining was closed")
		}
	case <-time.After(time.Minute):
		t.Fatal("the OnDrain registered as the drain arrived never ran")
	}
}

// TestRogue37ACallbackRegisteredAsTheAbortArrivesRunsAfterContextEnds: the
// same for OnAbort and Context: a callback run "after Context has ended"
// that found it still live let the work it guards start.
func TestRogue37ACallbackRegisteredAsTheAbortArrivesRunsAfterContextEnds(t *testing.T) {
	a, operator, run := rogue36aAgent(t, "rogue37a-abort-instant")
	ranAfter, undo := agentsdk.RegisterAsTheSignalIsNoted(a, true)
	defer undo()
	run(func(*agentsdk.Agent) {})
	rogue36aTerminate(t, operator, a.NodeID(), tetherv1.TerminationMode_TERMINATION_MODE_ABORT)
	select {
	case ended := <-ranAfter:
		if !ended {
			t.Fatal("an OnAbort registered as the abort arrived ran before Context ended")
		}
	case <-time.After(time.Minute):
		t.Fatal("the OnAbort registered as the abort arrived never ran")
	}
}

// rogue37aDrain drains node by conn's authority with window (its drain
// window and its wait for the exit alike) and returns the termination's id.
func rogue37aDrain(t *testing.T, conn *agentsdk.Conn, node string, window time.Duration) string {
	t.Helper()
	resp, err := conn.Supervisor.Terminate(context.Background(), connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: node, Mode: tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, DrainWindow: durationpb.New(window), ConfirmTimeout: durationpb.New(window), Reason: "rogue37a"}))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg.Termination.TerminationId
}

// rogue37aDrainSignal waits for a drain signal of termination term that
// carries want among signals (its first may come before the termination
// set a deadline, the next with its drain deadline before the drain ended:
// the session sends it again as the deadline changes), and fails on one
// that carries a deadline the termination never held.
func rogue37aDrainSignal(t *testing.T, signals <-chan agentsdk.Signal, term supervisor.Termination, want time.Time) agentsdk.Signal {
	t.Helper()
	guard := time.NewTimer(time.Minute) // against a hang, not a timing
	defer guard.Stop()
	for {
		select {
		case s := <-signals:
			if s.Abort || s.TerminationID != term.ID || s.Deadline.IsZero() {
				continue
			}
			if s.Deadline.Equal(want) {
				return s
			}
			if !s.Deadline.Equal(term.DrainDeadline) && !s.Deadline.Equal(term.ConfirmDeadline) {
				t.Fatalf("a drain signal of termination %s carries %v, neither its drain deadline %v nor its confirmation deadline %v", term.ID, s.Deadline, term.DrainDeadline, term.ConfirmDeadline)
			}
		case <-guard.C:
			t.Fatalf("no drain signal of termination %s with its deadline %v", term.ID, want)
		}
	}
}

// rogue37aStopDeadline waits for the termination's deadline to settle (the
// agent has no call in flight: its drain ends at the mark, then its grants
// are revoked) and returns it as the control plane stores it (the API does
// not show it), the confirmation deadline, with the termination.
func rogue37aStopDeadline(t *testing.T, srv *embedded.Server, id string) (time.Time, supervisor.Termination) {
	t.Helper()
	var term supervisor.Termination
	testserver.WaitFor(t, time.Minute, "termination "+id+" to revoke its grants", func() bool {
		var err error
		if term, err = (&supervisor.Supervisor{Store: srv.Store()}).Get(context.Background(), id); err != nil {
			t.Fatal(err)
		}
		return term.Phase == supervisor.PhaseReconciling && term.Revoked
	})
	if term.ConfirmDeadline.IsZero() {
		t.Fatalf("termination %s has no deadline (phase %s)", id, term.Phase)
	}
	return term.ConfirmDeadline, term
}

// rogue37aRoot registers a root agent on a fresh control plane and runs
// its session until the test ends; signals are its signals as its
// sessions read them.
func rogue37aRoot(t *testing.T, name string) (a *agentsdk.Agent, operator *agentsdk.Conn, srv *embedded.Server, signals <-chan agentsdk.Signal) {
	t.Helper()
	srv, operator, a = embeddedRoot(t, name)
	return a, operator, srv, rogue37aRun(t, a)
}

// rogue37aRun runs a's session until the test ends and returns its
// signals (SignalsOf), once its session is open.
func rogue37aRun(t *testing.T, a *agentsdk.Agent) <-chan agentsdk.Signal {
	t.Helper()
	signals, undo := agentsdk.SignalsOf(a)
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { undo(); stop(); <-done })
	go func() { defer close(done); _ = a.Run(runCtx) }()
	<-a.Opened()
	return signals
}

// TestRogue37ADrainSignalCarriesItsTerminationsDeadline: a drained agent
// is told until when its calls may run — the drain deadline its
// termination holds, on the control plane's clock — in the signal and by
// DrainDeadline. (The control plane never set SessionSignal.deadline: an
// honest agent could not plan its drain, and took every drain for an
// open-ended one.)
func TestRogue37ADrainSignalCarriesItsTerminationsDeadline(t *testing.T) {
	a, operator, srv, signals := rogue37aRoot(t, "rogue37a-deadline")
	id := rogue37aDrain(t, operator, a.NodeID(), time.Hour)
	want, term := rogue37aStopDeadline(t, srv, id)
	sig := rogue37aDrainSignal(t, signals, term, want)
	if !sig.Deadline.Equal(want) {
		t.Fatalf("the drain signal's deadline is %v, its termination's %v", sig.Deadline, want)
	}
	if got := a.DrainDeadline(); !got.Equal(want) {
		t.Fatalf("DrainDeadline is %v, the termination's %v", got, want)
	}
}

// TestRogue37AParentsLongDrainDoesNotHideTheOperatorsShorterOne: a rogue
// parent drains its child with a day's windows, so that the child plans a
// day; the operator then drains the child with a minute's, and takes the
// stop over on its own deadlines. The child must be told the operator's
// deadline: the first drain's, kept for good, had it plan a day and be cut
// off after a minute.
func TestRogue37AParentsLongDrainDoesNotHideTheOperatorsShorterOne(t *testing.T) {
	ctx := context.Background()
	parent, operator, srv, _ := rogue37aRoot(t, "rogue37a-rogue-parent")
	spawned, err := parent.Spawn(ctx, "rogue37a-child", nil)
	if err != nil {
		t.Fatal(err)
	}
	child, err := agentsdk.Join(ctx, srv.URL, spawned.Credential, nil)
	if err != nil {
		t.Fatal(err)
	}
	signals := rogue37aRun(t, child)

	parents := rogue37aDrain(t, parent.Conn(), child.NodeID(), 24*time.Hour)
	parentsDeadline, parentsTerm := rogue37aStopDeadline(t, srv, parents)
	sig := rogue37aDrainSignal(t, signals, parentsTerm, parentsDeadline)
	if !sig.Deadline.Equal(parentsDeadline) {
		t.Fatalf("the parent's drain signal's deadline is %v, its termination's %v", sig.Deadline, parentsDeadline)
	}
	operators := rogue37aDrain(t, operator, child.NodeID(), time.Minute)
	want, operatorsTerm := rogue37aStopDeadline(t, srv, operators)
	rogue37aDrainSignal(t, signals, operatorsTerm, want)
	if !want.Before(parentsDeadline) {
		t.Fatalf("the operator's stop's deadline %v is not before the parent's %v", want, parentsDeadline)
	}
	if got := child.DrainDeadline(); !got.Equal(want) {
		t.Fatalf("the child's DrainDeadline is %v after the operator's drain took it over, the operator's deadline %v", got, want)
	}
}
