package wire

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor"
	"github.com/tetherhq/tether/supervisor/ledger"
	"github.com/tetherhq/tether/supervisor/tree"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 123456789, time.UTC)

func at(d time.Duration) time.Time              { return t0.Add(d) }
func ts(d time.Duration) *timestamppb.Timestamp { return timestamppb.New(t0.Add(d)) }

// firing and firingMessage are one stop rule firing, as the domain holds
// it and as the previous version built its message.
func firing() *supervisor.StopRuleFiring {
	return &supervisor.StopRuleFiring{
		RuleID: "rule_1", Name: "shells", Expression: `observed.calls_by_tool["shell"] >= 3`, SetBy: "operator:alice",
		Severity: "critical", Labels: map[string]string{"team": "research"}, RuleNodeID: "node_r", NodeID: "node_1",
		Values:       []supervisor.StopRuleValue{{Name: `observed.calls_by_tool["shell"]`, Value: "3"}, {Name: "self_reported.cost_usd", Value: "2", SelfReported: true}},
		SelfReported: true, FiredAt: at(time.Second), Action: "abort",
	}
}

func firingMessage() *tetherv1.StopRuleFiring {
	return &tetherv1.StopRuleFiring{
		RuleId: "rule_1", Name: "shells", Expression: `observed.calls_by_tool["shell"] >= 3`, SetBy: "operator:alice",
		Severity: "critical", Labels: map[string]string{"team": "research"}, RuleNodeId: "node_r", NodeId: "node_1",
		Values:       []*tetherv1.StopRuleValue{{Name: `observed.calls_by_tool["shell"]`, Value: "3"}, {Name: "self_reported.cost_usd", Value: "2", SelfReported: true}},
		SelfReported: true, FiredAt: ts(time.Second), Action: "abort",
	}
}

// record and recordMessage are one fully populated record (every field,
// a confirmed, an unaccounted, a prior and a superseded node, a phase of
// zero duration), as the domain holds it and as the previous version
// built its message.
func record() *supervisor.ReconciliationRecord {
	return &supervisor.ReconciliationRecord{
		RecordID: "rec_1", TerminationID: "term_1", SchemaVersion: supervisor.RecordSchemaVersion, NodeID: "node_0",
		Mode: supervisor.ModeDrain, RequestedBy: "operator:alice", Reason: "stop", Escalated: true,
		Nodes: []supervisor.RecordNode{
			{NodeID: "node_0", Name: "root", Outcome: supervisor.NodeOutcomeConfirmed, ConfirmedBy: "operator:launcher (launcher)", ConfirmedAt: at(2 * time.Second),
				LastSeenAt: at(time.Second), SessionClosedAt: at(time.Second), ClaimedBy: "agent:node_0 (self)", ClaimedAt: at(time.Second)},
			{NodeID: "node_1", Name: "a", ParentNodeID: "node_0", Outcome: supervisor.NodeOutcomeUnaccounted, LastSeenAt: at(3 * time.Second),
				HeldGrantIDs: []string{"grant_1"}, HeldJobIDs: []string{"job-a"}, UnaccountedReason: "its session is still open", SessionOpen: true,
				Contradictions:     []tree.Contradiction{{Kind: "heartbeat", At: at(4 * time.Second), Detail: "after the exit"}},
				InnerTerminationID: "term_in", InnerOutcome: supervisor.InnerOutcomeTakenOverAborting},
			{NodeID: "node_2", Name: "b", ParentNodeID: "node_0", Outcome: supervisor.NodeOutcomeConfirmed, ConfirmedBy: "operator:x (launcher)",
				ConfirmedAt: at(time.Second), InnerTerminationID: "term_old", InnerOutcome: supervisor.InnerOutcomeTerminated, InnerRecordID: "rec_old"},
			{NodeID: "node_3", Name: "c", ParentNodeID: "node_0", Outcome: supervisor.NodeOutcomeSuperseded, SupersededByTerminationID: "term_other"},
		},
		ToolCalls: []supervisor.RecordToolCall{{CallID: "call_1", NodeID: "node_1", Tool: "shell", GateID: "gate-1",
			Resolution: ledger.CallResolutionCancelUnacknowledged, BegunBy: "gate:gate-1", EndedBy: "termination:term_1", AcknowledgedBy: "agent:node_1"}},
		Privileges: []supervisor.RecordPrivilege{
			{PrivilegeID: "grant_1", Kind: "grant", ExternalID: "grant_1", NodeID: "node_1", Outcome: supervisor.PrivilegeOutcomeRevoked},
			{PrivilegeID: "priv_1", Kind: "file_lock", ExternalID: "/tmp/l", NodeID: "node_1", Outcome: supervisor.PrivilegeOutcomeRevokeFailed, Error: "500"},
		},
		Leases: []supervisor.RecordLease{{JobID: "job-a", LeaseID: "L-1", LeaseGeneration: 3, HolderIdentity: "node_1", Outcome: supervisor.LeaseOutcomeUnresolved,
			TerminalResult: supervisor.LeaseResultUnresolved}},
		Phases: []supervisor.RecordPhase{
			{Name: "requested", StartedAt: t0},
			{Name: "draining", StartedAt: t0, Duration: 1500 * time.Millisecond},
		},
		WrittenAt: at(time.Minute), RootNodeIDs: []string{"node_0", "node_9"}, RolloutID: "rollout_1", StopRule: firing(),
	}
}

