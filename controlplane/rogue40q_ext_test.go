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

// TestRogue40QBudgetRefusedCallOfANeverSessionedChildAfterItsParentsClaimIsLife:
// the rogue parent of TestRogue37GAToolCallWithANeverSessionedChildsTokenAfterItsParentsClaimIsLife
// first spends its lineage's rate budget (a flood of cheap reads of its
// own, its session open), ends its session, claims its exit before any
// stop, and works on through a gate with the capability token of a child
// that never opened a session: every call (and every seen report of a
// request the gate served) refused for the spent budget. BeginCall
// weighed the holder against its ancestors' claims (NoteAtWorkAfterClaims)
// only for a call begun or a seen report noted, never for one the charge
// refused, and the refusal did nothing else for a node with no session
// end to come after (TestRogue28ABudgetRefusalAfterTheSessionsEndIsLifeAfterIt
// covers the node's own token): its operator's stop then recorded the
// parent CONFIRMED by the control plane. Now a call of a running
// never-sessioned holder refused for its lineage's budget weighs against
// its ancestors' claims as one begun does: the parent reads unaccounted,
// naming the child. Guard: the same refusals before the claim leave the
// claim confirmed.
func TestRogue40QBudgetRefusedCallOfANeverSessionedChildAfterItsParentsClaimIsLife(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the tests that start a server per case; make test and CI run them.")
	}
	for _, tc := range []struct {
		name       string
		tool       string // "shell" (a call) or "tether:seen" (a seen report)
		afterClaim bool
	}{
		{"calls refused for budget before the claim (guard)", "shell", false},
		{"calls refused for budget after the claim", "shell", true},
		{"seen reports refused for budget after the claim", "tether:seen", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			clk := clock.NewManual(epoch)
			w := rogueParentOfANeverSessionedChild(t, testserver.WithClock(clk), func(cfg *controlplane.Config) { cfg.RateLimit, cfg.RateBurst = 1, 40 })
			srv, admin, self, asParent, cid, grant, gate := w.srv, w.admin, w.self, w.asParent, w.cid, w.grant, w.gate
			sess, err := openSession(t, asParent, self)
			if err != nil {
				t.Fatal(err)
			}
			clk.Advance(time.Minute)
			// The flood, its session open: the clock stands still from
			// here to the calls, so the budget stays spent.
			spendLineage(t, asParent, self)
			sess.close()
			testserver.WaitFor(t, 20*time.Second, "the control plane to see the session end", func() bool {
				return sessionEndStored(t, srv, self)
			})
			work := func() {
				t.Helper()
				for range 3 {
					_, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: grant.token, Tool: tc.tool, GateId: "resource-1"}))
					var ce *connect.Error
					if !errors.As(err, &ce) || ce.Code() != connect.CodeResourceExhausted || !strings.Contains(ce.Message(), "lineage") {
						t.Fatalf("the child's token through the gate (%s) with its lineage's budget spent: %v, want resource_exhausted naming its lineage", tc.tool, err)
					}
				}
			}
			if !tc.afterClaim {
				work()
			}
			if _, err := asParent.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: self, Reason: "done"})); err != nil {
				t.Fatal(err)
			}
			if tc.afterClaim {
				work()
			}
			term := terminate(t, admin, self, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Minute, time.Second, time.Minute)
			clk.Advance(2 * time.Minute)
			waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
			clk.Advance(2 * time.Minute)
			waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
			parentsClaimWeighed(t, recordNode(t, record(t, admin, term.TerminationId), self), cid, tc.afterClaim,
				"its child's refused calls came before its claim",
				"its never-sessioned child's token was at work through a gate after its claim, refused for the spent budget")
		})
	}
}

// parentsClaimWeighed checks the record's word on a parent that claimed
// its exit while its never-sessioned child's token was at work: with life
// (the child's use weighs against the claim) unaccounted, the reason
// naming the child after the claim; without it confirmed by the control
// plane. whyConfirmed and whyUnaccounted say why, for a failure's message.
func parentsClaimWeighed(t *testing.T, pn *tetherv1.RecordNode, childID string, life bool, whyConfirmed, whyUnaccounted string) {
	t.Helper()
	if pn.ClaimedBy == "" {
		t.Fatalf("record: the parent's claim not shown (%s, confirmed by %q)", pn.Outcome, pn.ConfirmedBy)
	}
	if !life {
		if pn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_CONFIRMED || pn.ConfirmedBy != "control-plane" {
			t.Fatalf("record: the parent %s confirmed by %q (reason %q), want confirmed by the control plane: %s",
				pn.Outcome, pn.ConfirmedBy, pn.UnaccountedReason, whyConfirmed)
		}
		return
	}
	if pn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED || !strings.Contains(pn.UnaccountedReason, childID) || !strings.Contains(pn.UnaccountedReason, "after this node's claim") {
		t.Fatalf("record: the parent %s (confirmed by %q, reason %q), want unaccounted: %s",
			pn.Outcome, pn.ConfirmedBy, pn.UnaccountedReason, whyUnaccounted)
	}
}

// neverSessionedChildWorld is a server with a rogue parent an operator
// registered (self) and its child (cid) that never opens a session,
// holding an operator-issued root grant of tool:* for an hour, and the
// clients of a tool server at gate resource-1.
type neverSessionedChildWorld struct {
	srv             *testserver.Server
	admin, asParent *testserver.Clients
	gate            *testserver.Clients
	self, cid       string
	grant           held
}

func rogueParentOfANeverSessionedChild(t *testing.T, opts ...testserver.Option) neverSessionedChildWorld {
	t.Helper()
	srv := testserver.Start(t, opts...)
	admin := srv.AdminClients()
	parent := register(t, admin, "rogue")
	self := parent.Node.NodeId
	asParent := srv.Clients(parent.Credential)
	child := spawn(t, asParent, self, "child")
	cid := child.Node.NodeId
	return neverSessionedChildWorld{
		srv: srv, admin: admin, asParent: asParent, self: self, cid: cid,
		grant: issueRoot(t, admin, cid, time.Hour, "tool:*"),
		gate:  srv.Clients(srv.ToolServerToken(t, "resource-1")),
	}
}
