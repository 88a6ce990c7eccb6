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

// TestRogue48BAnAncestorsAttestationIsWeighedAgainstTheNodesOwnLifeAfterItsEnd:
// a rogue parent, running outside the stop, holds its child's credential
// (issued to it at the spawn). The child's session ends; then the child's
// credential is seen at work (a request) after that end, and never seen
// to end since. An operator stops the child; the parent attests the
// child's exit. A bare claim is not corroborated by such an end (the
// control plane saw the node alive after it), and the parent's
// attestation is weighed as a bare claim is against a descendant seen at
// work after its end (rogue33a) — but not against the node's own life
// after its end: the record read the child CONFIRMED on the rogue
// parent's word, the life the control plane saw after the child's last
// end laundered by it. Now unaccounted, naming the attestation and the
// life after the end. Guards: nothing after the end (the attestation
// confirms, as before); an operator's (launcher's) attestation, which is
// not weighed (it watched the process end), confirms with the life after
// the end as before.
func TestRogue48BAnAncestorsAttestationIsWeighedAgainstTheNodesOwnLifeAfterItsEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the tests that start a server per case; make test and CI run them.")
	}
	for _, tc := range []struct {
		name     string
		after    bool // the child's credential at work after its session's end
		parent   bool // the parent attests
		launcher bool // an operator attests (after the parent, when both do)
		want     tetherv1.NodeOutcome
	}{
		{"the parent attests, the child at work after its end", true, true, false, tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED},
		{"the parent attests, nothing after the end (guard)", false, true, false, tetherv1.NodeOutcome_NODE_OUTCOME_CONFIRMED},
		{"a launcher attests, the child at work after its end (guard)", true, false, true, tetherv1.NodeOutcome_NODE_OUTCOME_CONFIRMED},
		{"the parent, then a launcher, attest, the child at work after its end", true, true, true, tetherv1.NodeOutcome_NODE_OUTCOME_CONFIRMED},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			clk := clock.NewManual(epoch)
			srv := testserver.Start(t, testserver.WithClock(clk))
			admin := srv.AdminClients()
			parent := register(t, admin, "rogue")
			child := spawn(t, srv.Clients(parent.Credential), parent.Node.NodeId, "child")
			self := child.Node.NodeId
			asChild := srv.Clients(child.Credential)
			sess, err := openSession(t, asChild, self)
			if err != nil {
				t.Fatal(err)
			}
			endSessionStored(t, admin, clk, sess, self)
			if tc.after {
				clk.Advance(time.Minute)
				// The parent (or the child) at work with the child's
				// credential, after the child's last end.
				if _, err := asChild.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: self})); err != nil {
					t.Fatal(err)
				}
				n := getNode(t, admin, self)
				if !n.LastSeenAt.AsTime().After(n.SessionClosedAt.AsTime()) {
					t.Fatalf("the child last seen %v, its session ended %v: want the request seen after the end", n.LastSeenAt.AsTime(), n.SessionClosedAt.AsTime())
				}
			}
			clk.Advance(time.Minute)
			term := terminate(t, admin, self, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 5*time.Second, time.Minute)
			// The record names the word that confirms: the parent's, or
			// the launcher's whenever one attested (the parent's alone
			// would not, here, when the child was at work after its end).
			attested := "agent:" + parent.Node.NodeId + " (ancestor)"
			if tc.parent {
				if _, err := srv.Clients(parent.Credential).Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: self, Reason: "it exited, I watched it"})); err != nil {
					t.Fatal(err)
				}
			}
			if tc.launcher {
				clk.Advance(time.Second)
				attested = "(launcher)"
				if _, err := admin.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: self, Reason: "its process exited"})); err != nil {
					t.Fatal(err)
				}
			}
			waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
			clk.Advance(2 * time.Minute)
			waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
			rn := recordNode(t, record(t, admin, term.TerminationId), self)
			if rn.Outcome != tc.want {
				t.Fatalf("record: the child %s (confirmed by %q, reason %q), want %s", rn.Outcome, rn.ConfirmedBy, rn.UnaccountedReason, tc.want)
			}
			switch {
			case tc.want == tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED &&
				(!strings.Contains(rn.UnaccountedReason, attested) || !strings.Contains(rn.UnaccountedReason, "after its session ended")):
				t.Fatalf("record: the child unaccounted for %q, want the attestation by %s and the life after the end named", rn.UnaccountedReason, attested)
			case tc.want == tetherv1.NodeOutcome_NODE_OUTCOME_CONFIRMED && !strings.HasSuffix(rn.ConfirmedBy, attested):
				t.Fatalf("record: the child confirmed by %q, want %s", rn.ConfirmedBy, attested)
			}
		})
	}
}
