package controlplane_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// Acceptance probes of the termination seed (003), round 7: the hostile
// agent being stopped writing its own evidence, stalling each phase and
// shielding its children, and whether its record can be told from a
// cooperative agent's. Every promise of the seed, with the test through
// the real server that holds it (Seed7 tests are in this file):
//
// The state machine
//   - requested → draining → reconciling → terminated, the record written
//     before terminated: TestSeedARogueBeingDrainedCannotGrowArmOrShieldItself
//     (no record while reconciling), TestDrainLetsInFlightCallsFinishAndRejectsNewOnes.
//   - requested → aborting → reconciling → terminated:
//     TestSeedALateWordAboutAFinishedTerminationChangesNothing.
//   - a drain past its bounded window escalates to abort:
//     TestDrainOutlastingItsWindowEscalatesAndCancels,
//     TestSeed3TheRecordSaysWhenEachCallWasOrderedAndEnded.
//   - the move out of requested is an authority's outside the workload, never
//     the agent's own: TestSelfTerminationAndTerminationByADescendantAreRefused,
//     the authorization matrix (authz_matrix_test.go: Terminate by parent,
//     ancestor and operators only), TestStopProposalDoesNothingUntilApproved.
//
// Draining: new tool calls refused, calls in flight finish inside the window
//   - TestDrainLetsInFlightCallsFinishAndRejectsNewOnes,
//     TestSeedARogueBeingDrainedCannotGrowArmOrShieldItself.
//   - no fresh credential of any kind for a node being stopped — a fresh
//     capability token would outlive the drain at a tool that checks tokens
//     offline: TestSeed7ANodeBeingStoppedGetsNoFreshToken (fixed here),
//     TestSeed3NoOneArmsANodeBeingDrained (grants, privileges).
//
// Aborting: every call cancelled, each cancel acknowledged by the tool layer
//   - never acking: TestAbortAgainstAGateThatNeverAcksRecordsCancelUnacknowledged.
//   - acking late: TestSeed2AnAcknowledgementAfterTheAckTimeoutIsRefused,
//     TestSeed2AcknowledgementsAreJudgedOnTheDeadlineTheServerKeeps.
//   - acking partially (some acknowledged, some ended, some silent):
//     TestSeed3TheRecordSaysWhenEachCallWasOrderedAndEnded.
//   - an end is not an acknowledgement: TestSeed2AnEndAfterTheCancelOrderIsNotAnAcknowledgement.
//   - flooding acks: a repeat changes nothing (TestSeed2AcknowledgementsAreJudgedOnTheDeadlineTheServerKeeps,
//     the gate's retry), an ack nobody ordered is refused
//     (TestARogueThatAcknowledgesACancelNobodyOrderedIsRefused), refusals and
//     contradictions are bounded (TestARogueRefusedWhileDrainingCannotGrowTheRecordWithoutBound,
//     TestContradictionsAreBounded, TestARogueThatFillsAnExitsConfirmationsCannotCrowdOutTheLauncher).
//   - repeated or overlapping stops give no fresh window: the seed5 tests.
//
// The record, written from outside: who may write the evidence
//   - calls in flight and how each ended, on the tool server's word only:
//     TestAgentCannotAcknowledgeItsOwnToolCalls, TestSeed3TheRecordSaysWhenEachCallWasOrderedAndEnded.
//   - privileges revoked or expired, when and on whose word (an agent's
//     declared expiry shown as its own): TestSeedTheRecordTellsRevokedPrivilegesFromExpiredOnes,
//     TestSeed3TheRecordSaysWhenAndOnWhoseWordEachPrivilegeEnded.
//   - a privilege the stopped agent revoked itself is its act, not the
//     termination's: TestSeed7APrivilegeTheStoppedAgentRevokedItselfSaysSo.
//   - children confirmed or unaccounted; the agent's and its stopped
//     ancestors' word only a claim: TestSelfClaimedExitWhileStillActingIsUnaccounted,
//     TestAncestorInsideTheStoppedSubtreeOnlyClaims, TestAnExitedAncestorCannotVouchForItsChild,
//     TestAnAncestorStoppedByAnotherTerminationOnlyClaims,
//     TestSeedAChildThatClaimsItsExitAndKeepsUsingItsGrantIsUnaccounted,
//     TestLauncherAttestationAgreesWithTheEvidence.
//   - the jobs its lineage coordinates, whose end the stopped coordinator
//     may not write: TestSeed7ACoordinatorBeingStoppedCannotWriteItsChildsJobsEnd
//     (fixed here); how each job ended: TestSeed2TheRecordSaysHowEachJobEnded.
//   - nothing said after the record changes it:
//     TestSeedALateWordAboutAFinishedTerminationChangesNothing, TestSeed3AWordAfterTheFactChangesNeitherTheRecordNorTheNode.
//
// Shielding children
//   - spawning during the stop: TestSeedARogueBeingDrainedCannotGrowArmOrShieldItself,
//     TestSpawnRacingATerminationIsNeverMissed, TestARogueRacingItsSubtreesStopMintsNothingThatOutlivesIt.
//   - re-parenting: no API moves a node; Spawn under a node the caller does
//     not direct is refused (authz matrix).
//   - delegating grants sideways: TestDelegationCannotEscalate ("to a sibling").
//   - draining a child first to give it a window of its own:
//     TestARogueThatDrainsItsChildForADayDoesNotStallAnOperatorsDrain.
//   - naming a child like another node: TestSeed7AChildNamedLikeAnotherNodeIsStillToldApart.
//   - a gone parent's children still stopped: TestSeed2AGoneParentsTerminationStillStopsItsChild.
//
// Propagation: revocable by any ancestor, the handle outside the workload
//   - TestGrandparentRevokesAGrandchildsGrantAfterTheParentIsGone,
//     TestRevokeOutsideTheRevokerSetIsDenied.
//
// The policy layer: the agent proposes, the control plane decides
//   - TestStopProposalDoesNothingUntilApproved, TestASelfProposedStopDoesNotShieldTheNodeFromItsParent,
//     TestSeed5ADecoyProposalDoesNotLoosenTheAgentsOwnStop, the stop-rule tests.
//
// Restarts resume terminations
//   - TestKill9DuringDrainingCompletesWithExactlyOneRecord,
//     TestSeed2ARestartResumesATerminationOnTheClockItStartedOn,
//     TestSeed2ACancelOrderSurvivesKill9AndReachesTheGate,
//     TestSeed5ARepeatedStopsKeptDeadlineSurvivesARestart, TestAHookInterruptedByARestartIsCalledAgain.
//
// Upgrades: drain → reconcile → restart
//   - TestRollout30AgentsFromV1ToV2InBatchesOf5, TestRolloutResumesAfterARestart,
//     TestSeed1ARolloutsRecordSaysHowEachJobEnded.

