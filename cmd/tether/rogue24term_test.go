package main

import (
	"strings"
	"testing"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRecordSummaryCountsTheRefusedCallsNotListed: `tether record show`
// prints, after the calls a record lists, how many more of each node's
// calls its stop refused and counted without listing them.
func TestRecordSummaryCountsTheRefusedCallsNotListed(t *testing.T) {
	rec := &tetherv1.ReconciliationRecord{
		RecordId: "r_1", TerminationId: "t_1", NodeId: "n_rogue", Mode: tetherv1.TerminationMode_TERMINATION_MODE_DRAIN,
		ToolCalls: []*tetherv1.RecordToolCall{
			{Tool: "shell", NodeId: "n_rogue", GateId: "g1", Resolution: tetherv1.CallResolution_CALL_RESOLUTION_REJECTED_DRAINING},
		},
		Nodes: []*tetherv1.RecordNode{
			{NodeId: "n_rogue", Name: "rogue", Outcome: tetherv1.NodeOutcome_NODE_OUTCOME_CONFIRMED, ConfirmedBy: "operator:admin", RefusedCallsNotListed: 4000},
			{NodeId: "n_quiet", Name: "quiet", Outcome: tetherv1.NodeOutcome_NODE_OUTCOME_CONFIRMED, ConfirmedBy: "operator:admin"},
		},
	}
	var b strings.Builder
	PrintRecordSummary(&b, rec)
	got := b.String()
	want := "  rejected_draining        shell        n_rogue                gate g1\n" +
		"  totals: 1 rejected_draining\n" +
		"  and 4000 more calls of n_rogue refused, counted and not listed\n"
	if !strings.Contains(got, want) || strings.Contains(got, "calls of n_quiet") {
		t.Errorf("summary lacks\n%s\n(and nothing of n_quiet) got:\n%s", want, got)
	}
}
