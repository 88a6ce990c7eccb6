package controlplane_test

import (
	"strings"
	"testing"

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
			_, rn, callID, childID := claimWithACallOpen(t, true, tc.acked)
			if rn.Outcome != tc.want {
				t.Fatalf("record: the parent %s (confirmed by %q, claimed by %q, reason %q), want %s",
					rn.Outcome, rn.ConfirmedBy, rn.ClaimedBy, rn.UnaccountedReason, tc.want)
			}
			if !tc.acked && (rn.ClaimedBy == "" || !strings.Contains(rn.UnaccountedReason, callID) || !strings.Contains(rn.UnaccountedReason, childID)) {
				t.Fatalf("record: the parent unaccounted for %q (claimed by %q), want its claim shown and the child %s's call %s named",
					rn.UnaccountedReason, rn.ClaimedBy, childID, callID)
			}
		})
	}
}
