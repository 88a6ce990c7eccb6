package capability_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/tetherhq/tether/capability"
)

// swarmModel is the naive model the property tests compare against: an
// agent tree and a grant tree linked by parent pointers, and the set of
// grants revoked directly.
type swarmModel struct {
	nodeParent map[string]string // "" for roots
	nodes      []string
	grants     map[string]capability.Grant
	order      []string
	revoked    map[string]time.Time // grant id → when it was revoked directly
	pruned     map[string]bool      // tombstones dropped from the set
}

func (m *swarmModel) ancestors(node string) []string {
	var out []string
	for p := m.nodeParent[node]; p != ""; p = m.nodeParent[p] {
		out = append(out, p)
	}
	slices.Reverse(out)
	return out
}

func (m *swarmModel) descendants(node string) []string {
	var out []string
	for _, n := range m.nodes {
		if slices.Contains(m.ancestors(n), node) {
			out = append(out, n)
		}
	}
	return out
}

// revokedVia walks parent pointers from id to the root and returns the
// topmost grant with a live tombstone.
func (m *swarmModel) revokedVia(id string) (string, bool) {
	via, found := "", false
	for cur := id; cur != ""; cur = m.grants[cur].ParentGrantID {
		if _, ok := m.revoked[cur]; ok && !m.pruned[cur] {
			via, found = cur, true
		}
	}
	return via, found
}

// usable reports whether no grant from id up to its root was revoked
// (tombstone pruned or not) or has expired.
func (m *swarmModel) usable(id string, now time.Time) bool {
	for cur := id; cur != ""; cur = m.grants[cur].ParentGrantID {
		if _, ok := m.revoked[cur]; ok || !now.Before(m.grants[cur].ExpiresAt) {
			return false
		}
	}
	return true
}

// mayRevoke is the revocation authority written from the design's words:
// the root's issuing operator, the holder of any strict ancestor grant, the
// security and admin roles — never the holder itself.
func (m *swarmModel) mayRevoke(id, principal string, roles []string) bool {
	g := m.grants[id]
	if principal == capability.AgentPrincipal(g.HolderNodeID) {
		return false
	}
	if slices.Contains(roles, capability.RoleSecurity) || slices.Contains(roles, capability.RoleAdmin) {
		return true
	}
	for cur := g.ParentGrantID; cur != ""; cur = m.grants[cur].ParentGrantID {
		if principal == capability.AgentPrincipal(m.grants[cur].HolderNodeID) {
			return true
		}
	}
	root := g
	for root.ParentGrantID != "" {
		root = m.grants[root.ParentGrantID]
	}
	return principal == root.Issuer
}

func (m *swarmModel) lookup(id string) (capability.Grant, bool) {
	g, ok := m.grants[id]
	return g, ok
}

var scopePool = []string{"tool:*", "tool:shell", "tool:fs:*", "tool:fs:read", "s3:read:*", "s3:read:logs/*", "s3:read:logs/a", "*"}

