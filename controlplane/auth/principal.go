package auth

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// Role is an operator's role.
type Role int

const (
	RoleNone Role = iota
	RoleViewer
	RoleOperator
	RoleSecurity
	RoleAdmin
)

// String returns the role's name as used in tokens and the CLI.
func (r Role) String() string {
	switch r {
	case RoleViewer:
		return "viewer"
	case RoleOperator:
		return "operator"
	case RoleSecurity:
		return "security"
	case RoleAdmin:
		return "admin"
	default:
		return "none"
	}
}

// ParseRole parses a role name.
func ParseRole(s string) (Role, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "viewer":
		return RoleViewer, nil
	case "operator":
		return RoleOperator, nil
	case "security":
		return RoleSecurity, nil
	case "admin":
		return RoleAdmin, nil
	default:
		return RoleNone, fmt.Errorf("auth: unknown role %q (want viewer, operator, security or admin)", s)
	}
}

// Kind says what sort of caller a principal is.
type Kind int

const (
	KindOperator Kind = iota + 1
	KindAgent
)

// Principal is an authenticated caller.
type Principal struct {
	Kind Kind
	// Subject is the operator's name or the agent's node id.
	Subject   string
	Role      Role
	TokenID   string
	ExpiresAt time.Time
	// Lineage is an agent's lineage: the node id of the root of its tree
	// (its own id for a root). The Interceptor fills it in from the node
	// (AgentActive); it is not a claim of the token. Empty for operators.
	Lineage string
}

// Budget names the rate-limit budget the principal spends from: an agent
// shares its lineage's with its root and every descendant, so spawning
// children buys no extra rate; any other caller has its own.
func (p Principal) Budget() string {
	if p.Kind == KindAgent && p.Lineage != "" {
		return "lineage:" + p.Lineage
	}
	return p.ID()
}

// ID is the principal's stable name, as it appears in grants' revoker sets
// and in records: "operator:<subject>" or "agent:<node id>".
func (p Principal) ID() string {
	if p.Kind == KindAgent {
		return "agent:" + p.Subject
	}
	return "operator:" + p.Subject
}

// IsAgent reports whether the caller is an agent.
func (p Principal) IsAgent() bool { return p.Kind == KindAgent }

// NodeID is the agent's node id, or "" for operators.
func (p Principal) NodeID() string {
	if p.Kind == KindAgent {
		return p.Subject
	}
	return ""
}

// HasRole reports whether an operator principal holds one of roles; admin
// holds every role.
func (p Principal) HasRole(roles ...Role) bool {
	if p.Kind != KindOperator {
		return false
	}
	if p.Role == RoleAdmin {
		return true
	}
	for _, r := range roles {
		if p.Role == r {
			return true
		}
	}
	return false
}

type principalKey struct{}

// WithPrincipal returns ctx carrying p.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// FromContext returns the authenticated principal. Handlers behind the
// interceptor can rely on it being present.
func FromContext(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}
