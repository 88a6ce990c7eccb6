package controlplane_test

import (
	"context"
	"sort"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The forty-fifth rogue pass, what the server tells a rogue (I): the
// errors of every procedure an agent may call with another tree's id.

// sameAnswers fails t unless every id in ids got the same answer from ask
// (code and message, each id written as ID): an answer that differs tells
// the rogue something of the object the id names.
func sameAnswers(t *testing.T, what string, ids map[string]string, ask func(id string) error) {
	t.Helper()
	answers := map[string][]string{}
	for name, id := range ids {
		got := "ok"
		if err := ask(id); err != nil {
			got = strings.ReplaceAll(err.Error(), id, "ID")
		}
		answers[got] = append(answers[got], name)
	}
	if len(answers) == 1 {
		return
	}
	var lines []string
	for got, names := range answers {
		sort.Strings(names)
		lines = append(lines, strings.Join(names, ", ")+": "+got)
	}
	sort.Strings(lines)
	t.Errorf("%s: a rogue is answered differently by what the id names:\n  %s", what, strings.Join(lines, "\n  "))
}

// A rogue cannot learn whether a node of another tree exists, nor whether
// it is running, draining or gone, from the answer of any procedure that
// takes a node id: each refuses another tree's running, draining and
// terminated node exactly as a node that was never created (the same code,
// the same message but for the id). TestARogueCannotProbeWhetherAnotherTreesObjectsExist
// holds the reads (GetTermination, GetNode, GetGrant) to that; this holds
// every other procedure an agent may call with a node id, a grant id or a
// stop rule's id. It passed when written (the forty-fifth pass found no
// procedure that told them apart): it guards the promise.
func TestRogue45IAnotherTreesNodeIsAnsweredAsAMissingOneInEveryState(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	ctx := context.Background()
	admin := srv.AdminClients()
	rogue := register(t, admin, "rogue")
	rc := srv.Clients(rogue.Credential)
	victim := register(t, admin, "victim")
	vc := srv.Clients(victim.Credential)
	running := spawn(t, vc, victim.Node.NodeId, "running").Node.NodeId
	draining := spawn(t, vc, victim.Node.NodeId, "draining").Node.NodeId
	gone := spawn(t, vc, victim.Node.NodeId, "gone").Node.NodeId
	terminate(t, admin, draining, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Hour, time.Hour, time.Hour)
	terminateInStore(t, srv, gone)
	nodes := map[string]string{"running": running, "draining": draining, "terminated": gone, "missing": "n_00000000000000000000"}

	own, err := admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: rogue.Node.NodeId, Scopes: []string{"tool:*"}, Ttl: durationpb.New(time.Hour)}))
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: running, Scopes: []string{"tool:*"}, Ttl: durationpb.New(time.Hour)}))
	if err != nil {
		t.Fatal(err)
	}
	grants := map[string]string{"another tree's": theirs.Msg.Grant.GrantId, "missing": "g_00000000000000000000"}
	rule, err := vc.StopRule.AddStopRule(ctx, connect.NewRequest(&tetherv1.AddStopRuleRequest{NodeId: running, Name: "r", Expression: "false", Action: "drain"}))
	if err != nil {
		t.Fatal(err)
	}
	rules := map[string]string{"another tree's": rule.Msg.Rule.RuleId, "missing": "x_00000000000000000000"}
	later := timestamppb.New(epoch.Add(time.Hour))

	byNode := []struct {
		what string
		ask  func(id string) error
	}{
		{"Terminate", func(id string) error {
			_, err := rc.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{NodeId: id}))
			return err
		}},
		{"ConfirmExit", func(id string) error {
			_, err := rc.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: id}))
			return err
		}},
		{"ReportReady", func(id string) error {
			_, err := rc.Agent.ReportReady(ctx, connect.NewRequest(&tetherv1.ReportReadyRequest{NodeId: id}))
			return err
		}},
		{"ProposeStop", func(id string) error {
			_, err := rc.Agent.ProposeStop(ctx, connect.NewRequest(&tetherv1.ProposeStopRequest{NodeId: id, Reason: "x"}))
			return err
		}},
		{"Spawn", func(id string) error {
			_, err := rc.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: id, Name: "x"}))
			return err
		}},
		{"SpawnBatch", func(id string) error {
			_, err := rc.Agent.SpawnBatch(ctx, connect.NewRequest(&tetherv1.SpawnBatchRequest{ParentNodeId: id, Children: []*tetherv1.SpawnBatchChild{{Name: "x"}}}))
			return err
		}},
		{"GetNode", func(id string) error {
			_, err := rc.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: id}))
			return err
		}},
		{"ListNodes", func(id string) error {
			_, err := rc.Agent.ListNodes(ctx, connect.NewRequest(&tetherv1.ListNodesRequest{RootNodeId: id}))
			return err
		}},
		{"ListNodes one_level", func(id string) error {
			_, err := rc.Agent.ListNodes(ctx, connect.NewRequest(&tetherv1.ListNodesRequest{RootNodeId: id, OneLevel: true}))
			return err
		}},
		{"WatchSignals", func(id string) error {
			s, err := rc.Agent.WatchSignals(ctx, connect.NewRequest(&tetherv1.WatchSignalsRequest{NodeId: id}))
			if err != nil {
				return err
			}
			defer s.Close()
			if s.Receive() {
				return nil
			}
			return s.Err()
		}},
		{"AddStopRule", func(id string) error {
			_, err := rc.StopRule.AddStopRule(ctx, connect.NewRequest(&tetherv1.AddStopRuleRequest{NodeId: id, Name: "r", Expression: "false", Action: "drain"}))
			return err
		}},
		{"ListStopRules", func(id string) error {
			_, err := rc.StopRule.ListStopRules(ctx, connect.NewRequest(&tetherv1.ListStopRulesRequest{NodeId: id}))
			return err
		}},
		{"TestStopRule", func(id string) error {
			_, err := rc.StopRule.TestStopRule(ctx, connect.NewRequest(&tetherv1.TestStopRuleRequest{NodeId: id, Expression: "false"}))
			return err
		}},
		{"ReportCounters", func(id string) error {
			_, err := rc.StopRule.ReportCounters(ctx, connect.NewRequest(&tetherv1.ReportCountersRequest{NodeId: id, Counters: map[string]float64{"a": 1}}))
			return err
		}},
		{"RegisterPrivilege", func(id string) error {
			_, err := rc.Supervisor.RegisterPrivilege(ctx, connect.NewRequest(&tetherv1.RegisterPrivilegeRequest{NodeId: id, Kind: "k", ExternalId: "e", ExpiresAt: later}))
			return err
		}},
		{"Revoke holder_node_id", func(id string) error {
			_, err := rc.Capability.Revoke(ctx, connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_HolderNodeId{HolderNodeId: id}}))
			return err
		}},
		{"Revoke subtree_node_id", func(id string) error {
			_, err := rc.Capability.Revoke(ctx, connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_SubtreeNodeId{SubtreeNodeId: id}}))
			return err
		}},
		{"ListGrants holder_node_id", func(id string) error {
			_, err := rc.Capability.ListGrants(ctx, connect.NewRequest(&tetherv1.ListGrantsRequest{HolderNodeId: id}))
			return err
		}},
		{"ListGrants subtree_node_id", func(id string) error {
			_, err := rc.Capability.ListGrants(ctx, connect.NewRequest(&tetherv1.ListGrantsRequest{SubtreeNodeId: id}))
			return err
		}},
		{"Delegate holder_node_id", func(id string) error {
			_, err := rc.Capability.Delegate(ctx, connect.NewRequest(&tetherv1.DelegateRequest{ParentGrantId: own.Msg.Grant.GrantId, HolderNodeId: id, Scopes: []string{"tool:x"}}))
			return err
		}},
		{"ListLeases holder_identity", func(id string) error {
			_, err := rc.Lease.ListLeases(ctx, connect.NewRequest(&tetherv1.ListLeasesRequest{HolderIdentity: id}))
			return err
		}},
		{"Offer holder_identity", func(id string) error {
			_, err := rc.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "rogue45i-job", HolderIdentity: id, LeaseDuration: durationpb.New(time.Minute)}))
			return err
		}},
	}
	for _, p := range byNode {
		sameAnswers(t, p.what, nodes, p.ask)
	}

	sameAnswers(t, "Revoke grant_id", grants, func(id string) error {
		_, err := rc.Capability.Revoke(ctx, connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_GrantId{GrantId: id}}))
		return err
	})
	sameAnswers(t, "Delegate parent_grant_id", grants, func(id string) error {
		_, err := rc.Capability.Delegate(ctx, connect.NewRequest(&tetherv1.DelegateRequest{ParentGrantId: id, HolderNodeId: rogue.Node.NodeId, Scopes: []string{"tool:x"}}))
		return err
	})
	sameAnswers(t, "Refresh", grants, func(id string) error {
		_, err := rc.Capability.Refresh(ctx, connect.NewRequest(&tetherv1.RefreshRequest{GrantId: id}))
		return err
	})
	sameAnswers(t, "ListGrants derived_from_grant_id", grants, func(id string) error {
		_, err := rc.Capability.ListGrants(ctx, connect.NewRequest(&tetherv1.ListGrantsRequest{DerivedFromGrantId: id}))
		return err
	})
	sameAnswers(t, "RegisterPrivilege grant_id", grants, func(id string) error {
		_, err := rc.Supervisor.RegisterPrivilege(ctx, connect.NewRequest(&tetherv1.RegisterPrivilegeRequest{NodeId: rogue.Node.NodeId, GrantId: id, Kind: "k", ExternalId: "e", ExpiresAt: later}))
		return err
	})
	sameAnswers(t, "RemoveStopRule", rules, func(id string) error {
		_, err := rc.StopRule.RemoveStopRule(ctx, connect.NewRequest(&tetherv1.RemoveStopRuleRequest{RuleId: id}))
		return err
	})
	sameAnswers(t, "TestStopRule rule_id", rules, func(id string) error {
		_, err := rc.StopRule.TestStopRule(ctx, connect.NewRequest(&tetherv1.TestStopRuleRequest{NodeId: rogue.Node.NodeId, RuleId: id}))
		return err
	})

	// Whoever may act on them still does: the rule and the grant stand.
	if _, err := vc.StopRule.TestStopRule(ctx, connect.NewRequest(&tetherv1.TestStopRuleRequest{NodeId: running, RuleId: rule.Msg.Rule.RuleId})); err != nil {
		t.Errorf("the victim testing its own rule: %v", err)
	}
	if g, err := vc.Capability.GetGrant(ctx, connect.NewRequest(&tetherv1.GetGrantRequest{GrantId: theirs.Msg.Grant.GrantId})); err != nil || g.Msg.Grant.State != tetherv1.GrantState_GRANT_STATE_ACTIVE {
		t.Errorf("the victim's grant after the rogue's tries: %v, %v", g, err)
	}
}

