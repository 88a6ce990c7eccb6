package controlplane_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/id"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue42NRemovingAnotherTreesRuleReadsAsNoSuchRule plays a rogue
// agent naming, in RemoveStopRule, the id of a stop rule another tree's
// agent attached to its own node, and the id of no rule at all. The first
// was refused permission_denied ("may not remove rule ..."), the second
// not_found: the rogue learnt by the code whether another tree's rule
// exists, which GetNode, GetGrant, GetLease and TestStopRule's rule_id all
// keep from it. Both now read as a rule that does not exist, the rule is
// kept, and the victim's own ancestor is still told it may not remove a
// rule it can see.
func TestRogue42NRemovingAnotherTreesRuleReadsAsNoSuchRule(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	ctx := context.Background()
	rogueRoot := register(t, admin, "rogue")
	rogue := srv.Clients(rogueRoot.Credential)
	victimRoot := register(t, admin, "victim")
	victim := spawn(t, srv.Clients(victimRoot.Credential), victimRoot.Node.NodeId, "worker")
	added, err := srv.Clients(victim.Credential).StopRule.AddStopRule(ctx, connect.NewRequest(&tetherv1.AddStopRuleRequest{
		NodeId: victim.Node.NodeId, Name: "budget", Expression: "observed.subtree_calls > 100000", Action: "drain",
	}))
	if err != nil {
		t.Fatal(err)
	}
	existing, ghost := added.Msg.Rule.RuleId, id.New(id.StopRule)

	remove := func(c *testserver.Clients, ruleID string) *connect.Error {
		_, err := c.StopRule.RemoveStopRule(ctx, connect.NewRequest(&tetherv1.RemoveStopRuleRequest{RuleId: ruleID}))
		var ce *connect.Error
		if err == nil || !errors.As(err, &ce) {
			t.Fatalf("removing rule %s: %v, want a refusal", ruleID, err)
		}
		return ce
	}
	ofExisting, ofGhost := remove(rogue, existing), remove(rogue, ghost)
	t.Logf("another tree's rule: %v; no rule: %v", ofExisting, ofGhost)
	if ofExisting.Code() != ofGhost.Code() || strings.ReplaceAll(ofExisting.Message(), existing, "ID") != strings.ReplaceAll(ofGhost.Message(), ghost, "ID") {
		t.Errorf("a rogue tells another tree's rule from no rule by RemoveStopRule's answer: %v, against %v", ofExisting, ofGhost)
	}
	if ofGhost.Code() != connect.CodeNotFound {
		t.Errorf("no rule: %v, want not_found", ofGhost)
	}
	// The rule is kept.
	if _, err := srv.Clients(victim.Credential).StopRule.TestStopRule(ctx, connect.NewRequest(&tetherv1.TestStopRuleRequest{NodeId: victim.Node.NodeId, RuleId: existing})); err != nil {
		t.Errorf("the victim's rule after the rogue's removals: %v", err)
	}
	// The victim's child sees the rule (inherited) and may not remove it,
	// as before: told so.
	child := spawn(t, srv.Clients(victim.Credential), victim.Node.NodeId, "child")
	if ce := remove(srv.Clients(child.Credential), existing); ce.Code() != connect.CodePermissionDenied {
		t.Errorf("the victim's child removing its parent's rule: %v, want permission_denied", ce)
	}
}
