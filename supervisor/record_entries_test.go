package supervisor

import (
	"testing"
	"time"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/supervisor/ledger"
	"github.com/tetherhq/tether/supervisor/privilege"
)

// TestRecordEntriesSayWhenAndOnWhoseWord: the record's call and privilege
// entries carry the ledger's times and the gate's error, and each
// privilege when it ended (an expired one at its declared expiry, not when
// the termination looked), who revoked it and who registered or issued it;
// a privilege stored before its registrant was kept is named by kind of
// registrant only.
func TestRecordEntriesSayWhenAndOnWhoseWord(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	c := recordCall(&ledger.ToolCall{
		CallID: "c_1", BegunAt: at(1), CancelRequestedAt: at(2), EndedAt: at(3), CancelAckedAt: at(3),
		Resolution: ledger.CallResolutionCancelledAcked, Error: "stopped", AcknowledgedBy: "tool:g",
	})
	if !c.BegunAt.Equal(at(1)) || !c.CancelRequestedAt.Equal(at(2)) || !c.EndedAt.Equal(at(3)) || !c.AcknowledgedAt.Equal(at(3)) || c.Error != "stopped" {
		t.Errorf("call entry %+v", c)
	}
	for _, tc := range []struct {
		name                    string
		p                       privilege.Privilege
		decided                 time.Time
		revokedBy, registeredBy string
	}{
		{"expired", privilege.Privilege{Outcome: privilege.OutcomeExpired, ExpiresAt: at(5), DecidedAt: at(9), RegisteredBy: "agent:n_1"}, at(5), "", "agent:n_1"},
		{"revoked by its hook", privilege.Privilege{Outcome: privilege.OutcomeRevoked, ExpiresAt: at(50), DecidedAt: at(9), RevokeURL: "http://h", RegisteredBy: "operator:a"}, at(9), "webhook", "operator:a"},
		{"revoked in process", privilege.Privilege{Outcome: privilege.OutcomeRevoked, ExpiresAt: at(50), DecidedAt: at(9), ByOperator: true}, at(9), "handler", "operator"},
		{"failed", privilege.Privilege{Outcome: "revoke_failed", Error: "503", ExpiresAt: at(50), DecidedAt: at(9)}, at(9), "", "agent"},
	} {
		got := registeredPrivilege(tc.p)
		if !got.DecidedAt.Equal(tc.decided) || !got.ExpiresAt.Equal(tc.p.ExpiresAt) || got.RevokedBy != tc.revokedBy || got.RegisteredBy != tc.registeredBy {
			t.Errorf("%s: %+v, want decided %s, revoked by %q, registered by %q", tc.name, got, tc.decided, tc.revokedBy, tc.registeredBy)
		}
	}
	g := grantPrivilege(capability.HeldGrant{GrantID: "g_1", Outcome: capability.OutcomeRevoked, DecidedAt: at(7), ExpiresAt: at(60), RevokedBy: "termination:t_1", Issuer: "agent:n_0"})
	if g.Outcome != PrivilegeOutcomeRevoked || !g.DecidedAt.Equal(at(7)) || !g.ExpiresAt.Equal(at(60)) || g.RevokedBy != "termination:t_1" || g.RegisteredBy != "agent:n_0" {
		t.Errorf("grant entry %+v", g)
	}
}
