package capability_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tetherhq/tether/capability"
)

// TestRogue39ITokenNamesItsTree: a capability token names its holder's
// tree (the root claim, the root node's id), so that a verifier following
// one tree's revocations can refuse another tree's token (agentsdk's
// ErrTreeNotFollowed). The claim round-trips, is absent from a token
// minted without a tree, is a known claim (named twice or in another case
// it is refused, as the other known claims are), and a malformed one is
// refused at minting and at verification.
func TestRogue39ITokenNamesItsTree(t *testing.T) {
	tr := newGrantTree(t)
	ring := newRing(t, t0)
	m, v := newMinter(t), newVerifier(t)
	token, _, err := m.MintInTree(ring, tr.a1x, "n_root", t0, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	claims, err := v.Verify(token, ring, t0)
	if err != nil || claims.Root != "n_root" {
		t.Fatalf("root claim = %q, %v; want n_root", claims.Root, err)
	}
	untreed, _, err := m.Mint(ring, tr.a1x, t0, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if claims, err := v.Verify(untreed, ring, t0); err != nil || claims.Root != "" {
		t.Fatalf("a token minted without a tree: root %q, %v", claims.Root, err)
	}
	if _, _, err := m.MintInTree(ring, tr.a1x, "n\x01root", t0, time.Minute); !errors.Is(err, capability.ErrInvalidGrant) {
		t.Fatalf("minting with a malformed root: %v", err)
	}

	key := signer(t, ring, t0)
	sign := func(extra map[string]any) string {
		c := goodClaims()
		for k, val := range extra {
			c[k] = val
		}
		return signRaw(t, key.Private, edHeader(key.ID), c)
	}
	if claims, err := v.Verify(sign(map[string]any{"root": "n_root"}), ring, t0); err != nil || claims.Root != "n_root" {
		t.Fatalf("a crafted root claim: %q, %v", claims.Root, err)
	}
	for name, extra := range map[string]map[string]any{
		"another case":  {"ROOT": "n_other"},
		"both cases":    {"root": "n_root", "Root": "n_other"},
		"not a string":  {"root": 7},
		"non-printable": {"root": "n\u00e9"},
		"too long":      {"root": strings.Repeat("n", capability.MaxIDBytes+1)},
	} {
		if _, err := v.Verify(sign(extra), ring, t0); !errors.Is(err, capability.ErrTokenClaims) && !errors.Is(err, capability.ErrTokenMalformed) {
			t.Errorf("%s: %v, want refused", name, err)
		}
	}
}
