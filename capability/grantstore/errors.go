package grantstore

import "github.com/tetherhq/tether/internal/fault"

// Errors of the grant store. Errors from the pure core (capability's
// sentinels) pass through wrapped; each sentinel declares its category
// (internal/fault), which the RPC layer maps to a code. Messages name fields, grants and nodes, never tokens.
var (
	// ErrInvalidArgument: a request field is missing or malformed.
	ErrInvalidArgument = fault.New(fault.Invalid, "grantstore: invalid argument")
	// ErrNotVisible: an agent asked about a grant or node outside its own
	// subtree.
	ErrNotVisible = fault.New(fault.Denied, "grantstore: outside the caller's subtree")
	// ErrOperatorOnly: the operation is for operators (IssueRoot).
	ErrOperatorOnly = fault.New(fault.Denied, "grantstore: operators only")
	// ErrAgentOnly: the operation is for the holder agent (Delegate): an
	// operator issues roots and does not act as an agent.
	ErrAgentOnly = fault.New(fault.Denied, "grantstore: the holder agent only")
	// ErrNodeNotRunning: the node a grant would be issued to, refreshed for
	// or delegated from is not running (draining, aborting, terminated or
	// unknown).
	ErrNodeNotRunning = fault.New(fault.Precondition, "grantstore: node is not running")
	// ErrScopeNotGranted: a valid token does not carry the scope a call needs.
	ErrScopeNotGranted = fault.New(fault.Denied, "grantstore: scope not granted")
	// ErrContended: an optimistic transaction kept losing to concurrent
	// writers of the same grants; the caller may retry.
	ErrContended = fault.New(fault.Conflict, "grantstore: too much contention, retry")
	// ErrLimit: the node a grant would be issued or delegated to already
	// holds the most live grants of its kind (Config.MaxPerNode).
	ErrLimit = fault.New(fault.Exhausted, "grantstore: too many grants")
	// ErrStopped: the revocation feed stopped (the control plane is
	// shutting down); a follower reconnects, to this replica or another.
	ErrStopped = fault.New(fault.Unavailable, "grantstore: revocation feed stopped")
	// ErrCorrupt: stored data does not decode or breaks an invariant of the
	// key layout.
	ErrCorrupt = fault.New(fault.Internal, "grantstore: stored data is inconsistent")
)
