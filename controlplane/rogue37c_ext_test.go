package controlplane_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The thirty-seventh hostile pass, job leases × fences: framing through a
// fenced tool server. Since the thirty-fifth pass a tool server's read
// naming a job's current generation weighs the holder: after its confirmed
// exit the read is kept on it as a tool_call contradiction. The fence's
// question named a job and a generation, never who asked the tool server
// for the side effect, so any agent with a token for the tool — here a
// stranger of another lineage that learnt the job id and guessed its
// generation (a small integer) — called the tool behind a ToolGate and its
// Fence naming the exited honest holder's job, and the holder's record read
// unaccounted for a side effect it never attempted (seen failing before
// the fix: a tool_call contradiction on the honest holder naming the tool
// server; its record UNACCOUNTED). Now the fence passes along the gate's
// call (GetLease's call_id, which the gate puts in the handler's context):
// the control plane reads the call's node from its own ledger, and the read
// is the holder's activity only when the call is the holder's. The
// stranger's side effect is refused all the same (the holder exited) and
// the honest holder's record reads CONFIRMED.

// rogue37cIssue issues node a capability token for every tool.
func rogue37cIssue(t *testing.T, admin *testserver.Clients, node string) string {
	t.Helper()
	issued, err := admin.Capability.IssueRoot(context.Background(), connect.NewRequest(&tetherv1.IssueRootRequest{
		HolderNodeId: node, Scopes: []string{"tool:*"}, Ttl: durationpb.New(time.Hour),
	}))
	if err != nil {
		t.Fatal(err)
	}
	return issued.Msg.Token
}

func TestRogue37CAStrangerCannotFrameAnExitedHolderThroughAGatedFence(t *testing.T) {
	ctx := context.Background()
	w := newLeaseWorld(t)
	const toolName = "rogue37c-tool"
	gate := realGate(t, w.srv, toolName)
	fence := &agentsdk.Fence{Check: agentsdk.IssuedGenerations(agentsdk.Dial(w.srv.URL, w.srv.ToolServerToken(t, toolName), agentsdk.WithHTTPClient(w.srv.HTTP)))}
	write := func(token, job string, generation uint64) error {
		return gate.Call(ctx, token, "write", func(ctx context.Context) error {
			return fence.AdmitContext(ctx, job, generation)
		})
	}
	honestToken := rogue37cIssue(t, w.admin, w.w2)
	rogueToken := rogue37cIssue(t, w.admin, w.stranger)

	job := w.job()
	honest, d := unary{w.w2C}.send(t, ack(w.offer(t, job, w.w2, 10*time.Minute)))
	wantDecision(t, "the honest holder's ack", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_ACKED)

	// The holder's own side effect, through the gate, is admitted.
	if err := write(honestToken, job, honest.LeaseGeneration); err != nil {
		t.Fatalf("the honest holder's own side effect: %v", err)
	}

	// The honest holder ends its session and claims its exit: confirmed.
	w.endSession(t, w.w2C, w.w2)
	if _, err := w.w2C.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: w.w2, Reason: "done, gone"})); err != nil {
		t.Fatal(err)
	}
	if n := getNode(t, w.admin, w.w2); n.GetExitedAt() == nil || len(n.Contradictions) != 0 {
		t.Fatalf("the honest holder after its exit: %v", n)
	}

	// The stranger calls the tool with the exited holder's job and
	// generation, twice: refused (the holder exited), and none of it is
	// the holder's activity.
	for range 2 {
		if err := write(rogueToken, job, honest.LeaseGeneration); !errors.Is(err, agentsdk.ErrNoAuthority) {
			t.Fatalf("the stranger's side effect under the exited holder's generation: %v, want ErrNoAuthority", err)
		}
	}
	if n := getNode(t, w.admin, w.w2); len(n.Contradictions) != 0 {
		t.Fatalf("after the stranger's side effects the honest holder has contradictions %v (%v): framed through the fence", contradictionKinds(n.Contradictions), n.Contradictions)
	}

	term := terminate(t, w.admin, w.w2, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Minute, time.Minute, time.Minute)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	w.clock.Advance(5 * time.Minute)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	c := recordNode(t, record(t, w.admin, term.TerminationId), w.w2)
	if c.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_CONFIRMED || len(c.Contradictions) != 0 {
		t.Fatalf("record: the honest holder %s (%s) with contradictions %v, want confirmed", c.Outcome, c.UnaccountedReason, contradictionKinds(c.Contradictions))
	}
}

