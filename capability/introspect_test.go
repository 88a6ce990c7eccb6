package capability_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tetherhq/tether/capability"
)

func claimsFor(g capability.Grant, exp time.Time) capability.Claims {
	return capability.Claims{
		GrantID: g.GrantID, HolderNodeID: g.HolderNodeID, Chain: g.Chain, Scopes: g.Scopes,
		IssuedAt: t0, NotBefore: t0, ExpiresAt: exp,
	}
}

func assertVerdict(t *testing.T, v capability.Verdict, active bool, want error, reason string) {
	t.Helper()
	if v.Active != active {
		t.Fatalf("Active = %v, want %v (reason %q)", v.Active, active, v.Reason)
	}
	if !errors.Is(v.Err, want) || (want == nil) != (v.Err == nil) {
		t.Fatalf("Err = %v, want %v", v.Err, want)
	}
	if !strings.Contains(v.Reason, reason) {
		t.Fatalf("Reason = %q, want it to contain %q", v.Reason, reason)
	}
}

func TestCheckExplains(t *testing.T) {
	tr := newGrantTree(t)
	now := t0.Add(2 * time.Minute)
	exp := t0.Add(5 * time.Minute)
	revokedAt := t0.Add(time.Minute)

	var none capability.TombstoneSet
	var aRevoked capability.TombstoneSet
	if err := aRevoked.Add(tomb(1, "g_a", revokedAt)); err != nil {
		t.Fatal(err)
	}
	var selfRevoked capability.TombstoneSet
	if err := selfRevoked.Add(tomb(1, "g_a1x", revokedAt)); err != nil {
		t.Fatal(err)
	}

	t.Run("active without a store", func(t *testing.T) {
		v := capability.Check(claimsFor(tr.a1x, exp), &none, nil, now)
		assertVerdict(t, v, true, nil, "active: grant g_a1x held by node n_a1x")
	})
	t.Run("active with a store", func(t *testing.T) {
		v := capability.Check(claimsFor(tr.a1x, exp), &none, tr.lookup(), now)
		assertVerdict(t, v, true, nil, "token expires at 2026-03-14T09:31:53Z")
		if !v.GrantFound || v.Grant.GrantID != "g_a1x" {
			t.Fatalf("grant not returned: %+v", v.Grant)
		}
	})
	t.Run("revoked via ancestor tombstone", func(t *testing.T) {
		v := capability.Check(claimsFor(tr.a1x, exp), &aRevoked, nil, now)
		assertVerdict(t, v, false, capability.ErrGrantRevoked, "revoked via ancestor grant g_a at 2026-03-14T09:27:53Z")
		if v.RevokedVia != "g_a" {
			t.Fatalf("RevokedVia = %q", v.RevokedVia)
		}
	})
	t.Run("revoked itself", func(t *testing.T) {
		v := capability.Check(claimsFor(tr.a1x, exp), &selfRevoked, nil, now)
		assertVerdict(t, v, false, capability.ErrGrantRevoked, "grant g_a1x revoked at 2026-03-14T09:27:53Z")
	})
	t.Run("an unrelated revocation does not matter", func(t *testing.T) {
		v := capability.Check(claimsFor(tr.b, exp), &aRevoked, tr.lookup(), now)
		assertVerdict(t, v, true, nil, "active")
	})
	t.Run("token expired, strictly", func(t *testing.T) {
		v := capability.Check(claimsFor(tr.a1x, exp), nil, nil, exp)
		assertVerdict(t, v, false, capability.ErrTokenExpired, "expired at 2026-03-14T09:31:53Z")
	})
	t.Run("unknown grant", func(t *testing.T) {
		ghost := tr.a1x
		ghost.GrantID = "g_ghost"
		v := capability.Check(claimsFor(ghost, exp), nil, tr.lookup(), now)
		assertVerdict(t, v, false, capability.ErrUnknownGrant, "g_ghost")
	})
	t.Run("holder differs from the store", func(t *testing.T) {
		c := claimsFor(tr.a1x, exp)
		c.HolderNodeID = "n_b"
		v := capability.Check(c, nil, tr.lookup(), now)
		assertVerdict(t, v, false, capability.ErrChainBroken, "different holder")
	})
	t.Run("chain differs from the store", func(t *testing.T) {
		c := claimsFor(tr.a1x, exp)
		c.Chain = []string{"g_root"}
		v := capability.Check(c, nil, tr.lookup(), now)
		assertVerdict(t, v, false, capability.ErrChainBroken, "different chain")
	})
	t.Run("scope the grant does not have", func(t *testing.T) {
		c := claimsFor(tr.a1x, exp)
		c.Scopes = []string{"tool:net"}
		v := capability.Check(c, nil, tr.lookup(), now)
		assertVerdict(t, v, false, capability.ErrScopeEscalation, `"tool:net"`)
	})
	t.Run("ancestor revoked in the store after its tombstone was pruned", func(t *testing.T) {
		revokedA, err := capability.Revoke(tr.a, "agent:n_root", nil, "", revokedAt)
		if err != nil {
			t.Fatal(err)
		}
		lookup := withGrant(tr.lookup(), revokedA)
		v := capability.Check(claimsFor(tr.a1x, exp), &none, lookup, now)
		assertVerdict(t, v, false, capability.ErrGrantRevoked, "revoked via ancestor grant g_a at 2026-03-14T09:27:53Z")
	})
}

