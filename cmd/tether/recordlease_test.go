package main

import (
	"strings"
	"testing"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The summary's lease section says on whose word each job ended: a
// stopping holder's SUCCESS reads as its claim, not as a cooperative
// holder's report, and a termination's CANCELLED on its acknowledgement
// under stop reads as its claim too; the termination's and a coordinator's
// resolutions are named; an agent-chosen id is escaped like the rest of the output.
func TestRecordSummarySaysOnWhoseWordEachLeaseEnded(t *testing.T) {
	success := tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS
	completed := tetherv1.LeaseOutcome_LEASE_OUTCOME_COMPLETED
	rec := &tetherv1.ReconciliationRecord{
		RecordId: "r_1", TerminationId: "t_1", NodeId: "n_root", Mode: tetherv1.TerminationMode_TERMINATION_MODE_DRAIN,
		Leases: []*tetherv1.RecordLease{
			{JobId: "coop", LeaseGeneration: 1, HolderIdentity: "n_c", Outcome: completed, TerminalResult: success,
				EndedBy: tetherv1.LeaseEndedBy_LEASE_ENDED_BY_HOLDER_REPORT, EndedByNodeId: "n_c"},
			{JobId: "rogue\x1b[2J", LeaseGeneration: 1, HolderIdentity: "n_c", Outcome: completed, TerminalResult: success,
				EndedBy: tetherv1.LeaseEndedBy_LEASE_ENDED_BY_HOLDER_REPORT, EndedByNodeId: "n_c", ClaimedUnderStop: true},
			{JobId: "left", LeaseGeneration: 2, HolderIdentity: "n_c", Outcome: tetherv1.LeaseOutcome_LEASE_OUTCOME_CANCELLED, TerminalResult: tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED,
				EndedBy: tetherv1.LeaseEndedBy_LEASE_ENDED_BY_TERMINATION},
			{JobId: "acked", LeaseGeneration: 1, HolderIdentity: "n_c", Outcome: tetherv1.LeaseOutcome_LEASE_OUTCOME_CANCELLED, TerminalResult: tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED,
				EndedBy: tetherv1.LeaseEndedBy_LEASE_ENDED_BY_TERMINATION, ClaimedUnderStop: true},
			{JobId: "by-p", LeaseGeneration: 1, HolderIdentity: "n_c", Outcome: completed, TerminalResult: tetherv1.TerminalResult_TERMINAL_RESULT_FAILED,
				EndedBy: tetherv1.LeaseEndedBy_LEASE_ENDED_BY_COORDINATOR_RESOLUTION, EndedByNodeId: "n_p"},
			{JobId: "moved", LeaseGeneration: 1, HolderIdentity: "n_c", Outcome: tetherv1.LeaseOutcome_LEASE_OUTCOME_HANDED_OVER},
		},
	}
	var b strings.Builder
	PrintRecordSummary(&b, rec)
	got := b.String()
	want := "\nLeases (6)\n" +
		"  completed    job coop gen 1 holder n_c: success, reported by the holder n_c\n" +
		"  completed    job rogue\\x1b[2J gen 1 holder n_c: success, claimed by the holder n_c while it was being stopped (its claim, not confirmed)\n" +
		"  cancelled    job left gen 2 holder n_c: cancelled, ended by the termination\n" +
		"  cancelled    job acked gen 1 holder n_c: cancelled, ended by the termination on the holder's acknowledgement of the cancel while it was being stopped (its claim, not confirmed)\n" +
		"  completed    job by-p gen 1 holder n_c: failed, resolved by its coordinator, agent n_p\n" +
		"  handed_over  job moved gen 1 holder n_c\n"
	if !strings.Contains(got, want) {
		t.Errorf("summary lacks\n%s\ngot:\n%s", want, got)
	}
}
