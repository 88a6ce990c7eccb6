package supervisor

import (
	"fmt"
	"time"

	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/privilege"
)

// decideUnansweredPrivileges decides, inside the transaction that writes
// a part of t's record, every privilege of privs (those of the chunk's
// members) still undecided: expired if past its expiry, otherwise
// revoke_failed (no answer by the deadline). A late answer never
// overwrites it. It returns privs as they now stand.
func decideUnansweredPrivileges(tx store.Txn, t Termination, privs []privilege.Privilege, now time.Time) ([]privilege.Privilege, error) {
	out := make([]privilege.Privilege, len(privs))
	for i, p := range privs {
		out[i] = p
		if p.Outcome != "" {
			continue
		}
		p.DecidedAt = now
		if !now.Before(p.ExpiresAt) {
			p.Outcome = privilege.OutcomeExpired
		} else {
			p.Outcome, p.Error = privilege.OutcomeRevokeFailed, "no answer within the termination's deadline"
			if t.HookTimeout > 0 {
				p.Error = fmt.Sprintf("no answer within the %s deadline", t.HookTimeout)
			}
		}
		if err := privilege.PutIn(tx, p); err != nil {
			return nil, err
		}
		out[i] = p
	}
	return out, nil
}