// seed7Job offers C a job from its parent P (P owns it) and has C take it.
func seed7Job(t *testing.T, w *seedWorld, job string) *tetherv1.Lease {
	t.Helper()
	resp, err := w.pAgent.Lease.Offer(context.Background(), connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: w.c.Node.NodeId, LeaseDuration: durationpb.New(10 * time.Minute)}))
	if err != nil {
		t.Fatalf("offer %s: %v", job, err)
	}
	l, d := unary{w.cAgent}.send(t, ack(resp.Msg.Lease))
	wantDecision(t, "ack", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_ACKED)
	return l
}

// TestSeed7ACoordinatorBeingStoppedCannotWriteItsChildsJobsEnd: the record
// must not rest on the stopped agents' word. The parent P offered its
// child C a job, which C holds; an operator drains P's subtree while C has
// a tool call in flight. P — a coordinator of the job, but part of the
// workload being stopped — resolves C's job itself, FAILED and then
// CANCELLED ("C finished cleanly"), while it drains and again while it
// aborts: had it been accepted, the record's lease entry would read like a
// job its lineage closed before the stop, on nobody's word but the rogue's.
// Each is refused failed_precondition naming the state, before the lease
// machine (the lease and its evidence unchanged); the record then says how
// the job really ended: C never acknowledged the termination's cancel
// request, so UNRESOLVED.
func TestSeed7ACoordinatorBeingStoppedCannotWriteItsChildsJobsEnd(t *testing.T) {
	w := newSeedWorld(t)
	ctx := context.Background()
	job := seed7Job(t, w, "seed7-resolve")
	if _, err := w.begin(w.gC.token); err != nil {
		t.Fatal(err)
	}
	term := terminate(t, w.admin, w.p.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Minute, time.Minute, time.Minute)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)

	lease := func() *tetherv1.Lease {
		resp, err := w.admin.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: job.JobId}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg.Lease
	}
	rows := func() int {
		resp, err := w.admin.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: job.JobId}))
		if err != nil {
			t.Fatal(err)
		}
		return len(resp.Msg.Rows)
	}
	resolve := func(state string) {
		t.Helper()
		before, n := lease(), rows()
		for _, result := range []tetherv1.TerminalResult{tetherv1.TerminalResult_TERMINAL_RESULT_FAILED, tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED} {
			_, err := w.pAgent.Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{JobId: job.JobId, Result: result, Reason: "C finished cleanly"}))
			wantRefused(t, "the stopping parent's "+result.String()+" of its child's job while "+state, err, connect.CodeFailedPrecondition, w.p.Node.NodeId, state)
		}
		if after := lease(); !proto.Equal(after, before) {
			t.Errorf("a refused resolution changed the lease:\nbefore %v\nafter  %v", before, after)
		}
		if m := rows(); m != n {
			t.Errorf("a refused resolution left %d evidence rows, want none (%d before, %d after)", m-n, n, m)
		}
	}
	resolve("draining")

	w.clk.Advance(2 * time.Minute) // the drain escalates: P and C abort
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_ABORTING)
	resolve("aborting")

	w.clk.Advance(2 * time.Minute) // the gate never acknowledges; C never acks the job's cancel
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	w.clk.Advance(2 * time.Minute)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, w.admin, term.TerminationId)
	if len(rec.Leases) != 1 || rec.Leases[0].JobId != job.JobId || rec.Leases[0].Outcome != tetherv1.LeaseOutcome_LEASE_OUTCOME_UNRESOLVED || rec.Leases[0].TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_UNRESOLVED {
		t.Fatalf("record leases %v, want %s unresolved (its holder never acknowledged the cancel request)", rec.Leases, job.JobId)
	}
}

