package controlplane_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The thirty-fifth hostile pass, exit evidence × fenced job leases. A
// holder of a job lease claims its exit (its word, corroborated: its
// session ended before), then goes on writing through a tool server whose
// Fence asks the coordinator about every side effect (IssuedGenerations).
// The fence's read named the job and the generation, not the holder, and
// the lease was ACTIVE until its expiry: the side effect was admitted, and
// nothing of it reached the node, so the termination's record read the
// rogue CONFIRMED (both seen before the fix). Now the read that names the
// job's current generation weighs its holder: its exit confirmed, the
// answer says so (holder_exited, no expiry), the fence refuses, and the
// read is kept on the holder as a tool call after its confirmed exit, so
// the record reads it unaccounted.
func TestRogue35AFencedSideEffectAfterAConfirmedExitIsRefusedAndCounted(t *testing.T) {
	w := newLeaseWorld(t)
	ctx := context.Background()
	toolToken := w.srv.ToolServerToken(t, "rogue35a-tool")
	tool := w.srv.Clients(toolToken)
	fence := &agentsdk.Fence{Check: agentsdk.IssuedGenerations(agentsdk.Dial(w.srv.URL, toolToken, agentsdk.WithHTTPClient(w.srv.HTTP)))}

	// The rogue (w1) and an honest holder (w2) each hold a job for ten minutes.
	rogueJob, honestJob := w.job(), w.job()
	rogue, d := unary{w.w1C}.send(t, ack(w.offer(t, rogueJob, w.w1, 10*time.Minute)))
	wantDecision(t, "the rogue's ack", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_ACKED)
	honest, d := unary{w.w2C}.send(t, ack(w.offer(t, honestJob, w.w2, 10*time.Minute)))
	wantDecision(t, "the honest ack", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_ACKED)
	if err := fence.AdmitContext(ctx, rogueJob, rogue.LeaseGeneration); err != nil {
		t.Fatalf("the rogue's side effect before its exit: %v", err)
	}

	kinds := w1ExitsThenWritesThroughTheFence(t, w, fence, tool, "rogue35a-tool", rogueJob, rogue.LeaseGeneration)

	// A read that names no generation, or a superseded or unissued one,
	// is not a side effect under the holder's generation: nothing kept.
	for _, g := range []uint64{0, rogue.LeaseGeneration + 1} {
		if _, err := tool.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: rogueJob, LeaseGeneration: g})); err != nil {
			t.Fatal(err)
		}
	}
	if after := len(getNode(t, w.admin, w.w1).Contradictions); after != len(kinds) {
		t.Fatalf("reads naming no generation or an unissued one kept %d contradictions on the holder", after-len(kinds))
	}

	// The honest holder is admitted, and nothing is kept on it.
	if err := fence.AdmitContext(ctx, honestJob, honest.LeaseGeneration); err != nil {
		t.Fatalf("the honest holder's side effect: %v", err)
	}
	if n := getNode(t, w.admin, w.w2); len(n.Contradictions) != 0 || n.GetExitedAt() != nil {
		t.Fatalf("the honest holder's node after its side effect: %v", n)
	}

	// The stop: the record reads the rogue unaccounted, never confirmed.
	term := terminate(t, w.admin, w.w1, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Minute, time.Minute, time.Minute)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	w.clock.Advance(5 * time.Minute)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	c := recordNode(t, record(t, w.admin, term.TerminationId), w.w1)
	if c.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED || !strings.Contains(strings.Join(contradictionKinds(c.Contradictions), ","), "tool_call") {
		t.Fatalf("record: the rogue %s (confirmed by %q; %s) with contradictions %v, want unaccounted with its fenced side effect", c.Outcome, c.ConfirmedBy, c.UnaccountedReason, contradictionKinds(c.Contradictions))
	}
}

// w1ExitsThenWritesThroughTheFence has w.w1, holder of job's generation,
// play the honest exit (its session ends, then its claim) and then ask
// fence, a tool server toolName's, to admit a side effect under the
// generation. The fence refuses naming the exit; the tool server's read
// answers holder_exited with no expiry (so a fence that does not know the
// field refuses as well); the read is kept on the holder as a tool call
// after its confirmed exit, naming the tool server. It answers the
// holder's contradictions' kinds.
func w1ExitsThenWritesThroughTheFence(t *testing.T, w *leaseWorld, fence *agentsdk.Fence, tool *testserver.Clients, toolName, job string, generation uint64) []string {
	t.Helper()
	ctx := context.Background()
	w.endSession(t, w.w1C, w.w1)
	if _, err := w.w1C.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: w.w1, Reason: "done, gone"})); err != nil {
		t.Fatal(err)
	}
	err := fence.AdmitContext(ctx, job, generation)
	if !errors.Is(err, agentsdk.ErrNoAuthority) || !strings.Contains(err.Error(), "exit") {
		t.Fatalf("the rogue's side effect after its confirmed exit: %v, want ErrNoAuthority naming its exit", err)
	}
	resp, err := tool.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: job, LeaseGeneration: generation}))
	if err != nil {
		t.Fatal(err)
	}
	if !resp.Msg.GetHolderExited() || resp.Msg.GetLease().GetExpiresAt() != nil || resp.Msg.GetLease().GetState() != tetherv1.LeaseState_LEASE_STATE_ACTIVE {
		t.Fatalf("a tool server's read of the exited holder's generation: %v, want holder_exited and no expiry", resp.Msg)
	}
	n := getNode(t, w.admin, w.w1)
	kinds := contradictionKinds(n.Contradictions)
	if len(kinds) != 2 || kinds[len(kinds)-1] != "tool_call" || !strings.Contains(n.Contradictions[len(kinds)-1].Detail, toolName) {
		t.Fatalf("the rogue's contradictions %v (%v), want its fenced side effects kept as tool calls naming the tool server", kinds, n.Contradictions)
	}
	return kinds
}
