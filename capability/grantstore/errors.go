package grantstore

import "errors"

// Errors of the grant store. Errors from the pure core (capability's
// sentinels) pass through wrapped, so the RPC layer maps both with one
// errors.Is switch. Messages name fields, grants and nodes, never tokens.
var (
	// ErrInvalidArgument: a request field is missing or malformed.
	ErrInvalidArgument = errors.New("grantstore: invalid argument")
	// ErrNotVisible: an agent asked about a grant or node outside its own
	// subtree.
	ErrNotVisible = errors.New("grantstore: outside the caller's subtree")
	// ErrOperatorOnly: the operation is for operators (IssueRoot).
	ErrOperatorOnly = errors.New("grantstore: operators only")
	// ErrAgentOnly: the operation is for the holder agent (Delegate): an
	// operator issues roots and does not act as an agent.
	ErrAgentOnly = errors.New("grantstore: the holder agent only")
	// ErrNodeNotRunning: the node a grant would be issued to, refreshed for
	// or delegated from is not running (draining, aborting, terminated or
	// unknown).
	ErrNodeNotRunning = errors.New("grantstore: node is not running")
	// ErrScopeNotGranted: a valid token does not carry the scope a call needs.
	ErrScopeNotGranted = errors.New("grantstore: scope not granted")
	// ErrContended: an optimistic transaction kept losing to concurrent
	// writers of the same grants; the caller may retry.
	ErrContended = errors.New("grantstore: too much contention, retry")
	// ErrStopped: the revocation feed stopped (the control plane is
	// shutting down); a follower reconnects, to this replica or another.
	ErrStopped = errors.New("grantstore: revocation feed stopped")
	// ErrCorrupt: stored data does not decode or breaks an invariant of the
	// key layout.
	ErrCorrupt = errors.New("grantstore: stored data is inconsistent")
)
