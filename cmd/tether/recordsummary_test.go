package main

import (
	"strings"
	"testing"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The summary's tool-call and privilege sections list each item and count
// them by resolution and outcome: a line per item, then the totals, in
// category order; an empty section says so.
func TestRecordSummaryTalliesCallsAndPrivileges(t *testing.T) {
	rec := &tetherv1.ReconciliationRecord{
		RecordId: "r_1", TerminationId: "t_1", NodeId: "n_root", Mode: tetherv1.TerminationMode_TERMINATION_MODE_DRAIN,
		ToolCalls: []*tetherv1.RecordToolCall{
			{Tool: "shell", NodeId: "n_a", GateId: "g1", Resolution: tetherv1.CallResolution_CALL_RESOLUTION_COMPLETED, EndedBy: "tool-server:g1"},
			{Tool: "fetch", NodeId: "n_b", GateId: "g2", Resolution: tetherv1.CallResolution_CALL_RESOLUTION_CANCELLED_ACKED, AcknowledgedBy: "tool-server:g2", EndedBy: "tool-server:g2"},
			{Tool: "shell", NodeId: "n_c", GateId: "g1", Resolution: tetherv1.CallResolution_CALL_RESOLUTION_COMPLETED},
		},
	}
	var b strings.Builder
	PrintRecordSummary(&b, rec)
	got := b.String()
	for _, want := range []string{
		"\nTool calls in flight or refused during the termination (3)\n" +
			"  completed                shell        n_a                    gate g1, ended by tool-server:g1\n" +
			"  cancelled_acked          fetch        n_b                    gate g2, acknowledged by tool-server:g2\n" +
			"  completed                shell        n_c                    gate g1\n" +
			"  totals: 1 cancelled_acked, 2 completed\n",
		"\nPrivileges (0)\n  totals: none\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("summary lacks\n%s\ngot:\n%s", want, got)
		}
	}

	rec.ToolCalls = nil
	rec.Privileges = []*tetherv1.RecordPrivilege{
		{Kind: "file_lock", ExternalId: "lock-7", NodeId: "n_a", Outcome: tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_REVOKE_FAILED, Error: "hook answered 500"},
		{Kind: "grant", ExternalId: "g_9", NodeId: "n_b", Outcome: tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_REVOKED},
	}
	b.Reset()
	PrintRecordSummary(&b, rec)
	got = b.String()
	for _, want := range []string{
		"\nTool calls in flight or refused during the termination (0)\n  totals: none\n",
		"\nPrivileges (2)\n" +
			"  revoke_failed  file_lock          lock-7                   n_a (hook answered 500)\n" +
			"  revoked        grant              g_9                      n_b\n" +
			"  totals: 1 revoke_failed, 1 revoked\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("summary lacks\n%s\ngot:\n%s", want, got)
		}
	}
}
