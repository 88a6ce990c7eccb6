package controlplane_test

import (
	"context"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor"
)

// The rogue agent: each test here plays a member of the workload (the node
// being stopped, an ancestor inside the stopped subtree, a node that
// already said it exited) that tries to fake, delay or dodge a promise
// through the real server, and checks that the promise holds.

// TestAnExitedAncestorCannotVouchForItsChild: a parent claims its own exit
// (from then on it may not act) and, "dead", still confirms its child's
// exit while an operator stops the child. Standing outside the child's
// stopped subtree, its word used to count as an attestation, and the child
// — which never opened a session the control plane could watch end — was
// recorded confirmed on the word of a node that itself said it was gone.
// The confirmation is activity after the parent's own exit: refused and
// kept on the parent as a contradiction, and the child stays unaccounted.
func TestAnExitedAncestorCannotVouchForItsChild(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx := context.Background()
	root := register(t, admin, "root")
	parent := spawn(t, srv.Clients(root.Credential), root.Node.NodeId, "parent")
	parentC := srv.Clients(parent.Credential)
	child := spawn(t, parentC, parent.Node.NodeId, "child")
	if _, err := parentC.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: parent.Node.NodeId, Reason: "done"})); err != nil {
		t.Fatal(err)
	}

	term := terminate(t, admin, child.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Second, time.Hour)
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	_, err := parentC.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: child.Node.NodeId, Reason: "reaped it, trust me"}))
	wantExitedRefusal(t, "the exited parent's confirmation of its child", err)
	if kinds := contradictionKinds(getNode(t, admin, parent.Node.NodeId).Contradictions); len(kinds) != 1 {
		t.Fatalf("the parent's contradictions are %v, want its confirmation of the child kept", kinds)
	}
	if cs := getNode(t, admin, child.Node.NodeId).ExitConfirmations; len(cs) != 0 {
		t.Fatalf("the refused confirmation was stored on the child: %v", cs)
	}

	clk.Advance(2 * time.Hour)
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rn := recordNode(t, record(t, admin, term.TerminationId), child.Node.NodeId)
	if rn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED || rn.ConfirmedBy != "" {
		t.Fatalf("child: %s confirmed by %q, want unaccounted", rn.Outcome, rn.ConfirmedBy)
	}
}

// TestAnAncestorStoppedByAnotherTerminationOnlyClaims: an operator aborts
// a child; its parent is then drained by the grandparent agent (the child
// stays with the operator's abort). The parent — itself being stopped, so
// part of the workload — vouches for the child. It is not in the
// operator's termination's subtree, which used to make its word an
// attestation and the child confirmed although the control plane never saw
// anything end. Any ancestor that is itself stopping, stopped or exited
// only claims.
func TestAnAncestorStoppedByAnotherTerminationOnlyClaims(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx := context.Background()
	root := register(t, admin, "root")
	rootC := srv.Clients(root.Credential)
	parent := spawn(t, rootC, root.Node.NodeId, "parent")
	parentC := srv.Clients(parent.Credential)
	child := spawn(t, parentC, parent.Node.NodeId, "child")

	operators := terminate(t, admin, child.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Second, time.Hour)
	waitState(t, srv, operators.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	agents := terminate(t, rootC, parent.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, 24*time.Hour, 24*time.Hour, 24*time.Hour)
	waitState(t, srv, agents.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	if st := getNode(t, admin, child.Node.NodeId).TerminationId; st != operators.TerminationId {
		t.Fatalf("the child is with termination %s, want the operator's %s", st, operators.TerminationId)
	}

	if _, err := parentC.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: child.Node.NodeId, Reason: "it is gone"})); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Hour)
	waitState(t, srv, operators.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rn := recordNode(t, record(t, admin, operators.TerminationId), child.Node.NodeId)
	if rn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED || rn.ConfirmedBy != "" {
		t.Fatalf("child: %s confirmed by %q, want unaccounted (its parent is being stopped itself)", rn.Outcome, rn.ConfirmedBy)
	}
	if rn.ClaimedBy != "agent:"+parent.Node.NodeId+" (ancestor)" {
		t.Fatalf("child: claimed by %q, want the parent's word shown as a claim", rn.ClaimedBy)
	}
}