func recordMessage() *tetherv1.ReconciliationRecord {
	return &tetherv1.ReconciliationRecord{
		RecordId: "rec_1", TerminationId: "term_1", SchemaVersion: 1, NodeId: "node_0",
		Mode: tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, RequestedBy: "operator:alice", Reason: "stop", Escalated: true,
		Nodes: []*tetherv1.RecordNode{
			{NodeId: "node_0", Name: "root", Outcome: tetherv1.NodeOutcome_NODE_OUTCOME_CONFIRMED, ConfirmedBy: "operator:launcher (launcher)", ConfirmedAt: ts(2 * time.Second),
				LastSeenAt: ts(time.Second), SessionClosedAt: ts(time.Second), ClaimedBy: "agent:node_0 (self)", ClaimedAt: ts(time.Second)},
			{NodeId: "node_1", Name: "a", ParentNodeId: "node_0", Outcome: tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED, LastSeenAt: ts(3 * time.Second),
				HeldGrantIds: []string{"grant_1"}, HeldJobIds: []string{"job-a"}, UnaccountedReason: "its session is still open", SessionOpen: true,
				Contradictions:     []*tetherv1.Contradiction{{Kind: "heartbeat", At: ts(4 * time.Second), Detail: "after the exit"}},
				InnerTerminationId: "term_in", InnerOutcome: tetherv1.InnerOutcome_INNER_OUTCOME_TAKEN_OVER_ABORTING},
			{NodeId: "node_2", Name: "b", ParentNodeId: "node_0", Outcome: tetherv1.NodeOutcome_NODE_OUTCOME_CONFIRMED, ConfirmedBy: "operator:x (launcher)",
				ConfirmedAt: ts(time.Second), InnerTerminationId: "term_old", InnerOutcome: tetherv1.InnerOutcome_INNER_OUTCOME_TERMINATED, InnerRecordId: "rec_old"},
			{NodeId: "node_3", Name: "c", ParentNodeId: "node_0", Outcome: tetherv1.NodeOutcome_NODE_OUTCOME_SUPERSEDED, SupersededByTerminationId: "term_other"},
		},
		ToolCalls: []*tetherv1.RecordToolCall{{CallId: "call_1", NodeId: "node_1", Tool: "shell", GateId: "gate-1",
			Resolution: tetherv1.CallResolution_CALL_RESOLUTION_CANCEL_UNACKNOWLEDGED, BegunBy: "gate:gate-1", EndedBy: "termination:term_1", AcknowledgedBy: "agent:node_1"}},
		Privileges: []*tetherv1.RecordPrivilege{
			{PrivilegeId: "grant_1", Kind: "grant", ExternalId: "grant_1", NodeId: "node_1", Outcome: tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_REVOKED},
			{PrivilegeId: "priv_1", Kind: "file_lock", ExternalId: "/tmp/l", NodeId: "node_1", Outcome: tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_REVOKE_FAILED, Error: "500"},
		},
		Leases: []*tetherv1.RecordLease{{JobId: "job-a", LeaseId: "L-1", LeaseGeneration: 3, HolderIdentity: "node_1", Outcome: tetherv1.LeaseOutcome_LEASE_OUTCOME_UNRESOLVED,
			TerminalResult: tetherv1.TerminalResult_TERMINAL_RESULT_UNRESOLVED}},
		Phases: []*tetherv1.RecordPhase{
			{Name: "requested", StartedAt: ts(0), Duration: durationpb.New(0)},
			{Name: "draining", StartedAt: ts(0), Duration: durationpb.New(1500 * time.Millisecond)},
		},
		WrittenAt: ts(time.Minute), RootNodeIds: []string{"node_0", "node_9"}, RolloutId: "rollout_1", StopRule: firingMessage(),
	}
}

