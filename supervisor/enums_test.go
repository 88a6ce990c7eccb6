package supervisor

import (
	"testing"

	"github.com/tetherhq/tether/internal/enumname/enumtest"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestEnumsAreTetherV1s pins every value of the record's and the
// proposal's enums to the tether.v1 enum it is stored and sent as: the
// same number, and String the proto's value name.
func TestEnumsAreTetherV1s(t *testing.T) {
	// NodeOutcome's table has a gap (SUPERSEDED is 10): its names are
	// counted by the constants below.
	enumtest.Pin(t, "NodeOutcome", tetherv1.NodeOutcome_name, -1, func(v int32) string { return NodeOutcome(v).String() })
	enumtest.Pin(t, "InnerOutcome", tetherv1.InnerOutcome_name, len(innerOutcomeNames), func(v int32) string { return InnerOutcome(v).String() })
	enumtest.Pin(t, "PrivilegeOutcome", tetherv1.PrivilegeOutcome_name, len(privilegeOutcomeNames), func(v int32) string { return PrivilegeOutcome(v).String() })
	enumtest.Pin(t, "LeaseOutcome", tetherv1.LeaseOutcome_name, len(leaseOutcomeNames), func(v int32) string { return LeaseOutcome(v).String() })
	enumtest.Pin(t, "LeaseResult", tetherv1.TerminalResult_name, len(leaseResultNames), func(v int32) string { return LeaseResult(v).String() })
	enumtest.Pin(t, "ProposalState", tetherv1.ProposalState_name, len(proposalStateNames), func(v int32) string { return ProposalState(v).String() })
	named := map[string]int32{
		"NODE_OUTCOME_UNSPECIFIED": int32(NodeOutcomeUnspecified), "NODE_OUTCOME_CONFIRMED": int32(NodeOutcomeConfirmed),
		"NODE_OUTCOME_UNACCOUNTED": int32(NodeOutcomeUnaccounted), "NODE_OUTCOME_SUPERSEDED": int32(NodeOutcomeSuperseded),
		"INNER_OUTCOME_UNSPECIFIED": int32(InnerOutcomeUnspecified), "INNER_OUTCOME_TAKEN_OVER_DRAINING": int32(InnerOutcomeTakenOverDraining),
		"INNER_OUTCOME_TAKEN_OVER_ABORTING": int32(InnerOutcomeTakenOverAborting), "INNER_OUTCOME_TERMINATED": int32(InnerOutcomeTerminated),
		"PRIVILEGE_OUTCOME_UNSPECIFIED": int32(PrivilegeOutcomeUnspecified), "PRIVILEGE_OUTCOME_REVOKED": int32(PrivilegeOutcomeRevoked),
		"PRIVILEGE_OUTCOME_EXPIRED": int32(PrivilegeOutcomeExpired), "PRIVILEGE_OUTCOME_REVOKE_FAILED": int32(PrivilegeOutcomeRevokeFailed),
		"LEASE_OUTCOME_UNSPECIFIED": int32(LeaseOutcomeUnspecified), "LEASE_OUTCOME_CANCELLED": int32(LeaseOutcomeCancelled),
		"LEASE_OUTCOME_EXPIRED": int32(LeaseOutcomeExpired), "LEASE_OUTCOME_UNRESOLVED": int32(LeaseOutcomeUnresolved),
		"LEASE_OUTCOME_COMPLETED": int32(LeaseOutcomeCompleted), "LEASE_OUTCOME_HANDED_OVER": int32(LeaseOutcomeHandedOver),
		"TERMINAL_RESULT_UNSPECIFIED": int32(LeaseResultUnspecified), "TERMINAL_RESULT_SUCCESS": int32(LeaseResultSuccess),
		"TERMINAL_RESULT_FAILED": int32(LeaseResultFailed), "TERMINAL_RESULT_CANCELLED": int32(LeaseResultCancelled),
		"TERMINAL_RESULT_UNRESOLVED": int32(LeaseResultUnresolved),
		"PROPOSAL_STATE_UNSPECIFIED": int32(ProposalStateUnspecified), "PROPOSAL_STATE_PENDING": int32(ProposalStatePending),
		"PROPOSAL_STATE_APPROVED": int32(ProposalStateApproved), "PROPOSAL_STATE_REJECTED": int32(ProposalStateRejected),
		// The record's and the proposal's mode is the termination's Mode.
		"TERMINATION_MODE_DRAIN": int32(ModeDrain), "TERMINATION_MODE_ABORT": int32(ModeAbort),
	}
	values := map[string]int32{}
	for _, m := range []map[string]int32{tetherv1.NodeOutcome_value, tetherv1.InnerOutcome_value, tetherv1.PrivilegeOutcome_value,
		tetherv1.LeaseOutcome_value, tetherv1.TerminalResult_value, tetherv1.ProposalState_value, tetherv1.TerminationMode_value} {
		for k, v := range m {
			values[k] = v
		}
	}
	for name, v := range named {
		if values[name] != v {
			t.Errorf("the constant for %s is %d, tether.v1 has %d", name, v, values[name])
		}
	}
	for name := range values {
		if _, ok := named[name]; !ok && name != "TERMINATION_MODE_UNSPECIFIED" {
			t.Errorf("tether.v1 has %s, which has no constant here", name)
		}
	}
}