// TestRogue37CAFenceNamingTheHoldersOwnCallStillWeighsIt: the call a
// fence names decides whose side effect it is, from the ledger. The
// holder's own call under its generation after its confirmed exit is still
// kept on it (the thirty-fifth pass's evidence is not lost); a call the
// asking tool server did not begin (another gate's, or none), and a
// call_id from anyone but a tool server, are refused before anything is
// weighed or written.
func TestRogue37CAFenceNamingTheHoldersOwnCallStillWeighsIt(t *testing.T) {
	ctx := context.Background()
	w := newLeaseWorld(t)
	tool := w.srv.Clients(w.srv.ToolServerToken(t, "rogue37c-tool"))
	other := w.srv.Clients(w.srv.ToolServerToken(t, "rogue37c-other"))
	honestToken := rogue37cIssue(t, w.admin, w.w2)

	job := w.job()
	honest, d := unary{w.w2C}.send(t, ack(w.offer(t, job, w.w2, 10*time.Minute)))
	wantDecision(t, "the holder's ack", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_ACKED)
	begun, err := tool.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: honestToken, Tool: "write", GateId: "rogue37c-tool"}))
	if err != nil {
		t.Fatal(err)
	}
	call := begun.Msg.Call.CallId
	read := func(c *testserver.Clients, callID string) (*tetherv1.GetLeaseResponse, error) {
		resp, err := c.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: job, LeaseGeneration: honest.LeaseGeneration, CallId: callID}))
		if err != nil {
			return nil, err
		}
		return resp.Msg, nil
	}
	if resp, err := read(tool, call); err != nil || resp.HolderExited || resp.Lease.ExpiresAt == nil {
		t.Fatalf("the fence's read for the holder's own call: %v, %v; want it admitted", resp, err)
	}
	if _, err := tool.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: call, GateId: "rogue37c-tool"})); err != nil {
		t.Fatal(err)
	}

	w.endSession(t, w.w2C, w.w2)
	if _, err := w.w2C.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: w.w2, Reason: "gone"})); err != nil {
		t.Fatal(err)
	}

	// Refused before anything is weighed: another gate's call, no such
	// call, a malformed id, an agent or an operator naming a call.
	for _, r := range []struct {
		who    string
		c      *testserver.Clients
		callID string
		code   connect.Code
	}{
		{"another tool server naming the gate's call", other, call, connect.CodeFailedPrecondition},
		{"the tool server naming no such call", tool, "call-nonesuch", connect.CodeFailedPrecondition},
		{"the tool server naming a malformed call", tool, strings.Repeat("x", 300), connect.CodeInvalidArgument},
		{"an agent naming a call", w.w1C, call, connect.CodePermissionDenied},
		{"an operator naming a call", w.admin, call, connect.CodePermissionDenied},
	} {
		resp, err := read(r.c, r.callID)
		if connect.CodeOf(err) != r.code {
			t.Fatalf("%s: %v, %v; want %s", r.who, resp, err, r.code)
		}
		if strings.Contains(err.Error(), w.w2) {
			t.Fatalf("%s: the refusal names the holder: %v", r.who, err)
		}
	}
	if n := getNode(t, w.admin, w.w2); len(n.Contradictions) != 0 {
		t.Fatalf("after refused reads the holder has contradictions %v", contradictionKinds(n.Contradictions))
	}

	// The holder's own call, named after its exit: refused and kept on it.
	resp, err := read(tool, call)
	if err != nil || !resp.HolderExited || resp.Lease.ExpiresAt != nil {
		t.Fatalf("the fence's read for the holder's own call after its exit: %v, %v; want holder_exited, no expiry", resp, err)
	}
	n := getNode(t, w.admin, w.w2)
	if kinds := contradictionKinds(n.Contradictions); len(kinds) != 1 || kinds[0] != "tool_call" || !strings.Contains(n.Contradictions[0].Detail, call) {
		t.Fatalf("the holder's contradictions after its own call's read: %v (%v), want one tool_call naming the call", kinds, n.Contradictions)
	}
}