// TestRecordIsTheMessageThePreviousVersionSent: the edge converts a
// record to the message the previous version built from its own tether.v1
// record, and the published JSON is byte for byte that message's (a phase
// of zero duration still says "0s").
func TestRecordIsTheMessageThePreviousVersionSent(t *testing.T) {
	rec, want := record(), recordMessage()
	if got := Record(rec); !proto.Equal(got, want) {
		t.Fatalf("Record:\n got %v\nwant %v", got, want)
	}
	got, err := RenderRecord(rec)
	if err != nil {
		t.Fatal(err)
	}
	prev, err := RecordJSON(want)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, prev) {
		t.Fatalf("published JSON changed:\n got %s\nwant %s", got, prev)
	}
	if !strings.Contains(string(got), `"0s"`) {
		t.Fatalf("the zero-length phase lost its duration: %s", got)
	}
	if Record(nil) != nil || len(Records([]*supervisor.ReconciliationRecord{rec, rec})) != 2 {
		t.Fatal("Record(nil) or Records")
	}
}

// TestProposalIsTheMessageThePreviousVersionSent: an agent's proposal and
// a stop rule's (whose drain window, zero, the previous version sent as
// "0s") convert to the messages the previous version sent.
func TestProposalIsTheMessageThePreviousVersionSent(t *testing.T) {
	agent := &supervisor.StopProposal{
		ProposalID: "prop_1", NodeID: "node_1", Condition: "calls>=3", Reason: "done", State: supervisor.ProposalStateApproved,
		ProposedBy: "agent:node_1", DecidedBy: "policy:auto-approve", TerminationID: "term_1", CreatedAt: t0, DecidedAt: at(time.Second),
		Mode: supervisor.ModeAbort, DrainWindow: 90 * time.Second,
	}
	agentMsg := &tetherv1.StopProposal{
		ProposalId: "prop_1", NodeId: "node_1", Condition: "calls>=3", Reason: "done", State: tetherv1.ProposalState_PROPOSAL_STATE_APPROVED,
		ProposedBy: "agent:node_1", DecidedBy: "policy:auto-approve", TerminationId: "term_1", CreatedAt: ts(0), DecidedAt: ts(time.Second),
		Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT, DrainWindow: durationpb.New(90 * time.Second),
	}
	rule := &supervisor.StopProposal{
		ProposalID: "prop_2", NodeID: "node_1", Condition: "rule:shells", Reason: "stop rule", State: supervisor.ProposalStatePending,
		ProposedBy: "stop-rule:rule_1", CreatedAt: t0, Mode: supervisor.ModeDrain, Rule: firing(),
	}
	ruleMsg := &tetherv1.StopProposal{
		ProposalId: "prop_2", NodeId: "node_1", Condition: "rule:shells", Reason: "stop rule", State: tetherv1.ProposalState_PROPOSAL_STATE_PENDING,
		ProposedBy: "stop-rule:rule_1", CreatedAt: ts(0), Mode: tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, DrainWindow: durationpb.New(0),
		Rule: firingMessage(),
	}
	got := Proposals([]*supervisor.StopProposal{agent, rule})
	if len(got) != 2 || !proto.Equal(got[0], agentMsg) || !proto.Equal(got[1], ruleMsg) {
		t.Fatalf("Proposals:\n got %v\nwant %v, %v", got, agentMsg, ruleMsg)
	}
	if Proposal(nil) != nil || StopRuleFiring(nil) != nil {
		t.Fatal("a nil converts to a nil")
	}
}
