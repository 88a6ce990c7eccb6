package wire

import (
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/ledger"
)

// ToolCall is a ledger call as the API shows it.
func ToolCall(c *ledger.ToolCall) *tetherv1.ToolCall {
	if c == nil {
		return nil
	}
	return &tetherv1.ToolCall{
		CallId:            c.CallID,
		NodeId:            c.NodeID,
		GrantId:           c.GrantID,
		Tool:              c.Tool,
		GateId:            c.GateID,
		State:             tetherv1.CallState(c.State),
		Resolution:        tetherv1.CallResolution(c.Resolution),
		BegunAt:           timestamp(c.BegunAt),
		EndedAt:           timestamp(c.EndedAt),
		CancelRequestedAt: timestamp(c.CancelRequestedAt),
		CancelAckedAt:     timestamp(c.CancelAckedAt),
		TerminationId:     c.TerminationID,
		Error:             c.Error,
		BegunBy:           c.BegunBy,
		EndedBy:           c.EndedBy,
		AcknowledgedBy:    c.AcknowledgedBy,
	}
}

// ToolCalls are calls as the API shows them.
func ToolCalls(cs []*ledger.ToolCall) []*tetherv1.ToolCall { return each(cs, ToolCall) }
