package agentsdk_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/agentsdk"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The twenty-sixth hostile pass on the Go SDK: a launcher attests an
// agent's exit (ConfirmExit with an operator token) while the agent's
// process is in fact still there, cut off from the control plane. The
// control plane refuses the agent's every session from then on
// (failed_precondition, each kept as evidence contradicting the exit); its
// signal for such a node is "stop now", but the refusal comes before it.
// Run took the refusal for a passing fault and reconnected for ever (every
// 5 s), and the agent's context never ended: its work went on.
func TestRogue26AnAgentWhoseExitWasConfirmedIsToldToStop(t *testing.T) {
	ctx := context.Background()
	srv := startEmbedded(t)
	operator := agentsdk.Dial(srv.URL, srv.AdminToken)
	root, err := agentsdk.RegisterRoot(ctx, operator, "rogue26-root", nil)
	if err != nil {
		t.Fatal(err)
	}
	child, err := root.Spawn(ctx, "rogue26-attested", nil)
	if err != nil {
		t.Fatal(err)
	}
	me, err := agentsdk.Join(ctx, srv.URL, child.Credential, operator.HTTP)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := operator.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: me.NodeID(), Reason: "its process is gone"})); err != nil {
		t.Fatal(err)
	}
	told := make(chan agentsdk.Signal, 1)
	me.OnAbort(func(s agentsdk.Signal) { told <- s })
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- me.Run(runCtx) }()
	select {
	case err := <-done:
		if connect.CodeOf(err) != connect.CodeFailedPrecondition {
			t.Fatalf("Run ended with %v, want the control plane's failed_precondition", err)
		}
	case <-time.After(20 * time.Second): // a guard against the hang, not a timing
		t.Fatal("Run did not end in 20 s: it went on reconnecting to a control plane that refuses the exited node")
	}
	if !errors.Is(context.Cause(me.Context()), agentsdk.ErrAborted) {
		t.Fatalf("the agent's work was not told to stop: its context's cause is %v", context.Cause(me.Context()))
	}
	select {
	case sig := <-told:
		if !sig.Abort || !strings.Contains(sig.Reason, "exit was confirmed") {
			t.Fatalf("the agent was told %+v, want the abort its confirmed exit calls for", sig)
		}
	default:
		t.Fatal("OnAbort was not called")
	}
}

// TestRogue26ALeaseJobWhoseAgentsExitWasConfirmedIsToldToStop: the same
// attested exit, seen by the agent's LeaseWorker rather than its session.
// The control plane refuses the job's every renewal (failed_precondition:
// the node's exit was confirmed; a lease decision would be an answer, not
// an error) and keeps each as evidence contradicting the exit. The renew
// loop logged the refusal and renewed again, for as long as the job's
// window lasted on the worker's clock (a lease's duration), and the job's
// context never said stop: its work went on. The job now ends at the
// first such refusal, its cause the refusal (an ErrJobEnded).
func TestRogue26ALeaseJobWhoseAgentsExitWasConfirmedIsToldToStop(t *testing.T) {
	s := newLeaseSetup(t)
	w := s.newWorker(t, t.TempDir(), loopRenewEvery)
	ctx := context.Background()
	job, d, err := w.Accept(ctx, s.offer(t, "rogue26-attested-job", 10*time.Minute), agentsdk.JobOptions{})
	accepted(t, "accept", d, err)
	operator := agentsdk.Dial(s.srv.URL, s.srv.Admin, agentsdk.WithHTTPClient(s.srv.HTTP))
	if _, err := operator.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: s.node, Reason: "its process is gone"})); err != nil {
		t.Fatal(err)
	}
	select {
	case <-job.Done():
	case <-time.After(20 * time.Second): // a guard against the renewals going on, not a timing
		t.Fatal("the job still runs 20 s after its agent's exit was confirmed: its renewals are refused, each kept as evidence against the exit, and its work was never told to stop")
	}
	cause := context.Cause(job.Context())
	if !errors.Is(cause, agentsdk.ErrJobEnded) || connect.CodeOf(cause) != connect.CodeFailedPrecondition {
		t.Fatalf("the job ended with %v, want an ErrJobEnded carrying the control plane's failed_precondition", cause)
	}
}
