package supervisor

import (
	"fmt"
	"time"

	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/privilege"
)

// decideUnansweredPrivileges decides, inside the transaction that writes
// a part of t's record, every privilege of those members still undecided: expired if
// past its expiry, otherwise revoke_failed (no answer by the deadline). A
// late answer never overwrites it.
func decideUnansweredPrivileges(tx store.Txn, t Termination, members []string, now time.Time) error {
	privs, err := privilege.PrivilegesIn(tx, members)
	if err != nil {
		return err
	}
	for _, p := range privs {
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
			return err
		}
	}
	return nil
}
