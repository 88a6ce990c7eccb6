// Package id makes and checks Tether's identifiers: a short kind prefix and
// 20 random base32 characters, e.g. "n_3k9v0c7q1x2m4b5n6p7r" for a node.
package id

import (
	"crypto/rand"
	"encoding/base32"
	"fmt"
	"strings"
)

// Prefixes of the identifier kinds.
const (
	Node        = "n"
	Grant       = "g"
	Lease       = "l"
	Termination = "t"
	Record      = "r"
	Call        = "c"
	Proposal    = "p"
	Privilege   = "v"
	Rollout     = "o"
	Session     = "s" // an agent's session (and a control-plane process: its instance)
	StopRule    = "x" // a stop rule
)

// alphabet is the characters of an identifier after its prefix.
const alphabet = "0123456789abcdefghjkmnpqrstvwxyz"

var encoding = base32.NewEncoding(alphabet).WithPadding(base32.NoPadding)

// New returns a fresh identifier of kind.
func New(kind string) string {
	var b [13]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return kind + "_" + encoding.EncodeToString(b[:])[:20]
}

// names are the identifier kinds as users call them.
var names = map[string]string{
	Node: "node", Grant: "grant", Lease: "lease", Termination: "termination", Record: "record",
	Call: "tool call", Proposal: "stop proposal", Privilege: "privilege", Rollout: "rollout",
	Session: "session", StopRule: "stop rule",
}

// Check reports whether s is a well-formed identifier of kind. field names
// the request field in the error, which says what was expected in words:
// `holder_node_id "g_…" is not a node id (n_ and 20 characters)`.
func Check(kind, field, s string) error {
	if s == "" {
		return fmt.Errorf("%s is required", field)
	}
	if !wellFormed(kind, s) {
		return fmt.Errorf("%s %q is not a %s id (%s_ and 20 characters)", field, clip(s), kindName(kind), kind)
	}
	return nil
}

// wellFormed reports whether s is kind, '_' and 20 characters of the
// alphabet.
func wellFormed(kind, s string) bool {
	if len(s) != len(kind)+21 || !strings.HasPrefix(s, kind) || s[len(kind)] != '_' {
		return false
	}
	for i := len(kind) + 1; i < len(s); i++ {
		if strings.IndexByte(alphabet, s[i]) < 0 {
			return false
		}
	}
	return true
}

func kindName(kind string) string {
	if n, ok := names[kind]; ok {
		return n
	}
	return kind + "_"
}

// clip keeps error messages short when the input is huge.
func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

// Kind is the kind of identifier s is well-formed as ("n" for a node id),
// or "" when it is none: a name an agent chooses must not read as one.
func Kind(s string) string {
	// wellFormed, not Check: a name is checked on every spawn, and Check's
	// error for each kind was most of a spawn's validation. An id is its
	// kind, '_' and 20 characters, so the only kind s can be is what
	// precedes its last 21 bytes: one map lookup, not a walk over every
	// kind (TestKindIsTheOneKindWellFormed).
	if len(s) < 22 {
		return ""
	}
	kind := s[:len(s)-21]
	if _, ok := names[kind]; ok && wellFormed(kind, s) {
		return kind
	}
	return ""
}