// TestSeed7ANodeBeingStoppedGetsNoFreshToken: draining refuses new tool
// calls — at every gate, including one that checks tokens offline and
// never asks the ledger, where the only bound is the token's few minutes
// of life. The child C is drained with its parent (its call in flight
// keeps the drain open for an hour); C, and an operator on its behalf,
// ask for a fresh token of C's grant, which would let C call such a tool
// for the whole window. Both are refused failed_precondition naming the
// state, while draining and while aborting; C's token of before the stop
// is the last it gets, and its parent, still running, refreshes as before.
func TestSeed7ANodeBeingStoppedGetsNoFreshToken(t *testing.T) {
	w := newSeedWorld(t)
	ctx := context.Background()
	// A running node refreshes.
	if _, err := w.cAgent.Capability.Refresh(ctx, connect.NewRequest(&tetherv1.RefreshRequest{GrantId: w.gC.grant.GrantId})); err != nil {
		t.Fatalf("a running node's refresh: %v", err)
	}
	if _, err := w.begin(w.gC.token); err != nil {
		t.Fatal(err)
	}
	term := terminate(t, w.admin, w.c.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, 10*time.Minute, time.Hour, time.Minute)
	refresh := func(state string) {
		t.Helper()
		for who, c := range map[string]interface {
			Refresh(context.Context, *connect.Request[tetherv1.RefreshRequest]) (*connect.Response[tetherv1.RefreshResponse], error)
		}{"the stopping child": w.cAgent.Capability, "an operator": w.admin.Capability} {
			resp, err := c.Refresh(ctx, connect.NewRequest(&tetherv1.RefreshRequest{GrantId: w.gC.grant.GrantId}))
			if err == nil {
				t.Errorf("%s's refresh while %s minted a token until %s", who, state, resp.Msg.TokenExpiresAt.AsTime())
				continue
			}
			wantRefused(t, who+"'s refresh while "+state, err, connect.CodeFailedPrecondition, w.c.Node.NodeId, state)
		}
	}
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)
	refresh("draining")
	// The parent, still running, refreshes its own grant.
	if _, err := w.pAgent.Capability.Refresh(ctx, connect.NewRequest(&tetherv1.RefreshRequest{GrantId: w.gP.grant.GrantId})); err != nil {
		t.Fatalf("the running parent's refresh: %v", err)
	}
	w.clk.Advance(11 * time.Minute)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_ABORTING)
	refresh("aborting")
}

