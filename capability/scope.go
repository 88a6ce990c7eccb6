package capability

import (
	"errors"
	"fmt"
	"strings"
)

// Scope limits. They bound token size (see MaxTokenBytes) and the work a
// verifier does per request.
const (
	// MaxScopeBytes is the longest scope, in bytes.
	MaxScopeBytes = 128
	// MaxScopes is the most scopes one grant may carry.
	MaxScopes = 32
)

// Wildcard is the only special character in a scope. It may appear once, as
// the last byte, and matches any suffix, including the empty one and one
// that spans several segments.
const Wildcard = '*'

// ValidateScope reports whether s is a well-formed scope or scope pattern:
//
//   - 1 to MaxScopeBytes bytes of printable ASCII (0x21–0x7e): no spaces, no
//     control characters, no UTF-8 beyond ASCII;
//   - colon-separated segments, none empty (so no leading, trailing or
//     doubled colon);
//   - at most one Wildcard, and only as the last byte.
//
// A scope without a Wildcard is concrete: it names exactly one permission.
// The error wraps ErrInvalidScope and quotes s (it is bounded and printable,
// or described rather than quoted when it is not).
func ValidateScope(s string) error {
	if err := scopeProblem(s); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidScope, err)
	}
	return nil
}

// scopeProblem is ValidateScope without a sentinel, for callers that wrap
// their own.
func scopeProblem(s string) error {
	if s == "" {
		return errors.New("empty scope")
	}
	if len(s) > MaxScopeBytes {
		return fmt.Errorf("scope of %d bytes exceeds %d", len(s), MaxScopeBytes)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == ' ' {
			return fmt.Errorf("scope %q has a space at offset %d: a scope is one word; give each scope separately", s, i)
		}
		if c < 0x21 || c > 0x7e {
			return fmt.Errorf("scope has a control character or a non-ASCII byte at offset %d", i)
		}
		if c == Wildcard && i != len(s)-1 {
			return fmt.Errorf("scope %q: %q may only be the last character", s, Wildcard)
		}
	}
	if strings.HasPrefix(s, ":") || strings.HasSuffix(s, ":") || strings.Contains(s, "::") {
		return fmt.Errorf("scope %q has an empty segment", s)
	}
	return nil
}

// IsPattern reports whether s ends in the Wildcard.
func IsPattern(s string) bool {
	return s != "" && s[len(s)-1] == Wildcard
}

// Covers reports whether every concrete scope matched by child is also
// matched by parent: parent ⊇ child. It is false when either is invalid.
//
// The rule, the only one in Tether:
//   - a concrete parent covers only the identical scope;
//   - a pattern "p*" covers every scope, concrete or pattern, that starts
//     with p.
//
// So "tool:*" covers "tool:shell", "tool:sh*" and "tool:*" itself, but not
// "tool" (which does not start with "tool:"); "s3:read:bucket/*" covers
// "s3:read:bucket/a/b.txt"; a concrete "tool:shell" never covers a pattern.
// MCP tools are "mcp:<upstream>/<tool>": "mcp:fs/*" covers every tool of
// the upstream fs, while "mcp:fs*" also covers an upstream named fs2.
// Because the wildcard only ever ends a scope, this is exact containment of
// the matched sets, a preorder (reflexive and transitive), and decidable in
// one prefix comparison.
func Covers(parent, child string) bool {
	if ValidateScope(parent) != nil || ValidateScope(child) != nil {
		return false
	}
	return covers(parent, child)
}

// covers is Covers for scopes already validated.
func covers(parent, child string) bool {
	if !IsPattern(parent) {
		return parent == child
	}
	return strings.HasPrefix(child, parent[:len(parent)-1])
}

// Subset reports whether every child scope is covered by some single parent
// scope. When not, offending is the first child scope that is not covered
// (or is invalid). Coverage by one scope is deliberately conservative: a
// union of several patterns never stands in for a broader one, so a refusal
// is always explainable as "no parent scope covers X".
func Subset(parentScopes, childScopes []string) (offending string, ok bool) {
	for _, c := range childScopes {
		if !Allows(parentScopes, c) {
			return c, false
		}
	}
	return "", true
}

// Allows reports whether the granted scopes permit the required scope: some
// granted scope covers it. This is the check a tool gate makes per call,
// with required usually concrete (e.g. "tool:shell").
func Allows(granted []string, required string) bool {
	if ValidateScope(required) != nil {
		return false
	}
	for _, g := range granted {
		if ValidateScope(g) == nil && covers(g, required) {
			return true
		}
	}
	return false
}

// validateScopeSet checks a grant's scope list: 1..MaxScopes valid scopes,
// and returns it without exact duplicates, order kept.
func validateScopeSet(scopes []string) ([]string, error) {
	if len(scopes) == 0 {
		return nil, fmt.Errorf("%w: scopes: at least one scope is required", ErrInvalidScope)
	}
	if len(scopes) > MaxScopes {
		return nil, fmt.Errorf("%w: %d scopes exceed the limit of %d", ErrInvalidScope, len(scopes), MaxScopes)
	}
	out := make([]string, 0, len(scopes))
	seen := make(map[string]struct{}, len(scopes))
	for _, s := range scopes {
		if err := ValidateScope(s); err != nil {
			return nil, err
		}
		if _, dup := seen[s]; dup {
			continue
		}
		seen[s] = struct{}{}
		out = append(out, s)
	}
	return out, nil
}