func withGrant(base capability.GrantLookup, g capability.Grant) capability.GrantLookup {
	return func(id string) (capability.Grant, bool) {
		if id == g.GrantID {
			return g, true
		}
		return base(id)
	}
}

func without(base capability.GrantLookup, missing string) capability.GrantLookup {
	return func(id string) (capability.Grant, bool) {
		if id == missing {
			return capability.Grant{}, false
		}
		return base(id)
	}
}

func TestCheckGrant(t *testing.T) {
	tr := newGrantTree(t)
	now := t0.Add(2 * time.Minute)

	assertVerdict(t, capability.CheckGrant(tr.a1x, nil, tr.lookup(), now), true, nil, "active: grant g_a1x held by node n_a1x until")

	expired := capability.CheckGrant(tr.a1x, nil, tr.lookup(), tr.a1x.ExpiresAt)
	assertVerdict(t, expired, false, capability.ErrGrantExpired, "g_a1x expired at 2026-03-14T09:36:53Z")

	// The root expires after everything below it, so put the ancestor's
	// expiry before the child's artificially.
	shortA := tr.a
	shortA.ExpiresAt = now
	assertVerdict(t, capability.CheckGrant(tr.a1x, nil, withGrant(tr.lookup(), shortA), now),
		false, capability.ErrGrantExpired, "ancestor grant g_a expired")

	assertVerdict(t, capability.CheckGrant(tr.a1x, nil, without(tr.lookup(), "g_a"), now),
		false, capability.ErrUnknownGrant, "ancestor grant g_a")

	forged := tr.a
	forged.Chain = []string{"g_other"}
	assertVerdict(t, capability.CheckGrant(tr.a1x, nil, withGrant(tr.lookup(), forged), now),
		false, capability.ErrChainBroken, "g_a disagrees")

	orphan := tr.a1x
	orphan.ParentGrantID = "g_b"
	assertVerdict(t, capability.CheckGrant(orphan, nil, tr.lookup(), now),
		false, capability.ErrChainBroken, `names parent "g_b"`)

	revokedA, err := capability.Revoke(tr.a, "agent:n_root", nil, "", t0.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	marked, err := capability.MarkRevokedVia(tr.a1, revokedA)
	if err != nil {
		t.Fatal(err)
	}
	v := capability.CheckGrant(marked, nil, nil, now)
	assertVerdict(t, v, false, capability.ErrGrantRevoked, "g_a1 revoked via ancestor grant g_a")
	if v.RevokedVia != "g_a" {
		t.Fatalf("RevokedVia = %q", v.RevokedVia)
	}
	v = capability.CheckGrant(revokedA, nil, nil, now)
	assertVerdict(t, v, false, capability.ErrGrantRevoked, "grant g_a was revoked at")
}

func TestIntrospect(t *testing.T) {
	tr := newGrantTree(t)
	ring := newRing(t, t0)
	token, exp, err := newMinter(t).Mint(ring, tr.a1, t0, 0)
	if err != nil {
		t.Fatal(err)
	}
	v := newVerifier(t)
	var tombstones capability.TombstoneSet

	claims, verdict := capability.Introspect(token, v, ring, &tombstones, tr.lookup(), t0.Add(time.Minute))
	assertVerdict(t, verdict, true, nil, "active")
	if claims.GrantID != "g_a1" || !claims.ExpiresAt.Equal(exp) {
		t.Fatalf("claims = %+v", claims)
	}

	if err := tombstones.Add(tomb(1, "g_root", t0.Add(2*time.Minute))); err != nil {
		t.Fatal(err)
	}
	_, verdict = capability.Introspect(token, v, ring, &tombstones, tr.lookup(), t0.Add(3*time.Minute))
	assertVerdict(t, verdict, false, capability.ErrGrantRevoked, "revoked via ancestor grant g_root")

	sig := strings.LastIndexByte(token, '.') + 1
	forged := token[:sig] + string("AB"[boolToInt(token[sig] == 'A')]) + token[sig+1:]
	_, verdict = capability.Introspect(forged, v, ring, &tombstones, tr.lookup(), t0.Add(time.Minute))
	assertVerdict(t, verdict, false, capability.ErrTokenSignature, "signature")
	if strings.Contains(verdict.Reason, token[:20]) {
		t.Fatal("reason quotes the token")
	}
}

func boolToInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
