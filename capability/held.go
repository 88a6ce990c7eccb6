package capability

import "time"

// HeldGrant is a grant as a termination's record lists it: the node that
// held it and what became of it (Outcome), and, once it is known, when
// (DecidedAt: the revocation that reached it, or its expiry), by whom
// (RevokedBy), the expiry its issuer declared and the issuer.
type HeldGrant struct {
	GrantID, NodeID, Outcome string

	DecidedAt, ExpiresAt time.Time
	RevokedBy, Issuer    string
}

// A held grant's outcome as the record shows it; "" while it is active.
const (
	OutcomeRevoked = "revoked"
	OutcomeExpired = "expired"
)
