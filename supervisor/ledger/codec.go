package ledger

import (
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TEMPORARY until internal/storecodec lands: the stored form through the
// generated message.

func encodeCall(c *ToolCall) ([]byte, error) {
	return proto.Marshal(&tetherv1.ToolCall{
		CallId: c.CallID, NodeId: c.NodeID, GrantId: c.GrantID, Tool: c.Tool, GateId: c.GateID,
		State: tetherv1.CallState(c.State), Resolution: tetherv1.CallResolution(c.Resolution),
		BegunAt: ts(c.BegunAt), EndedAt: ts(c.EndedAt), CancelRequestedAt: ts(c.CancelRequestedAt), CancelAckedAt: ts(c.CancelAckedAt),
		TerminationId: c.TerminationID, Error: c.Error, BegunBy: c.BegunBy, EndedBy: c.EndedBy, AcknowledgedBy: c.AcknowledgedBy,
	})
}

// UnmarshalCall decodes a call from its stored form.
func UnmarshalCall(b []byte, c *ToolCall) error {
	m := &tetherv1.ToolCall{}
	if err := proto.Unmarshal(b, m); err != nil {
		return err
	}
	*c = ToolCall{
		CallID: m.CallId, NodeID: m.NodeId, GrantID: m.GrantId, Tool: m.Tool, GateID: m.GateId,
		State: CallState(m.State), Resolution: CallResolution(m.Resolution),
		BegunAt: tm(m.BegunAt), EndedAt: tm(m.EndedAt), CancelRequestedAt: tm(m.CancelRequestedAt), CancelAckedAt: tm(m.CancelAckedAt),
		TerminationID: m.TerminationId, Error: m.Error, BegunBy: m.BegunBy, EndedBy: m.EndedBy, AcknowledgedBy: m.AcknowledgedBy,
	}
	return nil
}

func ts(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

func tm(t *timestamppb.Timestamp) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.AsTime()
}
