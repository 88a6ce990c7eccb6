package capability

import (
	"crypto/rand"
	"encoding/base32"
	"fmt"
	"io"
	"strings"
)

// Principals are the parties that issue and revoke grants. They are strings
// with a kind prefix so a revoker set is a plain string set:
//
//	operator:<subject>  a human or automation authenticated by an operator token
//	agent:<node_id>     an agent node of the tree
//	role:security       anyone holding the security role
//	role:admin          anyone holding the admin role
const (
	OperatorPrefix = "operator:"
	AgentPrefix    = "agent:"
	RolePrefix     = "role:"

	RoleSecurity = "role:security"
	RoleAdmin    = "role:admin"
)

// MaxIDBytes bounds grant ids, node ids and principal subjects.
const MaxIDBytes = 128

// OperatorPrincipal names an operator by its authenticated subject.
func OperatorPrincipal(subject string) string { return OperatorPrefix + subject }

// AgentPrincipal names an agent by its node id.
func AgentPrincipal(nodeID string) string { return AgentPrefix + nodeID }

// ValidateID checks a grant id or node id: 1 to MaxIDBytes bytes of
// printable ASCII without spaces. The error wraps ErrInvalidGrant and names
// the field.
func ValidateID(field, id string) error {
	if err := idProblem(field, id); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidGrant, err)
	}
	return nil
}

// idProblem is ValidateID without a sentinel, for callers that wrap their own.
func idProblem(field, id string) error {
	switch {
	case id == "":
		return fmt.Errorf("%s is required", field)
	case len(id) > MaxIDBytes:
		return fmt.Errorf("%s of %d bytes exceeds %d", field, len(id), MaxIDBytes)
	case !printableASCII(id):
		return fmt.Errorf("%s has a non-printable or non-ASCII byte", field)
	}
	return nil
}

// validatePrincipal checks that p is "<prefix><id>" with a valid id.
func validatePrincipal(field, p, prefix string) error {
	subject, ok := strings.CutPrefix(p, prefix)
	if !ok {
		return fmt.Errorf("%w: %s must start with %q", ErrInvalidGrant, field, prefix)
	}
	return ValidateID(field, subject)
}

// isRole reports whether p names a role. Only role principals may be
// presented as roles to CanRevoke: a caller cannot pass "agent:x" as a role
// and so borrow another agent's authority.
func isRole(p string) bool {
	return strings.HasPrefix(p, RolePrefix) && len(p) > len(RolePrefix)
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

var grantIDEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// NewGrantID returns "g_" followed by 128 random bits in lower-case base32.
// random defaults to crypto/rand; tests pass a deterministic reader.
func NewGrantID(random io.Reader) (string, error) {
	if random == nil {
		random = rand.Reader
	}
	var b [16]byte
	if _, err := io.ReadFull(random, b[:]); err != nil {
		return "", fmt.Errorf("capability: generate grant id: %w", err)
	}
	return "g_" + grantIDEncoding.EncodeToString(b[:]), nil
}
