package supervisor

import "testing"

// The README's tour terminates with no --reason; the lease's evidence row
// then read `terminated by operator:admin: ` — a dangling colon that reads
// as a reason cut off. The requester still signs the reason (an agent's
// free text never reads as an operator's), and an empty reason adds nothing.
func TestRogue25TourFinalReasonWithoutReason(t *testing.T) {
	for _, tc := range []struct {
		by, reason, want string
	}{
		{"operator:admin", "", "terminated by operator:admin"},
		{"operator:admin", "rollout", "terminated by operator:admin: rollout"},
		{"agent:n_1", "operator:admin aborted", "terminated by agent:n_1: operator:admin aborted"},
		{"", "", "terminated"},
		{"", "why", "terminated: why"},
	} {
		got := Termination{RequestedBy: tc.by, Reason: tc.reason}.finalReason()
		if got != tc.want {
			t.Errorf("requested by %q with reason %q: final reason %q, want %q", tc.by, tc.reason, got, tc.want)
		}
	}
}
