package ledger_test

import (
	"testing"
	"time"

	"github.com/tetherhq/tether/controlplane/wire"
	"github.com/tetherhq/tether/internal/compattest"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/ledger"
)

// fullCall has every field set, so that the compatibility test covers each.
func fullCall() *ledger.ToolCall {
	at := func(s int) time.Time { return time.Date(2026, 3, 1, 12, 0, s, 123456789, time.UTC) }
	return &ledger.ToolCall{
		CallID: "c_1", NodeID: "n_1", GrantID: "g_1", Tool: "shell", GateID: "gate-1",
		State: ledger.CallStateEnded, Resolution: ledger.CallResolutionCancelledAcked,
		BegunAt: at(1), EndedAt: at(4), CancelRequestedAt: at(2), CancelAckedAt: at(3),
		TerminationID: "t_1", Error: "interrupted",
		BegunBy: "tool:shell-gate", EndedBy: "tool:shell-gate", AcknowledgedBy: "tool:shell-gate",
	}
}

// TestStoredCallsKeepTheTetherV1Encoding: a call this version stores reads,
// as a tether.v1.ToolCall, exactly as the RPC edge shows it (so the
// previous version, which stored and read the message itself, reads it),
// and a call the previous version stored reads back as the same call.
func TestStoredCallsKeepTheTetherV1Encoding(t *testing.T) {
	compattest.Check(t, compattest.Stored[ledger.ToolCall, *tetherv1.ToolCall]{
		Kind: "call", Full: fullCall,
		SetID: func(c *ledger.ToolCall, id string) { c.CallID = id },
		Key:   ledger.CallKey, Put: ledger.PutCallIn, Get: ledger.GetCallIn, Wire: wire.ToolCall,
	}, "c_1", "c_older")
}
