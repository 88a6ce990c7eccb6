package capability

import (
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// MaxChainDepth bounds the number of ancestors a grant may have. It bounds
// token size and the O(depth) revocation check.
const MaxChainDepth = 16

// MaxReasonBytes bounds a revocation reason.
const MaxReasonBytes = 1024

// State is a grant's lifecycle state. The numbering matches the GrantState
// enum of tether.v1 so the RPC layer maps it by conversion.
type State uint8

const (
	StateUnspecified State = iota
	// StateActive: usable between NotBefore and ExpiresAt unless revoked.
	StateActive
	// StateRevoked: terminal; revoked directly or through an ancestor.
	StateRevoked
	// StateExpired: terminal; reached ExpiresAt while active.
	StateExpired
)

func (s State) String() string {
	switch s {
	case StateActive:
		return "active"
	case StateRevoked:
		return "revoked"
	case StateExpired:
		return "expired"
	default:
		return "unspecified"
	}
}

// MarshalText renders the state as its name, so stored JSON is readable.
func (s State) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText parses a state name written by MarshalText.
func (s *State) UnmarshalText(text []byte) error {
	switch string(text) {
	case "active":
		*s = StateActive
	case "revoked":
		*s = StateRevoked
	case "expired":
		*s = StateExpired
	case "unspecified", "":
		*s = StateUnspecified
	default:
		return fmt.Errorf("%w: unknown grant state %q", ErrInvalidGrant, text)
	}
	return nil
}

// Grant is one node of the capability tree: a set of scopes held by one
// agent node for a window of time, derived from its parent grant.
type Grant struct {
	GrantID string `json:"grant_id" pb:"1"`
	// ParentGrantID is empty for a root grant.
	ParentGrantID string `json:"parent_grant_id,omitempty" pb:"2"`
	// HolderNodeID is the agent node that holds (and may use) the grant.
	HolderNodeID string `json:"holder_node_id" pb:"3"`
	// Issuer is the principal that created the grant: an operator for a
	// root, the parent's holder ("agent:<node_id>") for a delegation.
	Issuer    string    `json:"issuer" pb:"4"`
	Scopes    []string  `json:"scopes" pb:"5"`
	NotBefore time.Time `json:"not_before" pb:"6"`
	ExpiresAt time.Time `json:"expires_at" pb:"7"`
	// Chain is the ancestor grant ids, root first, excluding this grant.
	Chain []string `json:"chain,omitempty" pb:"8"`
	// Revokers is the sorted set of principals allowed to revoke the grant:
	// its issuer, the holder of every ancestor grant, the root's issuer and
	// the security and admin roles. Never the holder itself.
	Revokers []string `json:"revokers" pb:"9"`
	// State is the stored state; StateAt adds expiry by the clock.
	State     State     `json:"state" pb:"10"`
	RevokedBy string    `json:"revoked_by,omitempty" pb:"11"`
	RevokedAt time.Time `json:"revoked_at,omitzero" pb:"12"`
	// RevokedVia is the grant whose revocation revoked this one: itself,
	// or the ancestor whose tombstone covers it.
	RevokedVia string    `json:"revoked_via,omitempty" pb:"15"`
	Reason     string    `json:"reason,omitempty" pb:"13"`
	CreatedAt  time.Time `json:"created_at" pb:"14"`
}

// StateAt is the grant's effective state at now: a stored revocation wins;
// otherwise an active grant at or past ExpiresAt is expired. It does not
// consult ancestors or tombstones; CheckGrant does.
func (g Grant) StateAt(now time.Time) State {
	if g.State == StateActive && !now.Before(g.ExpiresAt) {
		return StateExpired
	}
	return g.State
}

// CheckActive returns nil if the grant itself is usable at now, or an error
// wrapping ErrGrantRevoked, ErrGrantExpired, ErrGrantNotYetValid or
// ErrInvalidGrant (unspecified state) that names the grant.
func (g Grant) CheckActive(now time.Time) error {
	switch g.StateAt(now) {
	case StateActive:
		if now.Before(g.NotBefore) {
			return fmt.Errorf("%w: grant %s is valid from %s", ErrGrantNotYetValid, g.GrantID, formatTime(g.NotBefore))
		}
		return nil
	case StateRevoked:
		return fmt.Errorf("%w: grant %s was revoked at %s", ErrGrantRevoked, g.GrantID, formatTime(g.RevokedAt))
	case StateExpired:
		return fmt.Errorf("%w: grant %s expired at %s", ErrGrantExpired, g.GrantID, formatTime(g.ExpiresAt))
	default:
		return fmt.Errorf("%w: grant %s has no state", ErrInvalidGrant, g.GrantID)
	}
}

// RootRequest asks for a root grant, issued by an operator to any node.
type RootRequest struct {
	// GrantID is chosen by the caller (see NewGrantID): the core does no I/O
	// and draws no randomness.
	GrantID      string
	Issuer       string // "operator:<subject>"
	HolderNodeID string
	Scopes       []string
	TTL          time.Duration // > 0
}

// NewRoot creates a root grant valid from now for TTL. Its revokers are the
// issuing operator and the security and admin roles.
func NewRoot(req RootRequest, now time.Time) (Grant, error) {
	if err := ValidateID("grant_id", req.GrantID); err != nil {
		return Grant{}, err
	}
	if err := validatePrincipal("issuer", req.Issuer, OperatorPrefix); err != nil {
		return Grant{}, err
	}
	if err := ValidateID("holder_node_id", req.HolderNodeID); err != nil {
		return Grant{}, err
	}
	scopes, err := validateScopeSet(req.Scopes)
	if err != nil {
		return Grant{}, err
	}
	if req.TTL <= 0 {
		return Grant{}, fmt.Errorf("%w: ttl %s is out of range: want more than 0s", ErrInvalidTTL, req.TTL)
	}
	return Grant{
		GrantID:      req.GrantID,
		HolderNodeID: req.HolderNodeID,
		Issuer:       req.Issuer,
		Scopes:       scopes,
		NotBefore:    now,
		ExpiresAt:    now.Add(req.TTL),
		Revokers:     revokerSet(req.HolderNodeID, req.Issuer),
		State:        StateActive,
		CreatedAt:    now,
	}, nil
}

// DelegateRequest asks the holder of a parent grant to derive a narrower
// grant for a node in its subtree.
type DelegateRequest struct {
	GrantID string
	// Issuer is the authenticated caller; it must be the parent's holder,
	// "agent:<parent holder node id>".
	Issuer       string
	HolderNodeID string
	Scopes       []string
	// TTL is the requested lifetime from now. Zero inherits the parent's
	// expiry. A TTL that would outlive the parent is refused, not clamped:
	// a caller that asked for an hour should learn it cannot have one.
	TTL time.Duration
}

// Delegate derives a grant from parent, enforcing attenuation at issuance:
//
//   - the parent is active at now (not revoked, not expired, past not_before);
//   - the issuer holds the parent (ErrNotHolder);
//   - the new holder is a strict descendant of the parent's holder:
//     holderAncestors, the new holder's ancestor node ids root first as the
//     agent tree records them, contains the parent's holder (ErrNotInSubtree);
//     delegating to oneself, a sibling, an ancestor or an unrelated node is
//     refused;
//   - every requested scope is covered by a parent scope (ErrScopeEscalation,
//     naming the first scope that is not);
//   - the expiry is no later than the parent's (ErrExpiryExceedsParent);
//   - the chain stays within MaxChainDepth (ErrChainTooDeep).
//
// The child's revokers are the parent's revokers plus the parent's holder
// and the issuer, minus the child's own holder: every ancestor can pull the
// tether, the agent at the end of it cannot.
func Delegate(parent Grant, req DelegateRequest, holderAncestors []string, now time.Time) (Grant, error) {
	if err := parent.CheckActive(now); err != nil {
		return Grant{}, err
	}
	if err := ValidateID("grant_id", req.GrantID); err != nil {
		return Grant{}, err
	}
	if req.GrantID == parent.GrantID || slices.Contains(parent.Chain, req.GrantID) {
		return Grant{}, fmt.Errorf("%w: grant_id %s is already in the chain", ErrInvalidGrant, req.GrantID)
	}
	if req.Issuer != AgentPrincipal(parent.HolderNodeID) {
		return Grant{}, fmt.Errorf("%w: grant %s is held by %s", ErrNotHolder, parent.GrantID, AgentPrincipal(parent.HolderNodeID))
	}
	if err := ValidateID("holder_node_id", req.HolderNodeID); err != nil {
		return Grant{}, err
	}
	if req.HolderNodeID == parent.HolderNodeID {
		return Grant{}, fmt.Errorf("%w: node %s already holds grant %s; delegate to a descendant",
			ErrNotInSubtree, req.HolderNodeID, parent.GrantID)
	}
	if !slices.Contains(holderAncestors, parent.HolderNodeID) || slices.Contains(holderAncestors, req.HolderNodeID) {
		return Grant{}, fmt.Errorf("%w: node %s is not a descendant of %s",
			ErrNotInSubtree, req.HolderNodeID, parent.HolderNodeID)
	}
	if len(parent.Chain)+1 > MaxChainDepth {
		return Grant{}, fmt.Errorf("%w: grant %s is already %d levels deep (limit %d)",
			ErrChainTooDeep, parent.GrantID, len(parent.Chain), MaxChainDepth)
	}
	scopes, err := validateScopeSet(req.Scopes)
	if err != nil {
		return Grant{}, err
	}
	if offending, ok := Subset(parent.Scopes, scopes); !ok {
		return Grant{}, fmt.Errorf("%w: scope %q is not covered by parent grant %s", ErrScopeEscalation, offending, parent.GrantID)
	}
	expires := parent.ExpiresAt
	switch {
	case req.TTL < 0:
		return Grant{}, fmt.Errorf("%w: ttl %s is out of range: want 0s (until the parent grant expires) or more", ErrInvalidTTL, req.TTL)
	case req.TTL > 0:
		expires = now.Add(req.TTL)
		if expires.After(parent.ExpiresAt) {
			return Grant{}, fmt.Errorf("%w: requested expiry %s is after parent grant %s expiry %s",
				ErrExpiryExceedsParent, formatTime(expires), parent.GrantID, formatTime(parent.ExpiresAt))
		}
	}
	chain := make([]string, 0, len(parent.Chain)+1)
	chain = append(chain, parent.Chain...)
	chain = append(chain, parent.GrantID)

	revokers := append(slices.Clone(parent.Revokers), AgentPrincipal(parent.HolderNodeID), req.Issuer)
	return Grant{
		GrantID:       req.GrantID,
		ParentGrantID: parent.GrantID,
		HolderNodeID:  req.HolderNodeID,
		Issuer:        req.Issuer,
		Scopes:        scopes,
		NotBefore:     now,
		ExpiresAt:     expires,
		Chain:         chain,
		Revokers:      revokerSet(req.HolderNodeID, revokers...),
		State:         StateActive,
		CreatedAt:     now,
	}, nil
}

// revokerSet returns principals plus the security and admin roles, sorted
// and without duplicates, and never the holder itself.
func revokerSet(holderNodeID string, principals ...string) []string {
	self := AgentPrincipal(holderNodeID)
	out := make([]string, 0, len(principals)+2)
	for _, p := range append(principals, RoleSecurity, RoleAdmin) {
		if p != "" && p != self {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// CanRevoke reports whether principal, holding roles, may revoke g: the
// principal or one of its roles is in g.Revokers, and the principal is not
// the grant's own holder. Entries of roles that are not "role:..." are
// ignored, so a caller cannot smuggle another principal in as a role, and
// a principal spelled as a role is not one.
func CanRevoke(g Grant, principal string, roles []string) bool {
	if principal == AgentPrincipal(g.HolderNodeID) {
		return false
	}
	// A role counts only when presented as one: no principal is named
	// "role:…", and a caller that claims to be one is not believed.
	if principal != "" && !strings.HasPrefix(principal, RolePrefix) && slices.Contains(g.Revokers, principal) {
		return true
	}
	for _, r := range roles {
		if isRole(r) && slices.Contains(g.Revokers, r) {
			return true
		}
	}
	return false
}

// Revoke is the active → revoked transition made by an authorized
// principal. It refuses a principal outside the revoker set
// (ErrNotRevoker), a grant already revoked (ErrGrantRevoked; the caller may
// treat it as an idempotent success) and a grant already expired at now
// (ErrGrantExpired: it is reported as expired, not revoked).
//
// Revoking a grant revokes its subtree: the caller writes one tombstone for
// g (see DropAfter) in the same transaction and marks descendants later
// with MarkRevokedVia.
func Revoke(g Grant, principal string, roles []string, reason string, now time.Time) (Grant, error) {
	if !CanRevoke(g, principal, roles) {
		return g, fmt.Errorf("%w: %s may not revoke grant %s", ErrNotRevoker, describePrincipal(principal), g.GrantID)
	}
	if err := validateReason(reason); err != nil {
		return g, err
	}
	if err := transition(g, StateRevoked, now); err != nil {
		return g, err
	}
	g.State = StateRevoked
	g.RevokedBy = principal
	g.RevokedAt = now
	g.RevokedVia = g.GrantID
	g.Reason = reason
	return g, nil
}

// MarkRevokedVia records that g was revoked by the revocation of revoked,
// one of its ancestors. It is the physical marking the caller does
// asynchronously after writing the ancestor's tombstone; authority was
// checked when the ancestor was revoked. The outcome depends only on the
// stored grants, not on when the marking runs: a grant that had already
// expired when the ancestor was revoked stays expired (ErrGrantExpired), one
// already revoked is left as it is (ErrGrantRevoked).
func MarkRevokedVia(g Grant, revoked Grant) (Grant, error) {
	if revoked.State != StateRevoked {
		return g, fmt.Errorf("%w: grant %s is %s, not revoked", ErrInvalidGrant, revoked.GrantID, revoked.State)
	}
	via := revoked.RevokedVia
	if via == "" {
		via = revoked.GrantID
	}
	if !slices.Contains(g.Chain, revoked.GrantID) || !slices.Contains(g.Chain, via) {
		return g, fmt.Errorf("%w: grant %s does not derive from %s", ErrChainBroken, g.GrantID, via)
	}
	if err := transition(g, StateRevoked, revoked.RevokedAt); err != nil {
		return g, err
	}
	g.State = StateRevoked
	g.RevokedBy = revoked.RevokedBy
	g.RevokedAt = revoked.RevokedAt
	g.RevokedVia = via
	g.Reason = revoked.Reason
	return g, nil
}

// Expire is the active → expired transition, legal once now reaches
// ExpiresAt. Storing it is optional (StateAt already reports expiry); it
// lets listings and records say "expired" without a clock.
func Expire(g Grant, now time.Time) (Grant, error) {
	if err := transition(g, StateExpired, now); err != nil {
		return g, err
	}
	g.State = StateExpired
	return g, nil
}

// transition is the one place that decides which state edges exist:
// active → revoked while before ExpiresAt, and active → expired at or after
// it. Revoked is terminal. A stored expiry does not hide a revocation that
// happened before it (at < ExpiresAt), so marking a subtree late records
// the same outcome as marking it at once.
func transition(g Grant, to State, at time.Time) error {
	from := g.State
	switch {
	case from == StateExpired && at.Before(g.ExpiresAt):
		from = StateActive // it was still active at the time of the event
	case from == StateActive && !at.Before(g.ExpiresAt):
		from = StateExpired
	}
	switch {
	case from == StateRevoked:
		return fmt.Errorf("%w: grant %s was already revoked at %s", ErrGrantRevoked, g.GrantID, formatTime(g.RevokedAt))
	case from == StateActive && to == StateRevoked:
		return nil
	case from == StateExpired && to == StateRevoked:
		return fmt.Errorf("%w: grant %s expired at %s, before the revocation", ErrGrantExpired, g.GrantID, formatTime(g.ExpiresAt))
	case from == StateExpired && to == StateExpired && g.State == StateActive:
		return nil
	case from == StateExpired && to == StateExpired:
		return fmt.Errorf("%w: grant %s is already expired", ErrGrantExpired, g.GrantID)
	case from == StateActive && to == StateExpired:
		return fmt.Errorf("%w: grant %s expires at %s, not yet", ErrInvalidGrant, g.GrantID, formatTime(g.ExpiresAt))
	default:
		return fmt.Errorf("%w: grant %s cannot go from %s to %s", ErrInvalidGrant, g.GrantID, from, to)
	}
}

func validateReason(reason string) error {
	if len(reason) > MaxReasonBytes {
		return fmt.Errorf("%w: reason of %d bytes exceeds %d", ErrInvalidGrant, len(reason), MaxReasonBytes)
	}
	if !utf8.ValidString(reason) {
		return fmt.Errorf("%w: reason is not valid UTF-8", ErrInvalidGrant)
	}
	return nil
}

// describePrincipal quotes a principal for an error message when it is
// well-formed, and describes it otherwise, so attacker-chosen bytes do not
// reach logs verbatim.
func describePrincipal(p string) string {
	if p == "" {
		return "anonymous principal"
	}
	if len(p) > MaxIDBytes+16 || !printableASCII(p) {
		return "malformed principal"
	}
	return fmt.Sprintf("%q", p)
}

func formatTime(t time.Time) string {
	return t.UTC().Format(time.RFC3339Nano)
}
