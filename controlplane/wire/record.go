package wire

import (
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor"
)

// Record is a reconciliation record as the API carries it (GetRecord,
// ListRecords) and as it is published (RecordJSON).
func Record(r *supervisor.ReconciliationRecord) *tetherv1.ReconciliationRecord {
	if r == nil {
		return nil
	}
	return &tetherv1.ReconciliationRecord{
		RecordId:      r.RecordID,
		TerminationId: r.TerminationID,
		SchemaVersion: r.SchemaVersion,
		NodeId:        r.NodeID,
		Mode:          tetherv1.TerminationMode(r.Mode),
		RequestedBy:   r.RequestedBy,
		Reason:        r.Reason,
		Escalated:     r.Escalated,
		WrittenAt:     timestamp(r.WrittenAt),
		RootNodeIds:   r.RootNodeIDs,
		RolloutId:     r.RolloutID,
		StopRule:      StopRuleFiring(r.StopRule),
		Nodes:         eachOf(r.Nodes, RecordNode),
		ToolCalls:     eachOf(r.ToolCalls, RecordToolCall),
		Privileges:    eachOf(r.Privileges, RecordPrivilege),
		Leases:        eachOf(r.Leases, RecordLease),
		Phases:        each(r.Phases, recordPhase),
	}
}

// Records is Record of each.
func Records(rs []*supervisor.ReconciliationRecord) []*tetherv1.ReconciliationRecord {
	return each(rs, Record)
}

// RecordNode is a record's node entry as the API carries it.
func RecordNode(n *supervisor.RecordNode) *tetherv1.RecordNode {
	if n == nil {
		return nil
	}
	return &tetherv1.RecordNode{
		NodeId:                    n.NodeID,
		Name:                      n.Name,
		ParentNodeId:              n.ParentNodeID,
		Outcome:                   tetherv1.NodeOutcome(n.Outcome),
		ConfirmedBy:               n.ConfirmedBy,
		ConfirmedAt:               timestamp(n.ConfirmedAt),
		LastSeenAt:                timestamp(n.LastSeenAt),
		HeldGrantIds:              n.HeldGrantIDs,
		HeldJobIds:                n.HeldJobIDs,
		InnerTerminationId:        n.InnerTerminationID,
		InnerOutcome:              tetherv1.InnerOutcome(n.InnerOutcome),
		InnerRecordId:             n.InnerRecordID,
		SupersededByTerminationId: n.SupersededByTerminationID,
		ClaimedBy:                 n.ClaimedBy,
		ClaimedAt:                 timestamp(n.ClaimedAt),
		SessionClosedAt:           timestamp(n.SessionClosedAt),
		SessionOpen:               n.SessionOpen,
		UnaccountedReason:         n.UnaccountedReason,
		Contradictions:            each(n.Contradictions, Contradiction),
	}
}

// RecordToolCall is a record's tool call entry as the API carries it.
func RecordToolCall(c *supervisor.RecordToolCall) *tetherv1.RecordToolCall {
	if c == nil {
		return nil
	}
	return &tetherv1.RecordToolCall{
		CallId: c.CallID, NodeId: c.NodeID, Tool: c.Tool, GateId: c.GateID,
		Resolution: tetherv1.CallResolution(c.Resolution),
		BegunBy:    c.BegunBy, EndedBy: c.EndedBy, AcknowledgedBy: c.AcknowledgedBy,
	}
}

// RecordPrivilege is a record's privilege entry as the API carries it.
func RecordPrivilege(p *supervisor.RecordPrivilege) *tetherv1.RecordPrivilege {
	if p == nil {
		return nil
	}
	return &tetherv1.RecordPrivilege{
		PrivilegeId: p.PrivilegeID, Kind: p.Kind, ExternalId: p.ExternalID, NodeId: p.NodeID,
		Outcome: tetherv1.PrivilegeOutcome(p.Outcome), Error: p.Error,
	}
}

// RecordLease is a record's lease entry as the API carries it.
func RecordLease(l *supervisor.RecordLease) *tetherv1.RecordLease {
	if l == nil {
		return nil
	}
	return &tetherv1.RecordLease{
		JobId: l.JobID, LeaseId: l.LeaseID, LeaseGeneration: l.LeaseGeneration, HolderIdentity: l.HolderIdentity,
		Outcome: tetherv1.LeaseOutcome(l.Outcome),
	}
}

// recordPhase is a record's phase as the API carries it: it always states
// its duration, "0s" included.
func recordPhase(p supervisor.RecordPhase) *tetherv1.RecordPhase {
	return &tetherv1.RecordPhase{Name: p.Name, StartedAt: timestamp(p.StartedAt), Duration: durationpb.New(p.Duration)}
}

// RecordJSON renders a record message as the JSON published by
// docs/record.schema.json (protobuf JSON names, lowerCamelCase, fields at
// their zero value omitted): what the record sinks deliver, the console
// shows and the demo prints.
func RecordJSON(m *tetherv1.ReconciliationRecord) ([]byte, error) {
	return protojson.MarshalOptions{Multiline: true, Indent: "  ", EmitUnpopulated: false}.Marshal(m)
}

// RenderRecord is the published JSON of a record: the record outbox's
// Render (supervisor.Outbox).
func RenderRecord(r *supervisor.ReconciliationRecord) ([]byte, error) {
	return RecordJSON(Record(r))
}
