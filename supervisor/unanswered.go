package supervisor

import (
	"fmt"
	"time"

	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/privilege"
)

// decideUnansweredPrivileges decides, inside the transaction that writes
// a part of t's record, every privilege of privs (those of the chunk's
// members) still undecided: revoke_failed (no answer by the deadline). A
// privilege that had expired when the revocation began was decided
// expired then (privilege.Dispatch), so one still undecided was live when
// its hook was called: its declared expiry, passed since, is its
// registrant's word and does not make the hook's silence an expiry (until
// the thirty-seventh pass a rogue that declared an expiry inside the hook
// window, behind a hook that hung, read expired). Only a termination
// that waits for no hook (no hook timeout) decides one past its expiry
// expired, as the revocation would have. A late answer never overwrites
// the decision. One whose hook was never called (reg queued it and no
// slot came before the deadline: privilege.Privileges.NotCalled) reads
// so, not "no answer" (until the forty-third pass it did, as if its hook
// had been called and kept silent). It returns privs as they now stand.
func decideUnansweredPrivileges(tx store.Txn, t Termination, privs []privilege.Privilege, now time.Time, reg *privilege.Privileges) ([]privilege.Privilege, error) {
	out := make([]privilege.Privilege, len(privs))
	for i, p := range privs {
		out[i] = p
		if p.Outcome != "" {
			continue
		}
		p.DecidedAt = now
		switch {
		case t.HookTimeout <= 0 && !now.Before(p.ExpiresAt):
			p.Outcome = privilege.OutcomeExpired
		case t.HookTimeout <= 0:
			p.Outcome, p.Error = privilege.OutcomeRevokeFailed, "no answer within the termination's deadline"
		default:
			p.Outcome, p.Error = privilege.OutcomeRevokeFailed, fmt.Sprintf("no answer within the %s deadline", t.HookTimeout)
			if reg != nil {
				if why := reg.NotCalled(p); why != "" {
					p.Error = fmt.Sprintf("%s (%s deadline)", why, t.HookTimeout)
				}
			}
			if !now.Before(p.ExpiresAt) {
				p.Error += fmt.Sprintf(" (its registrant declared it to expire at %s, after its revocation began)", p.ExpiresAt.UTC().Format(time.RFC3339))
			}
		}
		if err := privilege.PutIn(tx, p); err != nil {
			return nil, err
		}
		out[i] = p
	}
	return out, nil
}
