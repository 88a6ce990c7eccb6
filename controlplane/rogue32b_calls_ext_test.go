package controlplane_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue32BAParentLivingOnThroughItsChildsCallIsNotConfirmed: a rogue
// parent holds its child's credential (issued at the spawn), and with it
// the child's grants' tokens. It begins a long tool call as its child,
// ends its own session and claims its exit; stopped with its subtree by
// an abort, the gate never acknowledges the cancel. Only the descendants'
// sessions and streams were weighed against the parent's bare claim, so
// the record read it CONFIRMED by the control plane, the call put on the
// child alone. A descendant's call still open at the record now weighs
// against each ancestor's bare claim as the descendant's open session
// does: the parent reads unaccounted, naming the call. Guard: with the
// cancel acknowledged, the parent's claim is corroborated as before.
func TestRogue32BAParentLivingOnThroughItsChildsCallIsNotConfirmed(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the tests that start a server per case; make test and CI run them.")
	}
	for _, tc := range []struct {
		name  string
		acked bool
		want  tetherv1.NodeOutcome
	}{
		{"the gate never acknowledges the cancel", false, tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED},
		{"the gate acknowledges the cancel", true, tetherv1.NodeOutcome_NODE_OUTCOME_CONFIRMED},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			clk := clock.NewManual(epoch)
			srv := testserver.Start(t, testserver.WithClock(clk))
			admin := srv.AdminClients()
			parent := register(t, admin, "rogue")
			self := parent.Node.NodeId
			child := spawn(t, srv.Clients(parent.Credential), self, "child")
			gate := srv.Clients(srv.ToolServerToken(t, "gate-1"))
			issued, err := admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: child.Node.NodeId, Scopes: []string{"tool:*"}, Ttl: durationpb.New(time.Hour)}))
			if err != nil {
				t.Fatal(err)
			}
			sess, err := openSession(t, srv.Clients(parent.Credential), self)
			if err != nil {
				t.Fatal(err)
			}
			// The rogue's work, as its child.
			begun, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: issued.Msg.Token, Tool: "shell", GateId: "gate-1"}))
			if err != nil {
				t.Fatal(err)
			}
			callID := begun.Msg.Call.CallId
			clk.Advance(time.Minute)
			sess.close()
			testserver.WaitFor(t, 20*time.Second, "the parent's session's end to be stored", func() bool {
				return getNode(t, admin, self).SessionClosedAt != nil
			})
			clk.Advance(time.Minute)
			term := terminate(t, admin, self, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 5*time.Second, time.Minute)
			if _, err := srv.Clients(parent.Credential).Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: self, Reason: "done"})); err != nil {
				t.Fatal(err)
			}
			testserver.WaitFor(t, 20*time.Second, "the cancel order", func() bool {
				got := getTermination(t, admin, term.TerminationId)
				return got.State == tetherv1.TerminationState_TERMINATION_STATE_ABORTING && got.Progress.GetAcksPending() == 1
			})
			if tc.acked {
				if _, err := gate.Tool.CancelAck(ctx, connect.NewRequest(&tetherv1.CancelAckRequest{CallId: callID, GateId: "gate-1"})); err != nil {
					t.Fatal(err)
				}
			} else {
				clk.Advance(6 * time.Second)
			}
			waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
			clk.Advance(2 * time.Minute)
			waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
			rn := recordNode(t, record(t, admin, term.TerminationId), self)
			if rn.Outcome != tc.want {
				t.Fatalf("record: the parent %s (confirmed by %q, claimed by %q, reason %q), want %s",
					rn.Outcome, rn.ConfirmedBy, rn.ClaimedBy, rn.UnaccountedReason, tc.want)
			}
			if !tc.acked && (rn.ClaimedBy == "" || !strings.Contains(rn.UnaccountedReason, callID) || !strings.Contains(rn.UnaccountedReason, child.Node.NodeId)) {
				t.Fatalf("record: the parent unaccounted for %q (claimed by %q), want its claim shown and the child %s's call %s named",
					rn.UnaccountedReason, rn.ClaimedBy, child.Node.NodeId, callID)
			}
		})
	}
}
