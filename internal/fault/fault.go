package fault

import (
	"errors"
	"fmt"
)

// Kind is an error's category: what the caller can do about it. The zero
// Kind is Internal.
type Kind uint8

const (
	// Internal: a bug, corrupt data, or an error nobody categorized. The
	// caller cannot fix it; the operator reads the log.
	Internal Kind = iota
	// Invalid: the request is malformed or out of range; fix it and retry.
	Invalid
	// NotFound: the request names something that does not exist (or no
	// longer does).
	NotFound
	// Exists: the thing the request would create already exists.
	Exists
	// Conflict: a concurrent change won; nothing happened, and the same
	// request may succeed if retried.
	Conflict
	// Precondition: the state of what the request names does not allow it
	// (a node that is stopping, a decided proposal); retrying will not help
	// until that state changes.
	Precondition
	// Denied: the caller is known but may not do this.
	Denied
	// Unauthenticated: the caller's credential (or the token presented) is
	// missing, invalid, expired or revoked.
	Unauthenticated
	// Exhausted: a limit (size, count, budget) is reached.
	Exhausted
	// Unavailable: the server cannot answer now (shutting down, not the
	// leader, a store that failed); retry, perhaps elsewhere.
	Unavailable
)

var kindNames = [...]string{
	Internal: "internal", Invalid: "invalid", NotFound: "not found", Exists: "exists",
	Conflict: "conflict", Precondition: "precondition", Denied: "denied",
	Unauthenticated: "unauthenticated", Exhausted: "exhausted", Unavailable: "unavailable",
}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// categorized is an error with a Kind. A sentinel is compared by identity
// (errors.Is), so New returns a pointer.
type categorized struct {
	kind Kind
	err  error
}

func (e *categorized) Error() string { return e.err.Error() }
func (e *categorized) Unwrap() error { return e.err }

// New returns a sentinel error of kind k whose message is msg.
func New(k Kind, msg string) error { return &categorized{kind: k, err: errors.New(msg)} }

// Errorf returns an error of kind k formatted as fmt.Errorf does; %w verbs
// wrap as they do there.
func Errorf(k Kind, format string, args ...any) error {
	return &categorized{kind: k, err: fmt.Errorf(format, args...)}
}

// KindOf returns the category of err: the first non-Internal Kind found
// walking err's tree as errors.Is does, or Internal.
func KindOf(err error) Kind {
	for err != nil {
		if c, ok := err.(*categorized); ok && c.kind != Internal {
			return c.kind
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if k := KindOf(e); k != Internal {
					return k
				}
			}
			return Internal
		default:
			return Internal
		}
	}
	return Internal
}
