package capability

// HeldGrant is a grant as a termination's record lists it: the node that
// held it and what became of it (Outcome).
type HeldGrant struct {
	GrantID, NodeID, Outcome string
}

// A held grant's outcome as the record shows it; "" while it is active.
const (
	OutcomeRevoked = "revoked"
	OutcomeExpired = "expired"
)
