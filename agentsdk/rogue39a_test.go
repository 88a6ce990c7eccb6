package agentsdk_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/agentsdk"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The thirty-ninth hostile pass on the Go agent SDK (letter A).

// TestRogue39ARunWaitsForTheAbortCallbacksTheSessionStarted: Run promises
// to return its refusal of a dead credential once the OnAbort callbacks
// have returned, so that an agent whose main returns (exits) when Run does
// has cleaned up first (its subprocesses stopped, its leases given back).
// A rogue parent (here an operator, as one) aborts the agent: the abort
// reaches it over its session first, which starts its OnAbort callbacks;
// the refusal that ends its session comes after. Run noted that second
// abort, found the callbacks already started (by the first) and returned
// at once, while they still ran: the agent's process ended in the middle
// of its cleanup.
func TestRogue39ARunWaitsForTheAbortCallbacksTheSessionStarted(t *testing.T) {
	ctx := context.Background()
	srv := startEmbedded(t)
	operator := agentsdk.Dial(srv.URL, srv.AdminToken)
	a, err := agentsdk.RegisterRoot(ctx, operator, "rogue39a-abort-cleanup", nil)
	if err != nil {
		t.Fatal(err)
	}
	a.HeartbeatEvery = 250 * time.Millisecond // the refusal comes at its next heartbeat
	cleaning := make(chan agentsdk.Signal, 1)
	release := make(chan struct{})
	cleaned := make(chan struct{})
	a.OnAbort(func(s agentsdk.Signal) {
		cleaning <- s
		<-release // the cleanup, under way until the test lets it end
		close(cleaned)
	})
	waiting := make(chan struct{})
	t.Cleanup(agentsdk.WhenRunWaitsForAbortCallbacks(a, func() { close(waiting) }))
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	ran := make(chan error, 1)
	go func() { ran <- a.Run(runCtx) }()
	<-a.Opened()

	rogue36aTerminate(t, operator, a.NodeID(), tetherv1.TerminationMode_TERMINATION_MODE_ABORT)
	select {
	case s := <-cleaning:
		if !s.Abort {
			t.Fatalf("OnAbort was told %+v, want the abort", s)
		}
	case <-time.After(20 * time.Second): // a guard against the hang, not a timing
		t.Fatal("OnAbort was not called on the abort signal")
	}
	// The launcher's attestation ends the stop: the node is terminated
	// and its credential refused, which ends the session.
	if _, err := operator.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: a.NodeID(), Reason: "rogue39a: the process ended"})); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-ran:
		close(release)
		t.Fatalf("Run returned (%v) while the OnAbort callback the abort signal started was still cleaning up", err)
	case <-waiting:
	case <-time.After(30 * time.Second): // a guard against the hang, not a timing
		close(release)
		t.Fatal("Run never heard its session refused")
	}
	close(release)
	err = <-ran
	select {
	case <-cleaned:
	default:
		t.Fatalf("Run returned (%v) before its OnAbort callback had", err)
	}
	if c := connect.CodeOf(err); c != connect.CodeUnauthenticated && c != connect.CodePermissionDenied && c != connect.CodeFailedPrecondition {
		t.Fatalf("Run returned %v, want the refusal that ended its session", err)
	}
	if !errors.Is(context.Cause(a.Context()), agentsdk.ErrAborted) {
		t.Fatalf("the agent's context ended with %v, want ErrAborted", context.Cause(a.Context()))
	}
}
