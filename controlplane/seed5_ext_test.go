package controlplane_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The fifth acceptance pass over seed 003 (termination), through the real
// server, as an independent prober. The seed's concrete promises, in
// English, each with where it is checked:
//
//  1. States: requested -> draining -> reconciling -> terminated, and
//     requested -> aborting -> reconciling -> terminated; terminated only
//     after reconciling has written the record (supervisor
//     TestAdvanceRefusesIllegalEdges; seed_term wantHeader; seed3 order).
//  2. The transition out of requested is started by an authority outside
//     the workload, never by the agent itself (supervisor_ext
//     TestSelfTerminationAndTerminationByADescendantAreRefused; stop
//     proposals: the agent proposes, the control plane decides).
//  3. Draining refuses new tool calls and lets the calls in flight finish
//     inside a BOUNDED window; every call in flight gets a decision (wait
//     for its result, or cancel and record the cancellation), never left
//     to what the transport does when the socket closes (termination_ext,
//     seed3 TestSeed3TheRecordSaysWhenEachCallWasOrderedAndEnded).
//  4. Aborting cancels the calls in flight and requires an
//     acknowledgement from the tool layer of each cancellation (seed2
//     acknowledgement probes).
//  5. Deadlines and escalation: someone chooses the drain bound; a drain
//     outlasting it escalates to abort (termination_ext, seed2 restart).
//     Reading of this pass: the bound, once chosen, is not loosened by a
//     later request — a repeated stop of the same node, or a stop of an
//     overlapping subtree, never gives a call in flight more time than the
//     termination already stopping it had left (probes below).
//  6. The record is written by the supervisor from outside, before
//     terminated, and does not rest on the stopped agent's own logs: which
//     calls were in flight and how each was resolved (who reported what,
//     when), which privileges were revoked and which expired, which
//     children are confirmed terminated and which are unaccounted — the
//     unaccounted field is the important one (seed_term, seed3, supervisor_ext).
//  7. Propagation: a child's privilege is revocable by any ancestor in the
//     delegation chain, from the root or a control plane acting for it; each
//     grant carries the set of parties allowed to withdraw it (capability
//     tests, seed3 TestSeed3NoOneArmsANodeBeingDrained).
//  8. The revocation handle lives in the control plane, outside the
//     workload; the agent never holds its own stop key (a self-stop is a
//     proposal, seed_term TestSeedAnAgentsLongProposalDoesNotBlockItsApproval).
//  9. Repeated stop requests and stops of overlapping subtrees: each node
//     is accounted for by exactly one termination (compose_ext); a repeat
//     or overlap must not loosen what the first stop promised (5, below).
// 10. Restart/crash: the termination is a persisted desired state; a
//     restart forgives no deadline and loses no step (seed2, termination_ext
//     kill -9, restart_probe).
// 11. Upgrades are drain -> reconcile -> restart (rollout_ext).
// 12. The cost is explicit: the drain window means termination takes time,
//     and someone picks the bound (5).
//
// What the agent being stopped can and cannot influence: it cannot start,
// loosen or delay its own stop, arm itself or its children, or make its
// own word count as evidence (seed_term, seed3). This pass adds: a second
// stop request — an operator's client retrying, an operator stopping a
// child of a node already being stopped, or an operator approving, during
// the stop, a proposal the rogue filed with a day's window — is not a way
// for a rogue's long call (or its gate's late acknowledgement) to win more
// time, nor for the record to come later. Reading chosen (docs/design.md
// §8): a repeat is not deduplicated — it is a new termination that takes
// the nodes over, and both write records — but it keeps the deadlines the
// same authority already set.

// nodeTermination is the termination that accounts for node now.
func nodeTermination(t *testing.T, c *testserver.Clients, node string) string {
	t.Helper()
	resp, err := c.Agent.GetNode(context.Background(), connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: node}))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg.Node.TerminationId
}

// terminateAgain repeats a stop request and returns the termination that
// then accounts for node (the repeat's, if it took the node over).
func terminateAgain(t *testing.T, w *seedWorld, node string, mode tetherv1.TerminationMode, window, ack time.Duration) string {
	t.Helper()
	resp, err := w.admin.Supervisor.Terminate(context.Background(), connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: node, Mode: mode, Reason: "test",
		DrainWindow: durationpb.New(window), CancelAckTimeout: durationpb.New(ack), ConfirmTimeout: durationpb.New(time.Hour),
	}))
	if err == nil {
		id := resp.Msg.Termination.TerminationId
		testserver.WaitFor(t, 20*time.Second, "the repeat "+id+" to mark its subtree", func() bool {
			return getTermination(t, w.admin, id).State != tetherv1.TerminationState_TERMINATION_STATE_REQUESTED
		})
	} else if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("the repeated stop request: %v; want it taken, or refused failed_precondition", err)
	}
	return nodeTermination(t, w.admin, node)
}

