package auth

// Rule says who may call a procedure. Operators need one of Roles (admin
// always passes); agents pass only when Agents is set, and the handler then
// makes the tree-aware check (is this the caller's own node, or a
// descendant?); tool servers pass only when ToolServers is set.
type Rule struct {
	Roles       []Role
	Agents      bool
	ToolServers bool
}

// Rules for the common shapes.
var (
	// Read: every operator role, and agents (handlers scope what they see).
	Read = Rule{Roles: []Role{RoleViewer, RoleOperator, RoleSecurity}, Agents: true}
	// ReadOrToolLayer: Read, and tool servers: a fenced tool server asks
	// the coordinator which generation of a job it issued and whether it
	// may act now (agentsdk.IssuedGenerations) before it admits a
	// caller's side effect under a claimed generation.
	ReadOrToolLayer = Rule{Roles: []Role{RoleViewer, RoleOperator, RoleSecurity}, Agents: true, ToolServers: true}
	// ReadOperators: every operator role, no agents.
	ReadOperators = Rule{Roles: []Role{RoleViewer, RoleOperator, RoleSecurity}}
	// Operate: operators (admin implied).
	Operate = Rule{Roles: []Role{RoleOperator}}
	// OperateOrAgent: operators, or agents subject to the handler's check.
	OperateOrAgent = Rule{Roles: []Role{RoleOperator}, Agents: true}
	// Stop: operators and security, or agents subject to the handler's check.
	Stop = Rule{Roles: []Role{RoleOperator, RoleSecurity}, Agents: true}
	// Agent: agents only (the handler binds the caller to the holder).
	Agent = Rule{Agents: true}
	// Security: the security role and admins, e.g. revoking or listing
	// operator tokens.
	Security = Rule{Roles: []Role{RoleSecurity}}
	// Admin: admins only.
	Admin = Rule{Roles: []Role{RoleAdmin}}
	// ToolLayer: tool servers only (the handler binds the caller to its
	// gate). Operators, even admins, are not the tool layer.
	ToolLayer = Rule{ToolServers: true}
	// Verify: every authenticated caller, tool servers included: a tool
	// server's verifier follows the revocation feed and introspects the
	// capability tokens it is shown.
	Verify = Rule{Roles: []Role{RoleViewer, RoleOperator, RoleSecurity}, Agents: true, ToolServers: true}
	// Identity: every authenticated caller (WhoAmI).
	Identity = Rule{Roles: []Role{RoleViewer, RoleOperator, RoleSecurity}, Agents: true, ToolServers: true}
)

// Policy maps a Connect procedure ("/tether.v1.AgentService/Spawn") to its
// rule. Procedures missing from the policy are denied.
type Policy map[string]Rule

// Allows reports whether p may call a procedure governed by rule.
func (r Rule) Allows(p Principal) bool {
	switch p.Kind {
	case KindAgent:
		return r.Agents
	case KindToolServer:
		return r.ToolServers
	}
	// A rule with no roles is for agents only: an operator, even an admin,
	// does not act as the holder of a lease or a session.
	if len(r.Roles) == 0 {
		return false
	}
	return p.HasRole(r.Roles...)
}
