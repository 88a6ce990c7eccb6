package controlplane_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue31DAGrandparentLivingOnAGrandchildsCredentialIsNotConfirmed: a
// rogue parent was issued its child's credential at the child's spawn,
// and with it spawns a grandchild, whose credential that Spawn's answer
// gives it. Stopped with its subtree, it ends its own session, claims its
// exit and lives on as the grandchild: the grandchild's revocation feed
// stays open through the record. Only the parent's children were read
// against its bare claim (the thirtieth pass), so the record read it
// CONFIRMED by the control plane, the life put on the grandchild alone. A
// bare claim is now not corroborated while a session or stream of any
// descendant is open: the parent reads unaccounted, naming the
// grandchild. Guard: with the grandchild's feed closed before the claim,
// the parent's claim is corroborated as before.
func TestRogue31DAGrandparentLivingOnAGrandchildsCredentialIsNotConfirmed(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the tests that start a server per case; make test and CI run them.")
	}
	for _, tc := range []struct {
		name       string
		feedOpen   bool
		wantParent tetherv1.NodeOutcome
	}{
		{"the grandchild's feed held open through the record", true, tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED},
		{"the grandchild's feed closed before the claim", false, tetherv1.NodeOutcome_NODE_OUTCOME_CONFIRMED},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			clk := clock.NewManual(epoch)
			srv := testserver.Start(t, testserver.WithClock(clk))
			admin := srv.AdminClients()
			parent := register(t, admin, "rogue")
			self := parent.Node.NodeId
			child := spawn(t, srv.Clients(parent.Credential), self, "child")
			// The rogue spawns below its child, as its child.
			grandchild := spawn(t, srv.Clients(child.Credential), child.Node.NodeId, "grandchild")

			sess, err := openSession(t, srv.Clients(parent.Credential), self)
			if err != nil {
				t.Fatal(err)
			}
			fctx, fcancel := context.WithCancel(ctx)
			defer fcancel()
			feed, err := srv.Clients(grandchild.Credential).Capability.WatchRevocations(fctx, connect.NewRequest(&tetherv1.WatchRevocationsRequest{}))
			if err != nil {
				t.Fatal(err)
			}
			defer feed.Close()
			if !feed.Receive() {
				t.Fatalf("the grandchild's feed: %v", feed.Err())
			}
			endSessionStored(t, admin, clk, sess, self)
			if !tc.feedOpen {
				fcancel()
				testserver.WaitFor(t, 20*time.Second, "the grandchild's feed's end to be stored", func() bool {
					return len(getNode(t, admin, grandchild.Node.NodeId).OpenSessions) == 0
				})
			}
			clk.Advance(time.Minute)
			term := terminate(t, admin, self, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Second, time.Minute)
			if _, err := srv.Clients(parent.Credential).Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: self, Reason: "done"})); err != nil {
				t.Fatal(err)
			}
			waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
			clk.Advance(2 * time.Minute)
			waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
			rec := record(t, admin, term.TerminationId)
			rn := recordNode(t, rec, self)
			if rn.Outcome != tc.wantParent {
				t.Fatalf("record: the parent %s (confirmed by %q, claimed by %q, reason %q), want %s",
					rn.Outcome, rn.ConfirmedBy, rn.ClaimedBy, rn.UnaccountedReason, tc.wantParent)
			}
			if tc.feedOpen && (rn.ClaimedBy == "" || !strings.Contains(rn.UnaccountedReason, grandchild.Node.NodeId)) {
				t.Fatalf("record: the parent unaccounted for %q (claimed by %q), want its claim shown and the grandchild %s named",
					rn.UnaccountedReason, rn.ClaimedBy, grandchild.Node.NodeId)
			}
			if gn := recordNode(t, rec, grandchild.Node.NodeId); tc.feedOpen && gn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED {
				t.Fatalf("record: the grandchild %s, want unaccounted (its feed open)", gn.Outcome)
			}
		})
	}
}
