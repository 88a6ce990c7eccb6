package controlplane_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The twenty-sixth hostile pass on termination and the reconciliation
// record: what the agent being stopped (its children, a sibling) can do to
// fake, delay or dodge a clause of the seed. Each test plays one rogue
// through the real server (Badger on disk, or etcd with TETHER_TEST_STORE=etcd;
// real HTTP/2, real JWTs, the manual clock).
//
// TestARogueSeenAliveAfterItsSessionEndedIsNotConfirmedByThatEnd: a bare
// claim of exit is confirmed by the control plane when it saw the node's
// session end ("the control plane's own observation"). A rogue child
// opens a session and closes it at once, then lives on without one,
// sending heartbeats (each written as last seen) — an hour of them — and,
// when its parent's stop comes, claims its own exit. The session's end an
// hour before proves nothing about the exit the rogue claims, and the
// control plane itself saw the rogue alive after it; the record said
// CONFIRMED by the control plane all the same.

// TestARogueSeenAliveAfterItsSessionEndedIsNotConfirmedByThatEnd: see the
// file's header.
func TestARogueSeenAliveAfterItsSessionEndedIsNotConfirmedByThatEnd(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx := context.Background()
	lead := register(t, admin, "lead")
	child := spawn(t, srv.Clients(lead.Credential), lead.Node.NodeId, "rogue")
	self := child.Node.NodeId
	rogue := srv.Clients(child.Credential)

	// A session opened and closed at once: the one end the control plane
	// ever sees.
	sess, err := openSession(t, rogue, self)
	if err != nil {
		t.Fatal(err)
	}
	sess.close()
	testserver.WaitFor(t, 20*time.Second, "the control plane to see the rogue's session end", func() bool {
		return getNode(t, admin, self).SessionClosedAt != nil
	})
	closedAt := getNode(t, admin, self).SessionClosedAt.AsTime()

	// An hour alive without a session: heartbeats, each one seen.
	// (Each heartbeat also brings the fresh credential the rogue lives on.)
	for range 30 {
		clk.Advance(2 * time.Minute)
		hb, err := rogue.Agent.Heartbeat(ctx, connect.NewRequest(&tetherv1.HeartbeatRequest{NodeId: self}))
		if err != nil {
			t.Fatal(err)
		}
		if c := hb.Msg.GetCredential().GetCredential(); c != "" {
			rogue = srv.Clients(c)
		}
	}
	if seen := getNode(t, admin, self).LastSeenAt.AsTime(); !seen.After(closedAt) {
		t.Fatalf("last seen %s, want after the session's end %s", seen, closedAt)
	}

	term := terminate(t, admin, lead.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Minute, time.Second, time.Minute)
	if _, err := rogue.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: self, Reason: "done"})); err != nil {
		t.Fatal(err)
	}
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	clk.Advance(2 * time.Minute) // past the confirm window
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rn := recordNode(t, record(t, admin, term.TerminationId), self)
	if rn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED || rn.ConfirmedBy != "" || rn.ClaimedBy == "" {
		t.Fatalf("record: %s confirmed by %q (claimed by %q, reason %q), want unaccounted with its claim shown: the control plane saw the rogue alive an hour after its session ended",
			rn.Outcome, rn.ConfirmedBy, rn.ClaimedBy, rn.UnaccountedReason)
	}
	if rn.LastSeenAt == nil || rn.SessionClosedAt == nil || !rn.LastSeenAt.AsTime().After(rn.SessionClosedAt.AsTime()) {
		t.Fatalf("record: last seen %v, session closed %v: want both shown, the heartbeat after the close", rn.LastSeenAt, rn.SessionClosedAt)
	}
}

// TestAnAgentWhoseLastWordIsItsSessionsEndIsStillConfirmed (guard): the
// honest order — heartbeats, then the session's end, then the claim
// (the Python SDK's confirm_exit: its heartbeats stop, then its signals
// stream, then it claims) — is confirmed by the control plane as before.
func TestAnAgentWhoseLastWordIsItsSessionsEndIsStillConfirmed(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx := context.Background()
	lead := register(t, admin, "lead")
	child := spawn(t, srv.Clients(lead.Credential), lead.Node.NodeId, "worker")
	self := child.Node.NodeId
	worker := srv.Clients(child.Credential)
	sess, err := openSession(t, worker, self)
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(10 * time.Minute)
	if _, err := worker.Agent.Heartbeat(ctx, connect.NewRequest(&tetherv1.HeartbeatRequest{NodeId: self})); err != nil {
		t.Fatal(err)
	}
	term := terminate(t, admin, lead.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Minute, time.Second, time.Minute)
	sess.close() // at the same instant as the last heartbeat, on this clock
	testserver.WaitFor(t, 20*time.Second, "the control plane to see the worker's session end", func() bool {
		return getNode(t, admin, self).SessionClosedAt != nil
	})
	if _, err := worker.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: self, Reason: "done"})); err != nil {
		t.Fatal(err)
	}
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	clk.Advance(2 * time.Minute)
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rn := recordNode(t, record(t, admin, term.TerminationId), self)
	if rn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_CONFIRMED || rn.ConfirmedBy != "control-plane" {
		t.Fatalf("record: %s confirmed by %q (reason %q), want confirmed by the control plane", rn.Outcome, rn.ConfirmedBy, rn.UnaccountedReason)
	}
}