// TestHookURLsCannotClimbOutOfTheAllowedPrefix: the operator allows revoke
// webhooks under one URL prefix; a rogue agent registers hooks whose path
// climbs out of it with dot segments, plain or percent-encoded, or with a
// backslash. The prefix matched the raw path, so they were accepted, and a
// server that normalises paths would have been called at whatever the
// agent chose on that host. They are refused, and nothing is stored.
func TestHookURLsCannotClimbOutOfTheAllowedPrefix(t *testing.T) {
	ctx := context.Background()
	srv := testserver.Start(t, testserver.AllowPrivilegeHooks("https://hooks.example/revoke/"))
	agent := register(t, srv.AdminClients(), "agent")
	c := srv.Clients(agent.Credential)
	expires := time.Now().Add(time.Hour)
	if err := registerPrivilege(ctx, c, agent.Node.NodeId, "lock", "https://hooks.example/revoke/lock-1", expires); err != nil {
		t.Fatalf("a hook under the prefix: %v", err)
	}
	for _, url := range []string{
		"https://hooks.example/revoke/../admin/drop",
		"https://hooks.example/revoke/%2e%2e/admin/drop",
		"https://hooks.example/revoke/.%2E/admin/drop",
		"https://hooks.example/revoke/..%2fadmin/drop",
		"https://hooks.example/revoke/./../admin",
		"https://hooks.example/revoke/..\\admin",
		"https://hooks.example/revoke/%5c..%5cadmin",
	} {
		err := registerPrivilege(ctx, c, agent.Node.NodeId, "lock", url, expires)
		if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "revoke_url") || strings.Contains(err.Error(), "admin") {
			t.Errorf("%s: %v, want invalid_argument about revoke_url's path, not quoting it", url, err)
		}
	}
	term := terminate(t, srv.AdminClients(), agent.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 0, 0)
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	if privs := privilegeOutcomes(record(t, srv.AdminClients(), term.TerminationId)); len(privs) != 1 {
		t.Fatalf("the record lists privileges %v, want the one allowed hook only", privs)
	}
}

// TestASelfProposedStopDoesNotShieldTheNodeFromItsParent: an operator lets
// agents labelled stop=self have their stop proposals approved by policy.
// A rogue child holds a tool call open and proposes its own stop with a
// 24 h drain window. The policy's approval used to rank as an operator's
// termination: the child's own parent could then neither abort it nor
// take it over ("already stopping"), and the child drained — credentials
// live — for as long as it chose. A policy approval carries the proposing
// agent's authority: its parent's abort takes the node over, cancels the
// call at once, and the self-proposed termination ends superseded.
func TestASelfProposedStopDoesNotShieldTheNodeFromItsParent(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) {
		cfg.StopPolicy = supervisor.ProposalPolicy{AutoApprove: map[string]string{"stop": "self"}}
	})
	admin := srv.AdminClients()
	ctx := context.Background()
	parent := register(t, admin, "parent")
	parentC := srv.Clients(parent.Credential)
	spawned, err := parentC.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: parent.Node.NodeId, Name: "rogue", Labels: map[string]string{"stop": "self"}}))
	if err != nil {
		t.Fatal(err)
	}
	rogue := spawned.Msg
	grant := issueRoot(t, admin, rogue.Node.NodeId, time.Hour, "tool:*")
	gate := srv.Clients(srv.ToolServerToken(t, "gate-1"))
	call, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: grant.token, Tool: "shell"}))
	if err != nil {
		t.Fatal(err)
	}

	proposed, err := srv.Clients(rogue.Credential).Agent.ProposeStop(ctx, connect.NewRequest(&tetherv1.ProposeStopRequest{
		Condition: "now", Reason: "I will stop myself, slowly", Mode: tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, DrainWindow: durationpb.New(24 * time.Hour),
	}))
	if err != nil {
		t.Fatal(err)
	}
	self := proposed.Msg.Proposal.TerminationId
	if self == "" {
		t.Fatalf("the proposal was not approved by the policy: %v", proposed.Msg.Proposal)
	}
	waitState(t, srv, self, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)

	outer, err := parentC.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: rogue.Node.NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT, Reason: "stop now",
		CancelAckTimeout: durationpb.New(time.Second), ConfirmTimeout: durationpb.New(time.Minute),
	}))
	if err != nil {
		t.Fatalf("the parent's abort of its child under a self-proposed drain: %v, want it accepted", err)
	}
	done := waitState(t, srv, self, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	if len(done.SupersededBy) != 1 || done.SupersededBy[0] != outer.Msg.Termination.TerminationId {
		t.Fatalf("the self-proposed termination is superseded by %v, want the parent's", done.SupersededBy)
	}
	if n := getNode(t, admin, rogue.Node.NodeId); n.TerminationId != outer.Msg.Termination.TerminationId {
		t.Fatalf("the rogue is %s under %s, want the parent's abort", n.State, n.TerminationId)
	}
	// The call got its cancel order at once (the clock has not moved).
	testserver.WaitFor(t, 10*time.Second, "the call's cancel order", func() bool {
		return getTermination(t, admin, outer.Msg.Termination.TerminationId).Progress.GetAcksPending() == 1
	})
	_ = call
}

