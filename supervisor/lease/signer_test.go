package lease

import "testing"

func TestSignerOf(t *testing.T) {
	for _, tc := range []struct {
		reason, who string
		signed      bool
	}{
		{"agent:n_abc: cancel it", "agent:n_abc", true},
		{"operator:alice: stop", "operator:alice", true},
		{"tool:gate-1", "tool:gate-1", true},
		{"agent:: forged", "agent:", false},
		{"termination t_1 reconciled the lease", "", false},
		{"Agent:n_abc: not a principal's case", "", false},
	} {
		who, signed := SignerOf(tc.reason)
		if who != tc.who && tc.signed || signed != tc.signed {
			t.Errorf("SignerOf(%q) = %q, %t; want %q, %t", tc.reason, who, signed, tc.who, tc.signed)
		}
	}
}
