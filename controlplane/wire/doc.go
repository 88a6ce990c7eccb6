// Package wire converts between the domain packages' types (the agent
// tree's nodes, the ledger's calls, the records, proposals, stop rules,
// grants, leases and rollouts) and the tether.v1 messages the RPCs carry. The
// handlers call it; the domain packages never import the generated proto
// types, so what an API client sees and what a domain package means can
// each change without the other.
//
// One file per concept (node.go, call.go, ...) holds that concept's
// field-by-field conversion, in both directions, and nowhere else. Enums
// share the proto's numbers and convert with a cast; timestamps and
// durations convert with the helpers in time.go (a zero time.Time or
// time.Duration is an absent message).
//
// Callers' duties: none beyond passing non-nil values where a function
// says so; every function returns nil for a nil pointer argument.
package wire