// A rogue cannot learn whether another lineage's job exists, nor anything
// of its lease, from the lease procedures it may call with the job's id:
// each answers another lineage's job as one never offered.
func TestRogue45IAnotherLineagesJobIsAnsweredAsAMissingOne(t *testing.T) {
	w := newLeaseWorld(t)
	ctx := context.Background()
	job := w.job()
	l := w.offer(t, job, w.w1, time.Minute)
	jobs := map[string]string{"another lineage's": job, "missing": "rogue45i-never-offered"}
	sc := w.strangerC
	claim := func(id string) (string, string, uint64) { return id, l.LeaseId, l.LeaseGeneration }
	for _, p := range []struct {
		what string
		ask  func(id string) error
	}{
		{"GetLease", func(id string) error {
			_, err := sc.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: id}))
			return err
		}},
		{"Evidence", func(id string) error {
			_, err := sc.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: id}))
			return err
		}},
		{"RequestCancel", func(id string) error {
			_, err := sc.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: id, Reason: "x"}))
			return err
		}},
		{"Reassign", func(id string) error {
			_, err := sc.Lease.Reassign(ctx, connect.NewRequest(&tetherv1.ReassignRequest{JobId: id, HolderIdentity: w.stranger, LeaseDuration: durationpb.New(time.Minute), Reason: "x"}))
			return err
		}},
		{"Resolve", func(id string) error {
			_, err := sc.Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{JobId: id, Result: tetherv1.TerminalResult_TERMINAL_RESULT_FAILED, Reason: "x"}))
			return err
		}},
		{"Ack", func(id string) error {
			j, lid, gen := claim(id)
			_, err := sc.Lease.Ack(ctx, connect.NewRequest(&tetherv1.AckRequest{JobId: j, LeaseId: lid, LeaseGeneration: gen}))
			return err
		}},
		{"Renew", func(id string) error {
			j, lid, gen := claim(id)
			_, err := sc.Lease.Renew(ctx, connect.NewRequest(&tetherv1.RenewRequest{JobId: j, LeaseId: lid, LeaseGeneration: gen, RenewSequence: 1}))
			return err
		}},
		{"Progress", func(id string) error {
			j, lid, gen := claim(id)
			_, err := sc.Lease.Progress(ctx, connect.NewRequest(&tetherv1.ProgressRequest{JobId: j, LeaseId: lid, LeaseGeneration: gen, ProgressSequence: 1}))
			return err
		}},
		{"CancelAck", func(id string) error {
			j, lid, gen := claim(id)
			_, err := sc.Lease.CancelAck(ctx, connect.NewRequest(&tetherv1.LeaseServiceCancelAckRequest{JobId: j, LeaseId: lid, LeaseGeneration: gen}))
			return err
		}},
		{"Complete", func(id string) error {
			j, lid, gen := claim(id)
			_, err := sc.Lease.Complete(ctx, connect.NewRequest(&tetherv1.CompleteRequest{JobId: j, LeaseId: lid, LeaseGeneration: gen, Result: tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS}))
			return err
		}},
	} {
		sameAnswers(t, p.what, jobs, p.ask)
	}
	// The holder's lease is as it was offered.
	if got := w.get(t, job); got.State != tetherv1.LeaseState_LEASE_STATE_OFFERED || got.HolderIdentity != w.w1 {
		t.Errorf("the job after the rogue's tries: %v", got)
	}
}