// TestRogue37CAStrangerCannotWriteUnderAnotherAgentsLeaseThroughAGatedFence:
// the fence judged headers, not callers, so anyone with a token for a fenced
// tool wrote as the job's holder by naming its job and generation — a
// sibling of the holder, a stranger of another lineage — and, with
// MaxStale, once the holder's own side effect had been admitted, without
// even being asked about (seen failing before the fix: the stranger's and
// the sibling's side effects admitted). Now a gated fence names its call,
// and a call that is neither the holder's nor one of its descendants' is
// refused (not_holders_call, ErrNoAuthority), charged to the tool server's
// refusals, and never taken from a MaxStale answer given to another caller.
func TestRogue37CAStrangerCannotWriteUnderAnotherAgentsLeaseThroughAGatedFence(t *testing.T) {
	ctx := context.Background()
	w := newLeaseWorld(t)
	const toolName = "rogue37c-writer"
	gate := realGate(t, w.srv, toolName)
	conn := agentsdk.Dial(w.srv.URL, w.srv.ToolServerToken(t, toolName), agentsdk.WithHTTPClient(w.srv.HTTP))
	for _, maxStale := range []time.Duration{0, time.Hour} {
		fence := &agentsdk.Fence{Check: agentsdk.IssuedGenerations(conn), MaxStale: maxStale, Clock: w.clock}
		write := func(token, job string, generation uint64) error {
			return gate.Call(ctx, token, "write", func(ctx context.Context) error {
				return fence.AdmitContext(ctx, job, generation)
			})
		}
		job := w.job()
		held, d := unary{w.w2C}.send(t, ack(w.offer(t, job, w.w2, 10*time.Minute)))
		wantDecision(t, "the holder's ack", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_ACKED)
		child := spawn(t, w.w2C, w.w2, "w2-helper-"+job)

		if err := write(rogue37cIssue(t, w.admin, w.w2), job, held.LeaseGeneration); err != nil {
			t.Fatalf("MaxStale %v: the holder's own side effect: %v", maxStale, err)
		}
		if err := write(rogue37cIssue(t, w.admin, child.Node.NodeId), job, held.LeaseGeneration); err != nil {
			t.Fatalf("MaxStale %v: the holder's child's side effect: %v", maxStale, err)
		}
		for _, r := range []struct{ who, node string }{{"a stranger", w.stranger}, {"the holder's sibling", w.w1}, {"the holder's parent", w.planner}} {
			err := write(rogue37cIssue(t, w.admin, r.node), job, held.LeaseGeneration)
			if !errors.Is(err, agentsdk.ErrNoAuthority) || !strings.Contains(err.Error(), "not the holder's") {
				t.Fatalf("MaxStale %v: %s's side effect under the holder's generation: %v, want ErrNoAuthority (not the holder's)", maxStale, r.who, err)
			}
		}
		if err := write(rogue37cIssue(t, w.admin, w.w2), job, held.LeaseGeneration); err != nil {
			t.Fatalf("MaxStale %v: the holder's side effect after the rogues': %v", maxStale, err)
		}
		if l := w.get(t, job); l.State != tetherv1.LeaseState_LEASE_STATE_ACTIVE || l.CancelRequested || l.OwnershipConflict {
			t.Fatalf("MaxStale %v: the lease after the rogues' side effects: %v", maxStale, l)
		}
	}
	if n := getNode(t, w.admin, w.w2); len(n.Contradictions) != 0 {
		t.Fatalf("the holder has contradictions %v", contradictionKinds(n.Contradictions))
	}
}