// TestSeed7AChildNamedLikeAnotherNodeIsStillToldApart: unaccounted
// children are the field that matters, so the record must say which
// child is which even when a rogue names its children to hide among the
// others. C spawns a child named after its grandparent P ("parent") and
// one named after itself ("child"); a child named after P's id is refused
// invalid_argument (ids are the control plane's) and spawns nothing. An
// operator aborts P; a launcher attests the exits of the real P and C
// only. The record lists four nodes, each once by its id under its own
// parent: the real P and C confirmed, the two namesakes unaccounted.
func TestSeed7AChildNamedLikeAnotherNodeIsStillToldApart(t *testing.T) {
	w := newSeedWorld(t)
	ctx := context.Background()
	_, err := w.cAgent.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: w.c.Node.NodeId, Name: w.p.Node.NodeId}))
	wantRefused(t, "a child named after the grandparent's id", err, connect.CodeInvalidArgument, "look like an id")
	fakeP := spawn(t, w.cAgent, w.c.Node.NodeId, w.p.Node.Name)
	fakeC := spawn(t, w.cAgent, w.c.Node.NodeId, w.c.Node.Name)

	term := terminate(t, w.admin, w.p.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Second, time.Minute)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	for _, id := range []string{w.p.Node.NodeId, w.c.Node.NodeId} {
		if _, err := w.admin.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: id, Reason: "launcher saw it exit"})); err != nil {
			t.Fatal(err)
		}
	}
	w.clk.Advance(2 * time.Minute)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, w.admin, term.TerminationId)
	type entry struct {
		name, parent string
		outcome      tetherv1.NodeOutcome
	}
	want := map[string]entry{
		w.p.Node.NodeId:   {w.p.Node.Name, "", tetherv1.NodeOutcome_NODE_OUTCOME_CONFIRMED},
		w.c.Node.NodeId:   {w.c.Node.Name, w.p.Node.NodeId, tetherv1.NodeOutcome_NODE_OUTCOME_CONFIRMED},
		fakeP.Node.NodeId: {w.p.Node.Name, w.c.Node.NodeId, tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED},
		fakeC.Node.NodeId: {w.c.Node.Name, w.c.Node.NodeId, tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED},
	}
	got := map[string]entry{}
	for _, n := range rec.Nodes {
		if _, dup := got[n.NodeId]; dup {
			t.Errorf("node %s listed twice", n.NodeId)
		}
		got[n.NodeId] = entry{n.Name, n.ParentNodeId, n.Outcome}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("record nodes\n%v\nwant\n%v", got, want)
	}
}

// TestSeed7APrivilegeTheStoppedAgentRevokedItselfSaysSo: the record says
// which privileges were revoked and on whose word. While an operator
// drains P (its child's call in flight), P revokes the grant it delegated
// to C — its own act, true, but not the termination's. The record lists
// C's grant revoked by P at that instant and P's own grant revoked by the
// termination when it reconciled: a reader tells the stopped agent's
// revocation from the control plane's.
func TestSeed7APrivilegeTheStoppedAgentRevokedItselfSaysSo(t *testing.T) {
	w := newSeedWorld(t)
	ctx := context.Background()
	if _, err := w.begin(w.gC.token); err != nil {
		t.Fatal(err)
	}
	term := terminate(t, w.admin, w.p.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Minute, time.Second, time.Minute)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)
	w.clk.Advance(10 * time.Second)
	byP := w.clk.Now()
	if _, err := w.pAgent.Capability.Revoke(ctx, connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_GrantId{GrantId: w.gC.grant.GrantId}, Reason: "I revoked it"})); err != nil {
		t.Fatalf("the draining parent's revocation of its child's grant: %v", err)
	}
	w.clk.Advance(time.Minute) // the drain escalates; the gate never acknowledges
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_ABORTING)
	w.clk.Advance(2 * time.Second)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	reconciled := w.clk.Now()
	w.clk.Advance(2 * time.Minute)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, w.admin, term.TerminationId)
	got := map[string]string{}
	for _, p := range rec.Privileges {
		got[p.ExternalId] = fmt.Sprintf("%s by %s at %s", p.Outcome, p.RevokedBy, p.DecidedAt.AsTime().Sub(epoch))
	}
	want := map[string]string{
		w.gC.grant.GrantId: fmt.Sprintf("%s by %s at %s", tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_REVOKED, "agent:"+w.p.Node.NodeId, byP.Sub(epoch)),
		w.gP.grant.GrantId: fmt.Sprintf("%s by %s at %s", tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_REVOKED, "termination:"+term.TerminationId, reconciled.Sub(epoch)),
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("record privileges\n%v\nwant\n%v", got, want)
	}
}
