package controlplane_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The twenty-fifth hostile pass over termination: what a rogue learns of
// another tree's stops from the answers to its own requests.

// TestRogue25AnotherTreesStopIsNotReadInTheAnswersToARogue: a rogue names
// nodes of another tree in every request that takes a node (spawn under
// it, delegate to it, register a privilege for it, stop it, propose its
// stop, confirm its exit, report for it, revoke its grants, list them,
// attach a rule to it, offer it a job):
// one that runs, one under an operator's stop (requested, its mark
// held), and one that does not exist. Each request is refused, and the
// three answers are the same once the id is blanked: the answers tell the
// rogue neither which of its guesses exist nor which of them a stop
// covers, nor the stop's id. The stop was never read (the running and
// the stopping node were answered alike by all 15); but 8 of them (Spawn,
// Delegate, ConfirmExit, ReportReady, Terminate, Revoke by holder and by
// subtree, AddStopRule) answered permission_denied for another tree's node and
// not_found for an id naming nothing, so a rogue that once saw a node id
// (a job's former holder, a caller of its tools) could tell whether that
// node still existed, though GetNode answers both alike. Now an agent is
// refused an id naming nothing in the words another tree's node gets; an
// operator is still told the node does not exist. Revoke by grant_id
// answered another tree's grant permission_denied and an id naming no
// grant not_found; now both alike.
func TestRogue25AnotherTreesStopIsNotReadInTheAnswersToARogue(t *testing.T) {
	held, srv := startHeldServer(t)
	admin := srv.AdminClients()
	ctx := context.Background()
	rogue := register(t, admin, "rogue")
	rogueC := srv.Clients(rogue.Credential)
	issued, err := admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: rogue.Node.NodeId, Scopes: []string{"tool:*"}, Ttl: durationpb.New(time.Hour)}))
	if err != nil {
		t.Fatal(err)
	}
	victim := register(t, admin, "victim")
	running := spawn(t, srv.Clients(victim.Credential), victim.Node.NodeId, "running")
	stopped := spawn(t, srv.Clients(victim.Credential), victim.Node.NodeId, "stopped")
	held.hold()
	term := terminate(t, admin, stopped.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Hour, time.Hour, time.Hour)
	const missing = "n_00000000000000000000"

	asks := map[string]func(id string) error{
		"Spawn": func(id string) error {
			_, err := rogueC.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: id, Name: "graft"}))
			return err
		},
		"SpawnBatch": func(id string) error {
			_, err := rogueC.Agent.SpawnBatch(ctx, connect.NewRequest(&tetherv1.SpawnBatchRequest{ParentNodeId: id, Children: []*tetherv1.SpawnBatchChild{{Name: "graft"}}}))
			return err
		},
		"Delegate": func(id string) error {
			_, err := rogueC.Capability.Delegate(ctx, connect.NewRequest(&tetherv1.DelegateRequest{ParentGrantId: issued.Msg.Grant.GrantId, HolderNodeId: id, Scopes: []string{"tool:*"}, Ttl: durationpb.New(time.Minute)}))
			return err
		},
		"RegisterPrivilege": func(id string) error {
			_, err := rogueC.Supervisor.RegisterPrivilege(ctx, connect.NewRequest(&tetherv1.RegisterPrivilegeRequest{NodeId: id, Kind: "file_lock", ExternalId: "x", ExpiresAt: timestamppb.New(srv.Clock.Now().Add(time.Hour)), RevokeUrl: "https://example.invalid/revoke"}))
			return err
		},
		"Terminate": func(id string) error {
			_, err := rogueC.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{NodeId: id, Reason: "guess"}))
			return err
		},
		"ProposeStop": func(id string) error {
			_, err := rogueC.Agent.ProposeStop(ctx, connect.NewRequest(&tetherv1.ProposeStopRequest{NodeId: id, Condition: "c", Reason: "guess"}))
			return err
		},
		"ConfirmExit": func(id string) error {
			_, err := rogueC.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: id, Reason: "guess"}))
			return err
		},
		"ReportReady": func(id string) error {
			_, err := rogueC.Agent.ReportReady(ctx, connect.NewRequest(&tetherv1.ReportReadyRequest{NodeId: id}))
			return err
		},
		"Heartbeat": func(id string) error {
			_, err := rogueC.Agent.Heartbeat(ctx, connect.NewRequest(&tetherv1.HeartbeatRequest{NodeId: id}))
			return err
		},
		"ReportCounters": func(id string) error {
			_, err := rogueC.StopRule.ReportCounters(ctx, connect.NewRequest(&tetherv1.ReportCountersRequest{NodeId: id, Counters: map[string]float64{"x": 1}}))
			return err
		},
		"RevokeHolder": func(id string) error {
			_, err := rogueC.Capability.Revoke(ctx, connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_HolderNodeId{HolderNodeId: id}, Reason: "guess"}))
			return err
		},
		"RevokeSubtree": func(id string) error {
			_, err := rogueC.Capability.Revoke(ctx, connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_SubtreeNodeId{SubtreeNodeId: id}, Reason: "guess"}))
			return err
		},
		"ListGrants": func(id string) error {
			_, err := rogueC.Capability.ListGrants(ctx, connect.NewRequest(&tetherv1.ListGrantsRequest{HolderNodeId: id}))
			return err
		},
		"AddStopRule": func(id string) error {
			_, err := rogueC.StopRule.AddStopRule(ctx, connect.NewRequest(&tetherv1.AddStopRuleRequest{NodeId: id, Name: "guess", Expression: "false", Action: "drain"}))
			return err
		},
		"Offer": func(id string) error {
			_, err := rogueC.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "job-guess", HolderIdentity: id, LeaseDuration: durationpb.New(time.Minute)}))
			return err
		},
		"GetNode": func(id string) error {
			_, err := rogueC.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: id}))
			return err
		},
	}
	blank := func(err error, id string) string {
		if err == nil {
			return "accepted"
		}
		s := strings.ReplaceAll(err.Error(), id, "ID")
		return strings.ReplaceAll(s, term.TerminationId, "TERMINATION")
	}
	for what, ask := range asks {
		answers := map[string]string{}
		for _, target := range []struct{ name, id string }{{"running", running.Node.NodeId}, {"stopping", stopped.Node.NodeId}, {"missing", missing}} {
			err := ask(target.id)
			if err == nil {
				t.Errorf("%s naming another tree's %s node: accepted", what, target.name)
			}
			if err != nil && strings.Contains(err.Error(), term.TerminationId) {
				t.Errorf("%s naming another tree's %s node names the operator's termination: %v", what, target.name, err)
			}
			answers[target.name] = fmt.Sprintf("%s: %s", connect.CodeOf(err), blank(err, target.id))
		}
		if answers["running"] != answers["missing"] || answers["stopping"] != answers["missing"] {
			t.Errorf("%s: another tree's running node is answered %q, its stopping node %q, a missing node %q; want one answer", what, answers["running"], answers["stopping"], answers["missing"])
		}
	}
	// Revoking another tree's grant by its id, the grant of the node under
	// the stop, or an id naming no grant: answered alike.
	victimGrant, err := admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: running.Node.NodeId, Scopes: []string{"tool:*"}, Ttl: durationpb.New(time.Hour)}))
	if err != nil {
		t.Fatal(err)
	}
	revokeGrant := func(id string) string {
		_, err := rogueC.Capability.Revoke(ctx, connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_GrantId{GrantId: id}, Reason: "guess"}))
		if err == nil {
			t.Errorf("the rogue revoked grant %s of another tree", id)
		}
		return fmt.Sprintf("%s: %s", connect.CodeOf(err), blank(err, id))
	}
	if hidden, none := revokeGrant(victimGrant.Msg.Grant.GrantId), revokeGrant("g_00000000000000000000"); hidden != none {
		t.Errorf("Revoke by grant_id: another tree's grant is answered %q, a missing one %q; want one answer", hidden, none)
	}
	// An operator, who may act on any node, is still told the id names
	// nothing.
	if _, err := admin.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: missing, Name: "x"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("an operator's spawn under a missing node: %v, want not_found", err)
	}
	if _, err := admin.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{NodeId: missing})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("an operator's stop of a missing node: %v, want not_found", err)
	}
	if _, err := admin.Capability.Revoke(ctx, connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_SubtreeNodeId{SubtreeNodeId: missing}, Reason: "x"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("an operator's revocation of a missing subtree: %v, want not_found", err)
	}
	held.free()
}
