package controlplane_test

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

// TestRogue38CAFormerHoldersSideEffectAfterItsExitIsCounted: a holder's
// call through a gated, fenced tool is under way when it ends its session
// and claims its exit (confirmed); its job goes to another agent
// (generation 2), and the call then attempts a side effect under its own
// generation 1. The fence refuses it (ErrFenced), but it refused it on its
// own, without asking, and the control plane weighed only reads naming
// the job's current generation: the exited agent's activity after its
// exit reached nothing, and its record read CONFIRMED (seen failing
// before the fix: no contradiction on the former holder). Now a gated
// fence asks about a superseded generation too (naming the gate's call),
// and a tool server's read naming the call and a superseded generation
// is kept on the call's node when that node is a party to the job (its
// holder or a former holder): its own call, from the ledger, so it frames
// nobody. An ungated read, or another agent's call, naming the same
// superseded generation keeps nothing on anyone.
func TestRogue38CAFormerHoldersSideEffectAfterItsExitIsCounted(t *testing.T) {
	formerHoldersSideEffectIsCounted(t, newLeaseWorld(t))
}

// The same on etcd, where the nodes and the ledger are read from the store.
func TestRogue38CEtcdAFormerHoldersSideEffectAfterItsExitIsCounted(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the etcd variant; make test and CI run them.")
	}
	formerHoldersSideEffectIsCounted(t, newLeaseWorldOnEtcd(t))
}

func formerHoldersSideEffectIsCounted(t *testing.T, w *leaseWorld) {
	ctx := context.Background()
	const toolName = "rogue38c-tool"
	gate := realGate(t, w.srv, toolName)
	toolToken := w.srv.ToolServerToken(t, toolName)
	tool := w.srv.Clients(toolToken)
	fence := &agentsdk.Fence{Check: agentsdk.IssuedGenerations(agentsdk.Dial(w.srv.URL, toolToken, agentsdk.WithHTTPClient(w.srv.HTTP)))}
	formerToken := rogue37cIssue(t, w.admin, w.w2)
	strangerToken := rogue37cIssue(t, w.admin, w.stranger)

	job := w.job()
	first, d := unary{w.w2C}.send(t, ack(w.offer(t, job, w.w2, 10*time.Minute)))
	wantDecision(t, "the holder's ack", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_ACKED)

	begun, goOn := make(chan string), make(chan struct{})
	result := make(chan error, 1)
	go func() {
		result <- gate.Call(ctx, formerToken, "write", func(ctx context.Context) error {
			begun <- agentsdk.GateCallID(ctx)
			<-goOn
			return fence.AdmitContext(ctx, job, first.LeaseGeneration)
		})
	}()
	call := <-begun

	// The holder leaves: its session ends, its exit is confirmed, and its
	// job goes to w1 (generation 2), which the fence has seen.
	w.endSession(t, w.w2C, w.w2)
	if _, err := w.w2C.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: w.w2, Reason: "done, gone"})); err != nil {
		close(goOn)
		t.Fatal(err)
	}
	second := w.reassign(t, job, w.w1, 10*time.Minute)
	fence.Observe(job, second.LeaseGeneration)
	before := len(getNode(t, w.admin, w.w2).Contradictions)

	// Framing nobody: an ungated read and a stranger's gated call naming
	// the superseded generation keep nothing on the former holder.
	if _, err := tool.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: job, LeaseGeneration: first.LeaseGeneration})); err != nil {
		t.Fatal(err)
	}
	err := gate.Call(ctx, strangerToken, "write", func(ctx context.Context) error {
		return fence.AdmitContext(ctx, job, first.LeaseGeneration)
	})
	if !errors.Is(err, agentsdk.ErrFenced) {
		t.Fatalf("the stranger's side effect under the superseded generation: %v, want ErrFenced", err)
	}
	if n := getNode(t, w.admin, w.w2); len(n.Contradictions) != before {
		t.Fatalf("reads not of the former holder's own call kept %v on it", contradictionKinds(n.Contradictions[before:]))
	}

	// The former holder's own call, after its exit, under its superseded
	// generation: refused, and kept on it.
	close(goOn)
	if err := <-result; !errors.Is(err, agentsdk.ErrFenced) {
		t.Fatalf("the former holder's side effect after its exit: %v, want ErrFenced", err)
	}
	n := getNode(t, w.admin, w.w2)
	added := n.Contradictions[before:]
	if kinds := contradictionKinds(added); len(kinds) != 1 || kinds[0] != "tool_call" || !strings.Contains(added[0].Detail, call) || !strings.Contains(added[0].Detail, "superseded") {
		t.Fatalf("the former holder's contradictions after its side effect under its superseded generation: %v (%v), want one tool_call naming its call", contradictionKinds(added), added)
	}
}

// TestRogue38CAToolServerCannotFrameAFormerHolderWithAnEndedCall: the
// read that counts a superseded generation against the call's node takes
// the call from the ledger, but a tool server names whichever of its
// gate's calls it likes. A rogue tool server that once served an honest
// agent named that agent's call, long ended, after the agent had exited and
// its job had moved on, with the agent's superseded generation: the agent's
// record read unaccounted for a side effect no call of it attempted (seen
// failing before the fix: a tool_call contradiction on the honest former
// holder). Only a call still under way is weighed so: a side effect
// happens within its call.
func TestRogue38CAToolServerCannotFrameAFormerHolderWithAnEndedCall(t *testing.T) {
	ctx := context.Background()
	w := newLeaseWorld(t)
	const toolName = "rogue38c-rogue-tool"
	tool := w.srv.Clients(w.srv.ToolServerToken(t, toolName))
	honestToken := rogue37cIssue(t, w.admin, w.w2)

	job := w.job()
	first, d := unary{w.w2C}.send(t, ack(w.offer(t, job, w.w2, 10*time.Minute)))
	wantDecision(t, "the holder's ack", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_ACKED)
	begun, err := tool.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: honestToken, Tool: "write", GateId: toolName}))
	if err != nil {
		t.Fatal(err)
	}
	call := begun.Msg.Call.CallId
	if _, err := tool.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: call, GateId: toolName})); err != nil {
		t.Fatal(err)
	}
	w.endSession(t, w.w2C, w.w2)
	if _, err := w.w2C.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: w.w2, Reason: "done, gone"})); err != nil {
		t.Fatal(err)
	}
	w.reassign(t, job, w.w1, 10*time.Minute)
	before := len(getNode(t, w.admin, w.w2).Contradictions)

	resp, err := tool.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: job, LeaseGeneration: first.LeaseGeneration, CallId: call}))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Msg.Lease.GetLeaseGeneration() <= first.LeaseGeneration || resp.Msg.Lease.GetExpiresAt() != nil {
		t.Fatalf("the rogue tool server's read of the superseded generation: %v", resp.Msg)
	}
	if n := getNode(t, w.admin, w.w2); len(n.Contradictions) != before {
		t.Fatalf("a tool server naming the exited former holder's ended call kept %v on it: framed", contradictionKinds(n.Contradictions[before:]))
	}
}