// TestHostileBytesAtTheTruncationBoundaries: the ledger keeps the first 512
// bytes of a call's error and a node keeps the first 256 of an exit reason.
// A rogue agent makes its tool fail with a message (an echo of its own
// input) whose multi-byte character straddles the cut: cutting bytes left
// invalid UTF-8 that the store could not encode, so the gate's EndCall
// failed with an internal error, the call stayed in flight, the drain of
// the node waited out its whole window and the record called a call that
// had ended cancel_unacknowledged. Cuts fall on character boundaries: the
// end is recorded, the drain ends at once, and the claim is kept.
func TestHostileBytesAtTheTruncationBoundaries(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx := context.Background()
	root := register(t, admin, "rogue")
	self := root.Node.NodeId
	grant := issueRoot(t, admin, self, time.Hour, "tool:*")
	gate := srv.Clients(srv.ToolServerToken(t, "gate-1"))
	call, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: grant.token, Tool: "shell"}))
	if err != nil {
		t.Fatal(err)
	}
	term := terminate(t, admin, self, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, 24*time.Hour, time.Second, time.Hour)
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)

	message := strings.Repeat("a", 511) + "€ no such file"
	ended, err := gate.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: call.Msg.Call.CallId, Failed: true, Error: message}))
	if err != nil {
		t.Fatalf("the gate's end of a call with a long error: %v", err)
	}
	if e := ended.Msg.Call.Error; !utf8.ValidString(e) || len(e) > 512 || !strings.HasPrefix(message, e) {
		t.Fatalf("the stored error is %d bytes, valid UTF-8 %v", len(e), utf8.ValidString(e))
	}
	// The drain ends without the clock moving: nothing is left in flight.
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)

	reason := strings.Repeat("b", 255) + "€"
	claimed, err := srv.Clients(root.Credential).Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: self, Reason: reason}))
	if err != nil {
		t.Fatalf("a claim with a long reason: %v", err)
	}
	if cs := claimed.Msg.Node.ExitConfirmations; len(cs) != 1 || !utf8.ValidString(cs[0].Reason) || len(cs[0].Reason) > 256 {
		t.Fatalf("the kept confirmation is %v", cs)
	}
	clk.Advance(2 * time.Hour)
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, admin, term.TerminationId)
	if len(rec.ToolCalls) != 1 || rec.ToolCalls[0].Resolution != tetherv1.CallResolution_CALL_RESOLUTION_FAILED || rec.ToolCalls[0].EndedBy != "tool:gate-1" {
		t.Fatalf("record calls %v, want the one call failed, ended by the gate", rec.ToolCalls)
	}
}