func TestPropertyRevocationMatchesTreeWalk(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		m := &swarmModel{
			nodeParent: map[string]string{},
			grants:     map[string]capability.Grant{},
			revoked:    map[string]time.Time{},
			pruned:     map[string]bool{},
		}
		var set capability.TombstoneSet
		now := t0
		seq := uint64(0)

		addNode := func() {
			id := fmt.Sprintf("n%d", len(m.nodes))
			parent := ""
			if len(m.nodes) > 0 && rapid.IntRange(0, 5).Draw(rt, "new root?") > 0 {
				// Favour recent nodes so the tree grows deep, not just wide.
				recent := m.nodes[max(0, len(m.nodes)-3):]
				parent = rapid.SampledFrom(recent).Draw(rt, "node parent")
				if rapid.IntRange(0, 3).Draw(rt, "any parent?") == 0 {
					parent = rapid.SampledFrom(m.nodes).Draw(rt, "any node parent")
				}
			}
			m.nodeParent[id] = parent
			m.nodes = append(m.nodes, id)
		}
		for range 3 {
			addNode()
		}

		steps := rapid.IntRange(1, 120).Draw(rt, "steps")
		for range steps {
			switch rapid.IntRange(0, 9).Draw(rt, "action") {
			case 0: // spawn an agent
				addNode()
			case 1: // an operator issues a root grant
				id := fmt.Sprintf("g%d", len(m.order))
				g, err := capability.NewRoot(capability.RootRequest{
					GrantID: id, Issuer: "operator:alice",
					HolderNodeID: rapid.SampledFrom(m.nodes).Draw(rt, "root holder"),
					Scopes:       rapid.SliceOfNDistinct(rapid.SampledFrom(scopePool), 1, 4, rapid.ID[string]).Draw(rt, "root scopes"),
					TTL:          time.Duration(rapid.IntRange(1, 600).Draw(rt, "root ttl min")) * time.Minute,
				}, now)
				if err != nil {
					rt.Fatalf("NewRoot: %v", err)
				}
				m.grants[id], m.order = g, append(m.order, id)
			case 2, 3, 4, 5: // a holder delegates
				if len(m.order) == 0 {
					continue
				}
				// Favour recent grants, which are the deepest.
				parentID := m.order[len(m.order)-1]
				switch rapid.IntRange(0, 3).Draw(rt, "parent kind") {
				case 0:
					parentID = rapid.SampledFrom(m.order[max(0, len(m.order)-4):]).Draw(rt, "recent parent")
				case 1:
					parentID = rapid.SampledFrom(m.order).Draw(rt, "any parent")
				}
				parent := m.grants[parentID]
				holder := rapid.SampledFrom(m.nodes).Draw(rt, "holder")
				switch rapid.IntRange(0, 4).Draw(rt, "holder kind") {
				case 0: // any node, usually outside the subtree
				case 1, 2: // a fresh child the holder spawns for the purpose
					holder = fmt.Sprintf("n%d", len(m.nodes))
					m.nodeParent[holder] = parent.HolderNodeID
					m.nodes = append(m.nodes, holder)
				default: // an existing descendant, if any
					if below := m.descendants(parent.HolderNodeID); len(below) > 0 {
						holder = rapid.SampledFrom(below).Draw(rt, "holder below")
					}
				}
				scopes := rapid.SliceOfNDistinct(rapid.SampledFrom(parent.Scopes), 1, 2, rapid.ID[string]).Draw(rt, "inherited scopes")
				if rapid.IntRange(0, 3).Draw(rt, "other scopes?") == 0 {
					scopes = rapid.SliceOfNDistinct(rapid.SampledFrom(scopePool), 1, 3, rapid.ID[string]).Draw(rt, "pool scopes")
				}
				ttl := time.Duration(0)
				if rapid.Bool().Draw(rt, "explicit ttl?") {
					ttl = time.Duration(rapid.IntRange(1, 120).Draw(rt, "ttl min")) * time.Minute
				}
				id := fmt.Sprintf("g%d", len(m.order))

				// The caller's duty: check the chain before delegating.
				verdict := capability.CheckGrant(parent, &set, m.lookup, now)
				if wantActive := m.usable(parent.GrantID, now); verdict.Active != wantActive {
					rt.Fatalf("CheckGrant(%s).Active = %v, model says %v (%s)", parent.GrantID, verdict.Active, wantActive, verdict.Reason)
				}
				if !verdict.Active {
					continue
				}
				g, err := capability.Delegate(parent, capability.DelegateRequest{
					GrantID: id, Issuer: capability.AgentPrincipal(parent.HolderNodeID),
					HolderNodeID: holder, Scopes: scopes, TTL: ttl,
				}, m.ancestors(holder), now)

				_, covered := capability.Subset(parent.Scopes, scopes)
				inSubtree := slices.Contains(m.ancestors(holder), parent.HolderNodeID)
				fits := ttl == 0 || !now.Add(ttl).After(parent.ExpiresAt)
				switch {
				case !inSubtree:
					if !errors.Is(err, capability.ErrNotInSubtree) {
						rt.Fatalf("delegation to %s outside %s's subtree: err = %v", holder, parent.HolderNodeID, err)
					}
				case len(parent.Chain)+1 > capability.MaxChainDepth:
					if !errors.Is(err, capability.ErrChainTooDeep) {
						rt.Fatalf("too deep: err = %v", err)
					}
				case !covered:
					if !errors.Is(err, capability.ErrScopeEscalation) {
						rt.Fatalf("escalating delegation %v from %v: err = %v", scopes, parent.Scopes, err)
					}
				case !fits:
					if !errors.Is(err, capability.ErrExpiryExceedsParent) {
						rt.Fatalf("delegation outliving its parent: err = %v", err)
					}
				case err != nil:
					rt.Fatalf("valid delegation refused: %v", err)
				default:
					m.grants[id], m.order = g, append(m.order, id)
				}
			case 6, 7: // someone revokes
				if len(m.order) == 0 {
					continue
				}
				id := rapid.SampledFrom(m.order).Draw(rt, "revoke")
				principals := []string{"operator:alice", "operator:bob"}
				for _, n := range m.nodes {
					principals = append(principals, capability.AgentPrincipal(n))
				}
				principal := rapid.SampledFrom(principals).Draw(rt, "principal")
				roles := rapid.SliceOfN(rapid.SampledFrom([]string{capability.RoleSecurity, capability.RoleAdmin, "role:viewer"}), 0, 1).Draw(rt, "roles")
				g := m.grants[id]
				if got, want := capability.CanRevoke(g, principal, roles), m.mayRevoke(id, principal, roles); got != want {
					rt.Fatalf("CanRevoke(%s, %s, %v) = %v, model says %v (revokers %v)", id, principal, roles, got, want, g.Revokers)
				}
				revoked, err := capability.Revoke(g, principal, roles, "property", now)
				if err != nil {
					continue
				}
				seq++
				ts, err := capability.TombstoneFor(revoked, seq)
				if err != nil {
					rt.Fatal(err)
				}
				if err := set.Add(ts); err != nil {
					rt.Fatal(err)
				}
				m.grants[id] = revoked
				m.revoked[id] = now
			case 8: // time passes
				now = now.Add(time.Duration(rapid.IntRange(0, 10).Draw(rt, "advance min")) * time.Minute)
			case 9: // the pruner runs
				set.Prune(now)
				for id, at := range m.revoked {
					if now.After(capability.DropAfter(at)) {
						m.pruned[id] = true
					}
				}
			}

			// Invariants over every grant after every step.
			for _, id := range m.order {
				g := m.grants[id]
				gotVia, got := set.Revoked(g.GrantID, g.Chain)
				wantVia, want := m.revokedVia(id)
				if got != want || gotVia != wantVia {
					rt.Fatalf("Revoked(%s, %v) = (%q, %v), tree walk = (%q, %v)", id, g.Chain, gotVia, got, wantVia, want)
				}
				if g.ParentGrantID == "" {
					continue
				}
				parent := m.grants[g.ParentGrantID]
				if _, ok := capability.Subset(parent.Scopes, g.Scopes); !ok || g.ExpiresAt.After(parent.ExpiresAt) {
					rt.Fatalf("grant %s is not attenuated from %s", id, parent.GrantID)
				}
				if !slices.Contains(m.ancestors(g.HolderNodeID), parent.HolderNodeID) {
					rt.Fatalf("grant %s held outside its parent's subtree", id)
				}
				if !slices.Equal(g.Chain, append(slices.Clone(parent.Chain), parent.GrantID)) {
					rt.Fatalf("grant %s chain %v does not extend its parent's %v", id, g.Chain, parent.Chain)
				}
			}
		}
	})
}

