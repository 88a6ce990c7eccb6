package auth

import "testing"

// A principal that is not a whole operator, agent or tool server has no
// ID: a missing principal must never read as "operator:".
func TestPrincipalIDFailsClosed(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    Principal
		want string
	}{
		{"zero", Principal{}, ""},
		{"no kind", Principal{Subject: "alice", Role: RoleAdmin}, ""},
		{"no subject", Principal{Kind: KindOperator, Role: RoleAdmin}, ""},
		{"operator", Principal{Kind: KindOperator, Subject: "alice"}, "operator:alice"},
		{"agent", Principal{Kind: KindAgent, Subject: "n_1"}, "agent:n_1"},
		{"tool server", Principal{Kind: KindToolServer, Subject: "gate-1"}, "tool:gate-1"},
	} {
		if got := tc.p.ID(); got != tc.want {
			t.Errorf("%s: ID() = %q, want %q", tc.name, got, tc.want)
		}
	}
	if got := (Principal{}).Budget(); got == "operator:" {
		t.Errorf("the zero principal spends the budget %q", got)
	}
}
