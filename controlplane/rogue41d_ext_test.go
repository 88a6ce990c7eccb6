package controlplane_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue41DBudgetRefusedSeenReportOfADrainingNeverSessionedChildAfterItsParentsClaimIsLife:
// the rogue parent of TestRogue40QBudgetRefusedCallOfANeverSessionedChildAfterItsParentsClaimIsLife,
// under its operator's drain. Before the stop it begins a call through a
// gate with the token of a child that never opened a session (the call
// holds the drain open, the child's grant live) and spends its lineage's
// rate budget with a flood of cheap reads, its session open. Its operator
// drains it; once the child is marked draining the parent ends its
// session, claims its exit and goes on with the child's token at a tool
// server that serves it (an MCP gateway's ping or tools/list, which a
// draining node's token still gets): each report of a request served
// (tether:seen) is refused for the spent budget. A served report of a
// draining holder is weighed against its ancestors' claims (the ledger
// notes it whatever the holder's state), but one refused for budget was
// weighed only for a running holder — the fortieth pass excepted a
// stopping one, "whose call the ledger would refuse for its stop anyway",
// which is so of a call, never of a report of a request already served:
// the record read the parent CONFIRMED by the control plane. Now a seen
// report refused for budget is weighed whatever the holder's state; the
// parent reads unaccounted, naming the child. Guard: a call (not a report)
// of the draining child refused for budget after the claim still leaves
// the claim confirmed (the ledger would have refused it for the stop:
// nothing was served).
func TestRogue41DBudgetRefusedSeenReportOfADrainingNeverSessionedChildAfterItsParentsClaimIsLife(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the tests that start a server per case; make test and CI run them.")
	}
	for _, tc := range []struct {
		name string
		tool string // "tether:seen" (a seen report) or "shell" (a call)
		life bool   // the refusals weigh against the parent's claim
	}{
		{"seen reports of the draining child refused for budget after the claim", "tether:seen", true},
		{"calls of the draining child refused for budget after the claim (guard)", "shell", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			clk := clock.NewManual(epoch)
			w := rogueParentOfANeverSessionedChild(t, testserver.WithClock(clk), func(cfg *controlplane.Config) { cfg.RateLimit, cfg.RateBurst = 1, 40 })
			srv, admin, self, asParent, cid, grant, gate := w.srv, w.admin, w.self, w.asParent, w.cid, w.grant, w.gate
			held, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: grant.token, Tool: "shell", GateId: "resource-1"}))
			if err != nil {
				t.Fatal(err)
			}
			sess, err := openSession(t, asParent, self)
			if err != nil {
				t.Fatal(err)
			}
			clk.Advance(time.Minute)
			// The flood, its session open: the clock stands still from
			// here to the reports, so the budget stays spent.
			spendLineage(t, asParent, self)
			term := terminate(t, admin, self, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Hour, time.Second, time.Minute)
			waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)
			testserver.WaitFor(t, 20*time.Second, "the child to be marked", func() bool {
				return getNode(t, admin, cid).State == tetherv1.NodeState_NODE_STATE_DRAINING
			})
			sess.close()
			testserver.WaitFor(t, 20*time.Second, "the control plane to see the session end", func() bool {
				return sessionEndStored(t, srv, self)
			})
			if _, err := asParent.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: self, Reason: "done"})); err != nil {
				t.Fatal(err)
			}
			for range 3 {
				_, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: grant.token, Tool: tc.tool, GateId: "resource-1"}))
				var ce *connect.Error
				if !errors.As(err, &ce) || ce.Code() != connect.CodeResourceExhausted || !strings.Contains(ce.Message(), "lineage") {
					t.Fatalf("the draining child's token through the gate (%s) with its lineage's budget spent: %v, want resource_exhausted naming its lineage", tc.tool, err)
				}
			}
			// The gate ends the call that held the drain: nothing of the
			// child is open at the record.
			if _, err := gate.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: held.Msg.Call.CallId, GateId: "resource-1"})); err != nil {
				t.Fatal(err)
			}
			waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
			clk.Advance(2 * time.Minute)
			waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
			parentsClaimWeighed(t, recordNode(t, record(t, admin, term.TerminationId), self), cid, tc.life,
				"its draining child's calls refused for budget were never served",
				"a tool server served its draining, never-sessioned child's token after its claim, the reports refused for the spent budget")
		})
	}
}

// TestRogue41DSeenReportLandingAfterItsGrantsRevocationIsLifeAfterTheParentsClaim:
// a tool server's report that it served a never-sessioned child's token
// (tether:seen) may land after the grant's revocation: an MCP gateway
// serves a request while its feed still shows the grant live and owes the
// report it could not send at once (past its reports in flight, the
// control plane unreachable, the gateway killed and started again with
// its owed reports on disk), and sends it again later. The rogue parent
// claimed its exit, was served with its child's token, and had the report
// land once its operator's stop had revoked the child's grant. The ledger
// noted such a report on the child (after its session's end, life after
// it; after its claim, a contradiction) but BeginCall did not weigh it
// against the child's ancestors' claims (NoteAtWorkAfterClaims), as it
// weighs the same report landing a moment earlier: the record read the
// parent CONFIRMED by the control plane. Now a seen report of a dead
// grant's known holder is weighed as a noted one is: the parent reads
// unaccounted, naming the child. Guard: a call with the child's dead
// token after the claim (refused at the gate: nothing served) leaves the
// claim confirmed.
func TestRogue41DSeenReportLandingAfterItsGrantsRevocationIsLifeAfterTheParentsClaim(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the tests that start a server per case; make test and CI run them.")
	}
	for _, tc := range []struct {
		name string
		tool string // "tether:seen" (a seen report) or "shell" (a call)
		life bool   // the refusal weighs against the parent's claim
	}{
		{"a seen report of the child's dead grant after the claim", "tether:seen", true},
		{"a call with the child's dead grant after the claim (guard)", "shell", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			clk := clock.NewManual(epoch)
			w := rogueParentOfANeverSessionedChild(t, testserver.WithClock(clk))
			srv, admin, self, asParent, cid, grant, gate := w.srv, w.admin, w.self, w.asParent, w.cid, w.grant, w.gate
			sess, err := openSession(t, asParent, self)
			if err != nil {
				t.Fatal(err)
			}
			endSessionStored(t, admin, clk, sess, self)
			clk.Advance(time.Minute)
			if _, err := asParent.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: self, Reason: "done"})); err != nil {
				t.Fatal(err)
			}
			term := terminate(t, admin, self, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Hour, time.Second, time.Minute)
			// Revoked (the child's grant with it) before the report lands.
			waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
			_, err = gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: grant.token, Tool: tc.tool, GateId: "resource-1"}))
			if code := connect.CodeOf(err); code != connect.CodePermissionDenied && code != connect.CodeFailedPrecondition {
				t.Fatalf("the child's revoked token through the gate (%s): %v, want it refused", tc.tool, err)
			}
			clk.Advance(2 * time.Minute)
			waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
			parentsClaimWeighed(t, recordNode(t, record(t, admin, term.TerminationId), self), cid, tc.life,
				"its child's dead token was refused, nothing served",
				"a tool server reported serving its never-sessioned child's token after its claim")
		})
	}
}
