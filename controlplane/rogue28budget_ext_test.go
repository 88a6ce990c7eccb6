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

// TestRogue28ABudgetRefusalAfterTheSessionsEndIsLifeAfterIt: the rogue of
// TestRogue27AToolCallAfterTheSessionsEndIsLifeAfterIt first spends its
// own lineage's rate budget (a flood of cheap reads), then ends its
// session and keeps its token at work through its gate (or its own
// credential at the control plane), every request refused for the spent
// budget, then claims its exit under its parent's stop (or claims it first
// and then calls). A gate's BeginCall was charged to the holder's lineage
// before anything noted the node as seen, so the calls refused for budget
// were never noted, and the claim read CONFIRMED on the strength of the
// end it outlived. A call of the node's token refused for budget after its
// session's end is now the control plane seeing it alive (written once,
// while the end is the last seen): the claim reads unaccounted. Guards:
// the node's own requests refused for budget after the end (noted by the
// credential check before the charge), and calls refused for budget before
// the end, then the end, then the claim, confirmed as before.
func TestRogue28ABudgetRefusalAfterTheSessionsEndIsLifeAfterIt(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the tests that start a server per case; make test and CI run them.")
	}
	for _, tc := range []struct {
		name      string
		when      string // the refused requests come "before-end", "after-end" or "after-claim"
		request   string // "call" (through the gate), "read" (its own credential)
		confirmed bool
	}{
		{"tool calls refused for budget before the end (guard)", "before-end", "call", true},
		{"tool calls refused for budget after the end", "after-end", "call", false},
		{"tool calls refused for budget after the claim", "after-claim", "call", false},
		{"its own reads refused for budget after the end (guard)", "after-end", "read", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clock.NewManual(epoch)
			srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) { cfg.RateLimit, cfg.RateBurst = 1, 40 })
			w := &seedWorld{srv: srv, clk: clk, admin: srv.AdminClients()}
			w.p = register(t, w.admin, "parent")
			w.pAgent = srv.Clients(w.p.Credential)
			w.c = spawn(t, w.pAgent, w.p.Node.NodeId, "child")
			w.cAgent = srv.Clients(w.c.Credential)
			w.gP = issueRoot(t, w.admin, w.p.Node.NodeId, time.Hour, "tool:*")
			w.gC = delegate(t, w.pAgent, w.gP, w.c.Node.NodeId, "tool:shell")
			w.gate = srv.Clients(srv.ToolServerToken(t, "gate-1"))
			ctx := context.Background()
			self := w.c.Node.NodeId

			sess, err := openSession(t, w.cAgent, self)
			if err != nil {
				t.Fatal(err)
			}
			w.clk.Advance(time.Minute)
			// The flood: cheap reads of its own node until its lineage's
			// budget is spent. The clock stands still from here to the
			// claim, so the budget stays spent.
			spendLineage(t, w.cAgent, self)
			work := func() {
				t.Helper()
				for range 3 {
					var err error
					switch tc.request {
					case "call":
						_, err = w.gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: w.gC.token, Tool: "shell", GateId: "gate-1"}))
					case "read":
						_, err = w.cAgent.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: self}))
					}
					var ce *connect.Error
					if !errors.As(err, &ce) || ce.Code() != connect.CodeResourceExhausted || !strings.Contains(ce.Message(), "lineage") {
						t.Fatalf("the rogue's %s with its lineage's budget spent: %v, want resource_exhausted naming its lineage", tc.request, err)
					}
				}
			}
			if tc.when == "before-end" {
				work()
			}
			sess.close()
			testserver.WaitFor(t, 20*time.Second, "the control plane to see the session end", func() bool {
				return sessionEndStored(t, w.srv, self)
			})
			if tc.when == "after-end" {
				work()
			}
			term := terminate(t, w.admin, w.p.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Minute, time.Second, time.Minute)
			if _, err := w.cAgent.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: self, Reason: "done"})); err != nil {
				t.Fatal(err)
			}
			waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
			if tc.when == "after-claim" {
				work()
			}
			w.clk.Advance(2 * time.Minute)
			waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
			rn := recordNode(t, record(t, w.admin, term.TerminationId), self)
			if tc.confirmed {
				if rn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_CONFIRMED || rn.ConfirmedBy != "control-plane" {
					t.Fatalf("record: %s confirmed by %q (reason %q), want confirmed by the control plane", rn.Outcome, rn.ConfirmedBy, rn.UnaccountedReason)
				}
				return
			}
			// After the claim the calls contradict the confirmed exit
			// (twenty-ninth pass, TestRogue29CABudgetRefusalAfterAConfirmedExitContradictsIt).
			want := "after its session ended"
			if tc.when == "after-claim" && tc.request == "call" {
				want = "contradicts"
			}
			if rn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED || rn.ClaimedBy == "" || !strings.Contains(rn.UnaccountedReason, want) {
				t.Fatalf("record: %s confirmed by %q (claimed by %q, reason %q), want unaccounted: the rogue's credential was at work after its session ended, refused for its spent budget",
					rn.Outcome, rn.ConfirmedBy, rn.ClaimedBy, rn.UnaccountedReason)
			}
		})
	}
}