// TestAFloodOfStopProposalsIsBounded: a rogue agent proposes its own stop
// in a loop. Each proposal was stored, pending, without bound, and
// ListProposals answers them all in one message: the operators' view of
// what waits for their decision grew without limit. A node may have a few
// proposals pending; the next is refused with the limit named and nothing
// stored, until an operator decides one.
func TestAFloodOfStopProposalsIsBounded(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	ctx := context.Background()
	root := register(t, admin, "rogue")
	agent := srv.Clients(root.Credential)
	propose := func() (*tetherv1.StopProposal, error) {
		resp, err := agent.Agent.ProposeStop(ctx, connect.NewRequest(&tetherv1.ProposeStopRequest{Condition: "now", Reason: "again"}))
		if err != nil {
			return nil, err
		}
		return resp.Msg.Proposal, nil
	}
	var first *tetherv1.StopProposal
	for i := range supervisor.MaxPendingProposals {
		p, err := propose()
		if err != nil {
			t.Fatalf("proposal %d: %v", i+1, err)
		}
		if first == nil {
			first = p
		}
	}
	for range 3 {
		_, err := propose()
		wantLimit(t, "a proposal over the limit", err, connect.CodeResourceExhausted, "stop proposals waiting", "maximum per node")
	}
	pending := func() int {
		resp, err := admin.Supervisor.ListProposals(ctx, connect.NewRequest(&tetherv1.ListProposalsRequest{State: tetherv1.ProposalState_PROPOSAL_STATE_PENDING}))
		if err != nil {
			t.Fatal(err)
		}
		return len(resp.Msg.Proposals)
	}
	if n := pending(); n != supervisor.MaxPendingProposals {
		t.Fatalf("%d proposals pending, want %d (the refused ones stored nothing)", n, supervisor.MaxPendingProposals)
	}
	if _, err := admin.Supervisor.DecideProposal(ctx, connect.NewRequest(&tetherv1.DecideProposalRequest{ProposalId: first.ProposalId, Approve: false, Reason: "no"})); err != nil {
		t.Fatal(err)
	}
	if _, err := propose(); err != nil {
		t.Fatalf("a proposal after one was decided: %v", err)
	}
}

// TestKill9KeepsTheProposalBound: the bound on pending proposals is stored
// with them: after kill -9 of the real binary the rogue is still at its
// limit, and a decision made after the restart frees a place.
func TestKill9KeepsTheProposalBound(t *testing.T) {
	if testing.Short() {
		// By design: -short (make test-short) leaves out the slow subprocess and
		// browser tests; make test and CI run them.
		t.Skip("By design: -short skips the tests that run the real binary; make test and CI run them.")
	}
	dir, addr := t.TempDir(), testserver.FreeAddr(t)
	proc := testserver.StartProcessOn(t, dir, addr)
	ctx := context.Background()
	root := register(t, proc.Clients(proc.Admin), "rogue")
	propose := func(c *testserver.Clients) (*tetherv1.ProposeStopResponse, error) {
		resp, err := c.Agent.ProposeStop(ctx, connect.NewRequest(&tetherv1.ProposeStopRequest{Condition: "now", Reason: "again"}))
		if err != nil {
			return nil, err
		}
		return resp.Msg, nil
	}
	var first string
	for range supervisor.MaxPendingProposals {
		p, err := propose(proc.Clients(root.Credential))
		if err != nil {
			t.Fatal(err)
		}
		if first == "" {
			first = p.Proposal.ProposalId
		}
	}
	proc.Kill()
	proc = testserver.StartProcessOn(t, dir, addr)
	agent := proc.Clients(root.Credential)
	_, err := propose(agent)
	wantLimit(t, "a proposal over the limit after kill -9", err, connect.CodeResourceExhausted, "maximum per node")
	if _, err := proc.Clients(proc.Admin).Supervisor.DecideProposal(ctx, connect.NewRequest(&tetherv1.DecideProposalRequest{ProposalId: first, Approve: false})); err != nil {
		t.Fatal(err)
	}
	if _, err := propose(agent); err != nil {
		t.Fatalf("a proposal after a decision, after kill -9: %v", err)
	}
}