// wantCancelOrderedAt waits for the termination accounting for the call's
// node to finish and checks that its record says the call's cancel was
// ordered at the instant at.
func wantCancelOrderedAt(t *testing.T, w *seedWorld, term, call string, at time.Time) {
	t.Helper()
	w.clk.Advance(time.Minute) // past the acknowledgement deadline
	waitState(t, w.srv, term, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	w.clk.Advance(2 * time.Hour) // past the confirm timeout
	waitState(t, w.srv, term, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, w.admin, term)
	for _, c := range rec.ToolCalls {
		if c.CallId != call {
			continue
		}
		if got := c.CancelRequestedAt.AsTime(); !got.Equal(at) {
			t.Errorf("the record says call %s was ordered cancelled at %s, want %s", call, got, at)
		}
		return
	}
	t.Errorf("call %s is missing from the record of %s", call, term)
}

// Seed 003 (draining, deadlines): draining lets calls in flight finish
// inside a bounded window, then escalates. An operator drains P with a 10 s
// window while its child's call (a rogue's, that never ends by itself) is
// in flight; at 9 s the operator's client repeats the same request (a retry
// after a lost answer). The repeat used to take the node over with a fresh
// 10 s window from its own start: the call ran on to 19 s and the drain
// escalated there. The window is the first request's: at 10 s the drain
// escalates and orders the call's cancel, and the record says so.
func TestSeed5ARepeatedDrainGivesTheCallInFlightNoMoreTime(t *testing.T) {
	w := newSeedWorld(t)
	call, err := w.begin(w.gC.token)
	if err != nil {
		t.Fatal(err)
	}
	first := terminate(t, w.admin, w.p.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, 10*time.Second, 10*time.Second, time.Hour)
	waitState(t, w.srv, first.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)
	w.clk.Advance(9 * time.Second)
	term := terminateAgain(t, w, w.p.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, 10*time.Second, 10*time.Second)
	if got := nodeTermination(t, w.admin, w.c.Node.NodeId); got != term {
		t.Fatalf("P is accounted for by %s, its child C by %s", term, got)
	}
	w.clk.Advance(time.Second)
	got := waitState(t, w.srv, term, tetherv1.TerminationState_TERMINATION_STATE_ABORTING)
	if !got.Escalated {
		t.Fatalf("termination %s is aborting without having escalated: %v", term, got)
	}
	wantCancelOrderedAt(t, w, term, call, epoch.Add(10*time.Second))
}

// Seed 003 (aborting): aborting requires the tool layer's acknowledgement
// of each cancel, up to a timeout; a call not acknowledged by then is
// cancel_unacknowledged. An operator aborts P with a 10 s acknowledgement
// timeout; at 9 s the operator repeats the abort. The rogue gate, silent
// so far, acknowledges at 10 s. The repeat used to take the node and its
// call over with a fresh timeout (19 s), so the late acknowledgement was
// taken and the record said cancelled_acked. It is refused at the first
// abort's deadline, and the record says cancel_unacknowledged.
func TestSeed5ARepeatedAbortGivesALateGateNoMoreTime(t *testing.T) {
	w := newSeedWorld(t)
	call, err := w.begin(w.gC.token)
	if err != nil {
		t.Fatal(err)
	}
	first := terminate(t, w.admin, w.p.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 10*time.Second, time.Hour)
	testserver.WaitFor(t, 20*time.Second, "the abort's cancel order", func() bool {
		return getTermination(t, w.admin, first.TerminationId).Progress.GetAcksPending() == 1
	})
	w.clk.Advance(9 * time.Second)
	term := terminateAgain(t, w, w.p.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 10*time.Second)
	w.clk.Advance(time.Second)
	_, err = w.gate.Tool.CancelAck(context.Background(), connect.NewRequest(&tetherv1.CancelAckRequest{CallId: call, GateId: "gate-1"}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "cancel_unacknowledged") {
		t.Errorf("the gate's acknowledgement at the first abort's deadline: %v; want failed_precondition saying the call is recorded cancel_unacknowledged", err)
	}
	// The revocation (from which the confirm timeout runs) before the clock
	// moves past that timeout.
	waitState(t, w.srv, term, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	w.clk.Advance(2 * time.Hour)
	waitState(t, w.srv, term, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	for _, c := range record(t, w.admin, term).ToolCalls {
		if c.CallId == call && c.Resolution != tetherv1.CallResolution_CALL_RESOLUTION_CANCEL_UNACKNOWLEDGED {
			t.Errorf("call %s recorded %s, want cancel_unacknowledged", call, c.Resolution)
		}
	}
}

// Seed 003 (overlapping subtrees, deadlines): an operator drains P with a
// 10 s window while its child C's call (a rogue's, that never ends) is in
// flight; at 5 s an operator drains C — a subtree inside the one being
// drained — with an hour's window. The inner drain used to take C and its
// call over with its own hour: the rogue's call ran on past P's window for
// an hour. C's drain may take C over, but not loosen the bound already
// set on it: at 10 s the call's cancel is ordered.
func TestSeed5AnOverlappingDrainOfAChildDoesNotLoosenTheWindow(t *testing.T) {
	w := newSeedWorld(t)
	call, err := w.begin(w.gC.token)
	if err != nil {
		t.Fatal(err)
	}
	outer := terminate(t, w.admin, w.p.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, 10*time.Second, 10*time.Second, time.Hour)
	waitState(t, w.srv, outer.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)
	w.clk.Advance(5 * time.Second)
	term := terminateAgain(t, w, w.c.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Hour, 10*time.Second)
	w.clk.Advance(5 * time.Second)
	testserver.WaitFor(t, 20*time.Second, "the call's cancel order at the outer drain's deadline", func() bool {
		return getTermination(t, w.admin, term).State == tetherv1.TerminationState_TERMINATION_STATE_ABORTING
	})
	wantCancelOrderedAt(t, w, term, call, epoch.Add(10*time.Second))
}

// Seed 003 (reconciling): reconciling writes the record, and waits for
// the exit confirmations only up to the confirm timeout. An operator
// drains P and C (no calls: the drain ends at once, the grants are
// revoked, and the record waits up to an hour for confirmations nobody
// sends — the rogue pair never confirms). Half an hour on, the operator's
// client repeats the drain. The repeat used to take both nodes over and
// start the hour again: the record, and the rogue's listing unaccounted,
// came half an hour late (and would never come, retried often enough).
// The record is written at the first drain's confirm deadline.
func TestSeed5ARepeatedStopDoesNotPostponeTheRecord(t *testing.T) {
	w := newSeedWorld(t)
	first := terminate(t, w.admin, w.p.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, 10*time.Second, 10*time.Second, time.Hour)
	waitState(t, w.srv, first.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	w.clk.Advance(30 * time.Minute)
	term := terminateAgain(t, w, w.p.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, 10*time.Second, 10*time.Second)
	if term != first.TerminationId {
		waitState(t, w.srv, term, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	}
	w.clk.Advance(30 * time.Minute)
	got := waitState(t, w.srv, term, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, w.admin, term)
	if at := rec.WrittenAt.AsTime(); at.After(epoch.Add(time.Hour)) {
		t.Errorf("the record of %s was written at %s, after the first drain's confirm deadline %s", got.TerminationId, at, epoch.Add(time.Hour))
	}
	for _, n := range rec.Nodes {
		if n.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED {
			t.Errorf("node %s recorded %s, want unaccounted", n.NodeId, n.Outcome)
		}
	}
}

// proposeAndApprove: the agent proposes its own drain with window, an
// operator approves it; it returns the approval's termination, or the
// approval's error.
func proposeAndApprove(t *testing.T, w *seedWorld, agent *testserver.Clients, window time.Duration) (string, func() (*tetherv1.Termination, error)) {
	t.Helper()
	ctx := context.Background()
	p, err := agent.Agent.ProposeStop(ctx, connect.NewRequest(&tetherv1.ProposeStopRequest{
		Condition: "now", Reason: "done", Mode: tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, DrainWindow: durationpb.New(window),
	}))
	if err != nil {
		t.Fatal(err)
	}
	id := p.Msg.Proposal.ProposalId
	return id, func() (*tetherv1.Termination, error) {
		resp, err := w.admin.Supervisor.DecideProposal(ctx, connect.NewRequest(&tetherv1.DecideProposalRequest{ProposalId: id, Approve: true, Reason: "ok"}))
		if err != nil {
			return nil, err
		}
		return resp.Msg.Termination, nil
	}
}

// Seed 003 (the agent proposes, the control plane decides; deadlines): a
// rogue P files two proposals of its own stop while its child's call is
// in flight — a drain with a 10 s window, and a decoy with 24 h. The
// operator approves the first, then (working down the queue) the decoy at
// 5 s. The decoy's termination used to take P and C over with its own
// 24 h window: the rogue's call, due to be cancelled at 10 s, ran on for a
// day. The agent's windows bind its own later proposals: at 10 s the
// drain escalates.
func TestSeed5ADecoyProposalDoesNotLoosenTheAgentsOwnStop(t *testing.T) {
	w := newSeedWorld(t)
	call, err := w.begin(w.gC.token)
	if err != nil {
		t.Fatal(err)
	}
	_, approveShort := proposeAndApprove(t, w, w.pAgent, 10*time.Second)
	_, approveDecoy := proposeAndApprove(t, w, w.pAgent, 24*time.Hour)
	first, err := approveShort()
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, w.srv, first.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)
	approveLateThenWantEscalationAt10s(t, w, approveDecoy, call, "the decoy", "the first stop's deadline")
}

// Seed 003 (the agent proposes, the control plane decides; deadlines): a
// rogue P files a proposal of its own drain with a 24 h window, then an
// operator drains P with 10 s while C's call is in flight. At 5 s the
// operator, working down the queue, approves the proposal filed before
// the drain. Its termination used to take P and C over with the rogue's
// 24 h window. An operator's approval of the agent's proposal does not
// loosen the operator's own drain: at 10 s the drain escalates.
func TestSeed5AProposalApprovedDuringADrainDoesNotLoosenIt(t *testing.T) {
	w := newSeedWorld(t)
	call, err := w.begin(w.gC.token)
	if err != nil {
		t.Fatal(err)
	}
	_, approveLong := proposeAndApprove(t, w, w.pAgent, 24*time.Hour)
	first := terminate(t, w.admin, w.p.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, 10*time.Second, 10*time.Second, time.Hour)
	waitState(t, w.srv, first.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)
	approveLateThenWantEscalationAt10s(t, w, approveLong, call, "the proposal", "the operator's deadline")
}

// approveLateThenWantEscalationAt10s moves the clock to 5 s into a 10 s
// drain of P begun at the epoch and approves a proposal there (its
// termination marks, or the approval is refused as the nodes are already
// stopping), then moves to 10 s and wants C's drain escalated and C's call
// ordered cancelled at 10 s: the late approval loosened nothing.
func approveLateThenWantEscalationAt10s(t *testing.T, w *seedWorld, approve func() (*tetherv1.Termination, error), call, what, deadline string) {
	t.Helper()
	w.clk.Advance(5 * time.Second)
	if approved, err := approve(); err == nil {
		testserver.WaitFor(t, 20*time.Second, what+"'s termination to mark", func() bool {
			return getTermination(t, w.admin, approved.TerminationId).State != tetherv1.TerminationState_TERMINATION_STATE_REQUESTED
		})
	} else if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("approving %s: %v", what, err)
	}
	term := nodeTermination(t, w.admin, w.c.Node.NodeId)
	w.clk.Advance(5 * time.Second)
	testserver.WaitFor(t, 20*time.Second, "the drain's escalation at "+deadline, func() bool {
		return getTermination(t, w.admin, term).State == tetherv1.TerminationState_TERMINATION_STATE_ABORTING
	})
	wantCancelOrderedAt(t, w, term, call, epoch.Add(10*time.Second))
}

// Seed 003 (restart): the termination is a persisted desired state. The
// operator's drain of P (10 s) is repeated at 9 s, and the server stops
// right after the repeat took the nodes over; the first drain's deadline
// passes while it is down. Restarted on the same data directory, the
// repeat's drain escalates at once: the deadline it kept from the first
// is stored with it, not recomputed from its own window on the restart.
func TestSeed5ARepeatedStopsKeptDeadlineSurvivesARestart(t *testing.T) {
	dir := t.TempDir()
	clk := clock.NewManual(epoch)
	srv := testserver.StartIn(t, dir, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx := context.Background()
	p := register(t, admin, "parent")
	pAgent := srv.Clients(p.Credential)
	c := spawn(t, pAgent, p.Node.NodeId, "child")
	gP := issueRoot(t, admin, p.Node.NodeId, time.Hour, "tool:*")
	gC := delegate(t, pAgent, gP, c.Node.NodeId, "tool:shell")
	gate := srv.Clients(srv.ToolServerToken(t, "gate-1"))
	begun, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: gC.token, Tool: "shell", GateId: "gate-1"}))
	if err != nil {
		t.Fatal(err)
	}
	first := terminate(t, admin, p.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, 10*time.Second, 10*time.Second, time.Hour)
	waitState(t, srv, first.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)
	clk.Advance(9 * time.Second)
	again := terminate(t, admin, p.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, 10*time.Second, 10*time.Second, time.Hour)
	waitState(t, srv, again.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)
	srv.Stop()

	clk.Advance(time.Second) // the first drain's deadline passes while the server is down
	srv = testserver.StartIn(t, dir, testserver.WithClock(clk))
	admin = srv.AdminClients()
	got := waitState(t, srv, again.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_ABORTING)
	if !got.Escalated {
		t.Fatalf("the repeat is aborting without having escalated: %v", got)
	}
	clk.Advance(time.Minute)
	waitState(t, srv, again.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	clk.Advance(2 * time.Hour)
	waitState(t, srv, again.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	for _, call := range record(t, admin, again.TerminationId).ToolCalls {
		if call.CallId == begun.Msg.Call.CallId && !call.CancelRequestedAt.AsTime().Equal(epoch.Add(10*time.Second)) {
			t.Errorf("the call's cancel was ordered at %s, want the first drain's deadline %s", call.CancelRequestedAt.AsTime(), epoch.Add(10*time.Second))
		}
	}
}

// Seed 003 (the record): every privilege revoked, in the record that
// accounts for its node. P holds a file lock whose revoke hook answers,
// and two grants. An operator drains P and C; the drain revokes them and
// waits for confirmations; the operator's client repeats the drain, which
// takes both nodes over. The hook is called once, and the repeat's record
// (the one that accounts for P and C) lists the lock revoked and both
// grants revoked, each once; the first's lists the nodes superseded.
func TestSeed5ARepeatedStopsRecordKeepsWhatTheFirstRevoked(t *testing.T) {
	hooked := make(chan string, 8)
	hook := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		hooked <- r.URL.Path
		rw.WriteHeader(http.StatusNoContent)
	}))
	defer hook.Close()
	w := newSeedWorld(t)
	ctx := context.Background()
	_, err := w.admin.Supervisor.RegisterPrivilege(ctx, connect.NewRequest(&tetherv1.RegisterPrivilegeRequest{
		NodeId: w.p.Node.NodeId, Kind: "file_lock", ExternalId: "/locks/p", ExpiresAt: timestamppb.New(w.clk.Now().Add(24 * time.Hour)), RevokeUrl: hook.URL + "/revoke",
	}))
	if err != nil {
		t.Fatal(err)
	}
	first := terminate(t, w.admin, w.p.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, 10*time.Second, 10*time.Second, time.Hour)
	waitState(t, w.srv, first.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	<-hooked
	w.clk.Advance(time.Minute)
	term := terminateAgain(t, w, w.p.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, 10*time.Second, 10*time.Second)
	w.clk.Advance(2 * time.Hour)
	waitState(t, w.srv, term, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	waitState(t, w.srv, first.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	select {
	case again := <-hooked:
		t.Errorf("the revoke hook was called a second time (%s)", again)
	default:
	}
	rec := record(t, w.admin, term)
	seen := map[string]tetherv1.PrivilegeOutcome{}
	for _, p := range rec.Privileges {
		if _, dup := seen[p.ExternalId]; dup {
			t.Errorf("privilege %s listed twice", p.ExternalId)
		}
		seen[p.ExternalId] = p.Outcome
	}
	for _, id := range []string{"/locks/p", w.gP.grant.GrantId, w.gC.grant.GrantId} {
		if seen[id] != tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_REVOKED {
			t.Errorf("the repeat's record lists %s as %s, want revoked (record privileges: %v)", id, seen[id], rec.Privileges)
		}
	}
	for _, n := range record(t, w.admin, first.TerminationId).Nodes {
		if n.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_SUPERSEDED || n.SupersededByTerminationId != term {
			t.Errorf("the first record lists %s as %s (superseded by %q), want superseded by %s", n.NodeId, n.Outcome, n.SupersededByTerminationId, term)
		}
	}
}
