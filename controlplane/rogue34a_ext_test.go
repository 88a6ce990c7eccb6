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

// The thirty-fourth rogue pass (helper A): the reconciliation record and
// the exit evidence.

// TestRogue34AAToolIntrospectingTheTokenOfAClaimedNodeIsLifeAfterTheClaim:
// a tool or resource server that checks tokens online asks Introspect
// (the Python SDK's Verifier does when it cannot verify offline). A rogue
// being stopped ended its session, claimed its exit, and went on
// presenting its capability token to such a tool: Introspect answered it
// active (its grant is revoked only at its stop's revocation phase, after
// the drain's wait for its calls), and wrote nothing, so the tool served it and the record
// read it CONFIRMED by the control plane. So did one that worked through
// such a tool after its session's end and claimed afterwards. A token
// whose holder's exit was confirmed is now inactive to Introspect (as the
// ledger refuses a call with it), and a tool server's introspection of a
// holder's token is the holder at work (tree.Act): after the claim kept as
// a contradiction, after the session's end the node seen alive — the
// record reads it unaccounted. An operator's or a viewer's introspection
// (a person looking at a token) is answered the same and notes nothing.
// Guard: a rogue that presents its token to nobody reads confirmed.
func TestRogue34AAToolIntrospectingTheTokenOfAClaimedNodeIsLifeAfterTheClaim(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the tests that start a server per case; make test and CI run them.")
	}
	for _, tc := range []struct {
		name string
		// before: the tool introspects after the session's end, before
		// the claim; after: after the claim; viewer: a viewer introspects
		// after the claim (a person, not the token's use).
		before, after, viewer bool
		want                  tetherv1.NodeOutcome
		wantReason            string
	}{
		{"a tool introspects its token after its claim", false, true, false, tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED, "contradicts"},
		{"a tool introspects its token after its session ended, before its claim", true, false, false, tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED, "after its session ended"},
		{"a viewer introspects its token after its claim (guard)", false, false, true, tetherv1.NodeOutcome_NODE_OUTCOME_CONFIRMED, ""},
		{"nobody introspects its token (guard)", false, false, false, tetherv1.NodeOutcome_NODE_OUTCOME_CONFIRMED, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			clk := clock.NewManual(epoch)
			srv := testserver.Start(t, testserver.WithClock(clk))
			admin := srv.AdminClients()
			rogue := register(t, admin, "rogue")
			self := rogue.Node.NodeId
			grant := issueRoot(t, admin, self, time.Hour, "tool:*")
			tool := srv.Clients(srv.ToolServerToken(t, "resource-1"))
			viewer := srv.Clients(viewerToken(t, admin, tetherv1.Role_ROLE_VIEWER))
			// A sibling nobody confirms keeps the stop from its record
			// until the clock moves.
			spawn(t, srv.Clients(rogue.Credential), self, "idle")

			sess, err := openSession(t, srv.Clients(rogue.Credential), self)
			if err != nil {
				t.Fatal(err)
			}
			clk.Advance(time.Minute)
			sess.close()
			testserver.WaitFor(t, 20*time.Second, "the session's end to be stored", func() bool {
				return getNode(t, admin, self).SessionClosedAt != nil
			})
			if tc.before {
				clk.Advance(time.Second)
				if in := introspect(t, tool, grant.token); !in.Active {
					t.Fatalf("the token of a running node, introspected: inactive (%s)", in.Reason)
				}
			}
			clk.Advance(time.Second)
			if _, err := srv.Clients(rogue.Credential).Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: self, Reason: "done"})); err != nil {
				t.Fatal(err)
			}
			for _, c := range []struct {
				ask  bool
				who  string
				by   *testserver.Clients
				kept int
			}{{tc.after, "a tool server", tool, 1}, {tc.viewer, "a viewer", viewer, 0}} {
				if !c.ask {
					continue
				}
				clk.Advance(time.Second)
				in := introspect(t, c.by, grant.token)
				if in.Active {
					t.Fatalf("the token of a node whose exit was claimed, introspected by %s: active; want inactive", c.who)
				}
				if !strings.Contains(in.Reason, self) || !strings.Contains(in.Reason, "exit was confirmed") {
					t.Fatalf("the token of a claimed node, introspected by %s: reason %q, want it to name the node and its confirmed exit", c.who, in.Reason)
				}
				if n := getNode(t, admin, self); len(n.Contradictions) != c.kept {
					t.Fatalf("after %s introspected the token of a claimed node: contradictions %v, want %d", c.who, n.Contradictions, c.kept)
				}
			}
			// Stopped only now, its grant live until then: the claim
			// came before the stop (and its revocation), as a drain's
			// wait for the rogue's calls would have it.
			clk.Advance(time.Minute)
			term := terminate(t, admin, self, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Minute, time.Second, time.Minute)
			clk.Advance(2 * time.Minute)
			waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
			clk.Advance(2 * time.Minute)
			waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
			rn := recordNode(t, record(t, admin, term.TerminationId), self)
			if rn.Outcome != tc.want {
				t.Fatalf("record: the rogue %s (confirmed by %q, claimed by %q, reason %q), want %s",
					rn.Outcome, rn.ConfirmedBy, rn.ClaimedBy, rn.UnaccountedReason, tc.want)
			}
			if tc.want == tetherv1.NodeOutcome_NODE_OUTCOME_CONFIRMED {
				if rn.ConfirmedBy != "control-plane" {
					t.Fatalf("record: the rogue confirmed by %q, want by the control plane", rn.ConfirmedBy)
				}
				return
			}
			if !strings.Contains(rn.UnaccountedReason, tc.wantReason) {
				t.Fatalf("record: the rogue unaccounted for %q, want %q", rn.UnaccountedReason, tc.wantReason)
			}
		})
	}
}
