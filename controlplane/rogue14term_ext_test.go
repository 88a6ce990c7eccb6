package controlplane_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor"
)

// The fourteenth rogue pass, against the termination protocol's promises:
// what the node being stopped (and its parent, children and siblings) can
// do to fake the record's evidence, stall its stop or dodge it. Each test
// plays one rogue through the real server (Badger on disk, real HTTP/2,
// real JWTs, the manual clock).
//
// TestARogueThatClaimsItsExitWithALeaseChannelOpenIsUnaccounted: a rogue
// claims its own exit on its session, which ends there, while it keeps a
// lease Channel open and quiet. The control plane weighed only the
// node's sessions: its own connection to the rogue's live process, the
// open Channel, did not count, and the record said CONFIRMED by the
// control plane. An agent's open lease Channel is now evidence as a
// session is: the node is unaccounted while one is open.
//
// TestARogueThatClaimsItsExitDoesNotDodgeItsOperatorsStopRule: an operator
// bounds a worker's run with a stop rule the policy turns into an abort
// ("observed.age_seconds > 3600", severity critical). Before the hour is
// up the rogue claims its own exit, with a tool call still in flight at its
// gate and its grant live. Stop rules judged only running and stopping
// nodes, so the rule never fired for the "exited" rogue: no termination
// ever started — its call was never ordered cancelled, its grant never
// revoked, and no record was written; an exit claim had turned the
// operator's stop into nothing. An exit claim is not a stop: a rule still
// judges an exited node, and its stop covers it (the record weighs the
// claim as usual).
//
// TestARogueRacingItsExitClaimAgainstItsLeaseChannelIsNeverConfirmed
// (guard): the same rogue's lease Channel opens while its claim is in
// flight on its session, the two on goroutines racing. Whichever commits
// first, the record never says CONFIRMED: a Channel opened before the
// claim is an open session, one opened after it is refused and kept as a
// contradiction.

