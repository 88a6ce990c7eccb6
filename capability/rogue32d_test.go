package capability_test

import (
	"errors"
	"testing"
	"time"

	"github.com/tetherhq/tether/capability"
)

// VerifyHolder names the holder of a token past its expiry, and of nothing
// else Verify refuses: a forged signature, another ring's key or a token
// not yet valid get no claims. (Fails if an expired token's holder is not
// named, or a forged one's is.)
func TestRogue32DVerifyHolderNamesOnlyAnExpiredTokensHolder(t *testing.T) {
	tr := newGrantTree(t)
	ring := newRing(t, t0)
	token, _, err := newMinter(t).Mint(ring, tr.a1x, t0, 0)
	if err != nil {
		t.Fatal(err)
	}
	v := newVerifier(t)
	live, err := v.Verify(token, ring, t0.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	late := live.ExpiresAt.Add(24 * time.Hour)
	if _, err := v.Verify(token, ring, late); !errors.Is(err, capability.ErrTokenExpired) {
		t.Fatalf("Verify past the expiry: %v; want expired", err)
	}
	claims, err := v.VerifyHolder(token, ring, late)
	if !errors.Is(err, capability.ErrTokenExpired) || claims.HolderNodeID != live.HolderNodeID || claims.GrantID != live.GrantID {
		t.Fatalf("VerifyHolder past the expiry: %+v, %v; want holder %s, grant %s and the expiry", claims, err, live.HolderNodeID, live.GrantID)
	}
	if claims, err := v.VerifyHolder(token, ring, t0.Add(time.Minute)); err != nil || claims.GrantID != live.GrantID {
		t.Fatalf("VerifyHolder of a live token: %+v, %v", claims, err)
	}
	i := len(token) - 10
	c := byte('A')
	if token[i] == 'A' {
		c = 'B'
	}
	for name, tc := range map[string]struct {
		token string
		ring  capability.KeyLookup
		at    time.Time
	}{
		"forged signature": {token[:i] + string(c) + token[i+1:], ring, late},
		"another ring":     {token, newRing(t, t0), late},
		"not yet valid":    {token, ring, t0.Add(-time.Hour)},
		"garbage":          {"a.b.c", ring, late},
	} {
		if claims, err := v.VerifyHolder(tc.token, tc.ring, tc.at); err == nil || errors.Is(err, capability.ErrTokenExpired) || claims.HolderNodeID != "" {
			t.Errorf("%s: VerifyHolder %+v, %v; want refused with no holder", name, claims, err)
		}
	}
}
