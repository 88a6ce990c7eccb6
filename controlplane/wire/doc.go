// Package wire converts between the domain packages' types (the agent
// tree's nodes, the ledger's calls, the records, proposals, stop rules,
// grants, leases and rollouts) and the tether.v1 messages the RPCs carry. The
// handlers call it; the domain packages never import the generated proto
// types, so what an API client sees and what a domain package means can
// each change without the other.
//
// The field-by-field conversions are generated: conv.gen.go is written by
// internal/wiregen (go generate, make generate) from the list of pairs in
// internal/wiregen/pairs.go. It matches a domain field to the message
// field by number (the domain field's pb tag, which internal/storecodec
// also stores by; by name for types without tags, the lease package's and
// tree.SessionSignal) and
// refuses a field on one side only unless the pair lists it as converted
// by hand, so a field added to the proto and the domain type converts
// without anyone writing it, and one added to only one side fails the
// generation. Scalars are copied, enums cast (they share the proto's
// numbers), timestamps and durations convert with the helpers in time.go
// (a zero time.Time or time.Duration is an absent message, unless the
// pair says the field is always written), nested messages and lists of
// them through their own pair's function.
//
// Only what is not a copy is written by hand, one file per concept: a
// lease that does not exist, an evidence row's message kind and the
// policy's sentences (lease.go, which also checks requests before they
// become lease messages), the rendering of a record as published JSON
// and its schema (record.go, schema.go), and a rollout with its counts
// (rollout.go).
//
// Callers' duties: none beyond passing non-nil values where a function
// says so; every function returns nil for a nil pointer argument.
package wire

//go:generate go run ./internal/wiregen -o conv.gen.go