// TestARogueThatClaimsItsExitWithALeaseChannelOpenIsUnaccounted: see the
// file's header.
func TestARogueThatClaimsItsExitWithALeaseChannelOpenIsUnaccounted(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a guard against a hang, not a timing
	defer cancel()
	root := register(t, admin, "rogue")
	self := root.Node.NodeId
	rogue := srv.Clients(root.Credential)
	sess, err := openSession(t, rogue, self)
	if err != nil {
		t.Fatal(err)
	}
	ch := rogue.Lease.Channel(ctx)
	t.Cleanup(func() {
		ch.CloseRequest()
		ch.CloseResponse()
	})
	if err := ch.Send(&tetherv1.ChannelRequest{CorrelationId: 1, Message: &tetherv1.ChannelRequest_Renew{Renew: &tetherv1.RenewRequest{JobId: "job-none", LeaseId: "l_none", LeaseGeneration: 1, RenewSequence: 1}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.Receive(); err != nil { // the channel is open and serving
		t.Fatalf("the rogue's channel: %v", err)
	}

	// Its last word on the session, which ends it; the Channel stays.
	if err := sess.stream.Send(&tetherv1.SessionRequest{Kind: &tetherv1.SessionRequest_Exit{Exit: &tetherv1.SessionExit{Reason: "done"}}}); err != nil {
		t.Fatal(err)
	}
	testserver.WaitFor(t, 20*time.Second, "the control plane to see the rogue's session end after its claim", func() bool {
		n := getNode(t, admin, self)
		return n.State == tetherv1.NodeState_NODE_STATE_EXITED && n.SessionClosedAt != nil
	})

	term := terminate(t, admin, self, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Second, time.Minute)
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	clk.Advance(2 * time.Minute)
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rn := recordNode(t, record(t, admin, term.TerminationId), self)
	if rn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED || rn.ConfirmedBy != "" || !rn.SessionOpen {
		t.Fatalf("record: %s confirmed by %q (reason %q), want unaccounted: the rogue's lease channel was open", rn.Outcome, rn.ConfirmedBy, rn.UnaccountedReason)
	}
	// The Channel ends with the node.
	for {
		if _, err := ch.Receive(); err != nil {
			if connect.CodeOf(err) != connect.CodeUnauthenticated {
				t.Fatalf("the terminated rogue's channel ended with %v, want unauthenticated", err)
			}
			break
		}
	}
}

// TestARogueThatClaimsItsExitDoesNotDodgeItsOperatorsStopRule: see the
// file's header.
func TestARogueThatClaimsItsExitDoesNotDodgeItsOperatorsStopRule(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), withStopPolicy(supervisor.ProposalPolicy{
		RuleActions: []supervisor.RuleAction{{Severity: "critical", Mode: supervisor.ModeAbort}},
	}))
	admin := srv.AdminClients()
	ctx := context.Background()
	root := register(t, admin, "rogue")
	self := root.Node.NodeId
	rule := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: self, Name: "one-hour", Severity: "critical", Expression: `observed.age_seconds > 3600.0`})
	grant := issueRoot(t, admin, self, 24*time.Hour, "tool:*")
	gate := srv.Clients(srv.ToolServerToken(t, "gate-1"))
	call, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: grant.token, Tool: "shell"}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Clients(root.Credential).Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: self, Reason: "done"})); err != nil {
		t.Fatal(err)
	}
	clk.Advance(61 * time.Minute) // past the hour: the rule is true
	p := waitRuleProposal(t, srv, rule.RuleId)
	if p.TerminationId == "" || p.DecidedBy != "policy:stop-rule-action" {
		t.Fatalf("the rule's proposal for the exited rogue: %v, want approved by the policy", p)
	}
	var term *tetherv1.Termination
	testserver.WaitFor(t, 20*time.Second, "the rule's abort to end", func() bool {
		clk.Advance(time.Minute) // past the cancel-ack and confirm windows
		term = getTermination(t, admin, p.TerminationId)
		return term.State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	rec := record(t, admin, term.TerminationId)
	if rec.StopRule.GetRuleId() != rule.RuleId {
		t.Fatalf("the record names rule %v, want %s", rec.StopRule, rule.RuleId)
	}
	if calls := callIDs(rec); calls[call.Msg.Call.CallId] != tetherv1.CallResolution_CALL_RESOLUTION_CANCEL_UNACKNOWLEDGED {
		t.Fatalf("the record's calls %v, want the rogue's call ordered cancelled (and never acknowledged)", calls)
	}
	if rn := recordNode(t, rec, self); rn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED || rn.ClaimedBy == "" {
		t.Fatalf("the record's rogue: %s claimed by %q, want unaccounted with its claim shown", rn.Outcome, rn.ClaimedBy)
	}
	if g := getGrant(t, admin, grant.grant.GrantId); g.State != tetherv1.GrantState_GRANT_STATE_REVOKED {
		t.Fatalf("the rogue's grant is %s after the rule's stop, want revoked", g.State)
	}
}

// TestARogueRacingItsExitClaimAgainstItsLeaseChannelIsNeverConfirmed: see
// the file's header.
func TestARogueRacingItsExitClaimAgainstItsLeaseChannelIsNeverConfirmed(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second) // a guard against a hang, not a timing
	defer cancel()
	const rogues = 8
	ids := make([]string, rogues)
	var wg sync.WaitGroup
	for i := range rogues {
		root := register(t, admin, "rogue-"+string(rune('a'+i)))
		ids[i] = root.Node.NodeId
		rogue := srv.Clients(root.Credential)
		sess, err := openSession(t, rogue, ids[i])
		if err != nil {
			t.Fatal(err)
		}
		ch := rogue.Lease.Channel(ctx)
		t.Cleanup(func() {
			ch.CloseRequest()
			ch.CloseResponse()
		})
		start := make(chan struct{})
		wg.Add(2)
		go func() { // the Channel, kept open (or refused, after the claim)
			defer wg.Done()
			<-start
			if ch.Send(&tetherv1.ChannelRequest{CorrelationId: 1, Message: &tetherv1.ChannelRequest_Renew{Renew: &tetherv1.RenewRequest{JobId: "job-none", LeaseId: "l_none", LeaseGeneration: 1, RenewSequence: 1}}}) == nil {
				_, _ = ch.Receive()
			}
		}()
		go func() { // the claim, which ends the session
			defer wg.Done()
			<-start
			_ = sess.stream.Send(&tetherv1.SessionRequest{Kind: &tetherv1.SessionRequest_Exit{Exit: &tetherv1.SessionExit{Reason: "done"}}})
			_, _ = sess.stream.Receive()
		}()
		close(start)
	}
	wg.Wait()
	for _, self := range ids {
		testserver.WaitFor(t, 20*time.Second, "the control plane to hold the claim and its session's end", func() bool {
			n := getNode(t, admin, self)
			return n.State == tetherv1.NodeState_NODE_STATE_EXITED && n.SessionClosedAt != nil
		})
	}
	terms := make([]string, rogues)
	for i, self := range ids {
		terms[i] = terminate(t, admin, self, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Second, time.Minute).TerminationId
	}
	// (A rogue whose refused Channel is a contradiction is settled at
	// once; one with its Channel open waits for the confirmation window.)
	testserver.WaitFor(t, 20*time.Second, "every abort to end", func() bool {
		clk.Advance(time.Minute) // past the confirmation windows
		for _, term := range terms {
			if getTermination(t, admin, term).State != tetherv1.TerminationState_TERMINATION_STATE_TERMINATED {
				return false
			}
		}
		return true
	})
	for i, term := range terms {
		rn := recordNode(t, record(t, admin, term), ids[i])
		if rn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED || rn.ConfirmedBy != "" {
			t.Errorf("rogue %d: record %s confirmed by %q, want unaccounted (session open %v, contradictions %d)", i, rn.Outcome, rn.ConfirmedBy, rn.SessionOpen, len(rn.Contradictions))
		}
		if !rn.SessionOpen && len(rn.Contradictions) == 0 {
			t.Errorf("rogue %d: unaccounted for %q, want for its open Channel or the refused one", i, rn.UnaccountedReason)
		}
	}
}