// TestPropertyKeyRotation mints tokens while keys rotate and the ring is
// pruned, and checks that every unexpired token keeps verifying — against
// the ring and against its published JWKS — and every token past
// exp + leeway is refused.
func TestPropertyKeyRotation(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		ring := newRing(rt, t0)
		root := mustRoot(rt, "g_root", "n_root", []string{"tool:*"}, 48*time.Hour, t0)
		minter := newMinter(rt)
		v := newVerifier(rt)
		type minted struct {
			token string
			exp   time.Time
		}
		var tokens []minted
		now := t0

		steps := rapid.IntRange(1, 50).Draw(rt, "steps")
		for range steps {
			switch rapid.IntRange(0, 4).Draw(rt, "action") {
			case 0:
				publishAhead := time.Duration(rapid.IntRange(0, 300).Draw(rt, "publish ahead s")) * time.Second
				next, _, err := ring.Rotate(nil, now, publishAhead, capability.MaxTokenTTL)
				if err != nil {
					rt.Fatal(err)
				}
				ring = next
			case 1:
				ring = ring.Prune(now)
			case 2:
				// Signer can be unavailable while a rotated-in key is published
				// ahead (see the keyring report); minting is then skipped.
				if _, err := ring.Signer(now); err != nil {
					continue
				}
				ttl := time.Duration(rapid.IntRange(1, int(capability.MaxTokenTTL/time.Second)).Draw(rt, "ttl s")) * time.Second
				token, exp, err := minter.Mint(ring, root, now, ttl)
				if err != nil {
					rt.Fatalf("Mint: %v", err)
				}
				tokens = append(tokens, minted{token, exp})
			case 3, 4:
				now = now.Add(time.Duration(rapid.IntRange(0, 600).Draw(rt, "advance s")) * time.Second)
			}

			jwks, err := ring.JWKS()
			if err != nil {
				rt.Fatal(err)
			}
			public, err := capability.ParseJWKS(jwks)
			if err != nil {
				rt.Fatal(err)
			}
			for i, tok := range tokens {
				for _, keys := range []capability.KeyLookup{ring, public} {
					_, err := v.Verify(tok.token, keys, now)
					switch {
					case now.Before(tok.exp) && err != nil:
						rt.Fatalf("token %d (exp %v) refused at %v: %v", i, tok.exp.Sub(t0), now.Sub(t0), err)
					case !now.Before(tok.exp.Add(v.Leeway())) && !errors.Is(err, capability.ErrTokenExpired) && !errors.Is(err, capability.ErrUnknownKey):
						rt.Fatalf("token %d (exp %v) at %v: err = %v, want expired or unknown key", i, tok.exp.Sub(t0), now.Sub(t0), err)
					}
				}
			}
		}
	})
}
