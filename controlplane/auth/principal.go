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
	// KindToolServer is a tool layer (a tool gate, an MCP gateway): the
	// only party that reports tool calls to the ledger. Its credential is
	// not the agent's, so an agent cannot end or acknowledge its own calls.
	KindToolServer
)

// Principal is an authenticated caller.
type Principal struct {
	Kind Kind
	// Subject is the operator's name, the agent's node id or the tool
	// server's name.
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
// and in records: "operator:<subject>", "agent:<node id>" or
// "tool:<tool server>". A principal that is none of these (the zero value,
// or one without a subject) has no ID: "", which names nobody, so a
// missing principal never passes for an operator.
func (p Principal) ID() string {
	if p.Subject == "" {
		return ""
	}
	switch p.Kind {
	case KindOperator:
		return "operator:" + p.Subject
	case KindAgent:
		return "agent:" + p.Subject
	case KindToolServer:
		return "tool:" + p.Subject
	}
	return ""
}

// IsAgent reports whether the caller is an agent.
func (p Principal) IsAgent() bool { return p.Kind == KindAgent }

// IsToolServer reports whether the caller is a tool server.
func (p Principal) IsToolServer() bool { return p.Kind == KindToolServer }

// ToolServer is the tool server's name (its gate id), or "" for others.
func (p Principal) ToolServer() string {
	if p.Kind == KindToolServer {
		return p.Subject
	}
	return ""
}

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
