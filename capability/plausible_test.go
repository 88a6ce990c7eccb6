package capability_test

import (
	"strings"
	"testing"
	"time"

	"github.com/tetherhq/tether/capability"
)

// Plausible refuses what cannot verify without the signature's work, and
// accepts every token that might: a server refuses a flood of garbage with
// it once the flood's budget is spent, so it must never refuse a real one.
func TestPlausible(t *testing.T) {
	tr := newGrantTree(t)
	ring := newRing(t, t0)
	token, _, err := newMinter(t).Mint(ring, tr.a1x, t0, 0)
	if err != nil {
		t.Fatal(err)
	}
	v := newVerifier(t)
	now := t0.Add(time.Minute)
	if _, err := v.Verify(token, ring, now); err != nil {
		t.Fatal(err)
	}
	if !v.Plausible(token, ring, now) {
		t.Fatal("a valid token is not plausible")
	}
	// A forged signature needs the signature check to be told apart.
	i := len(token) - 10
	c := byte('A')
	if token[i] == 'A' {
		c = 'B'
	}
	if !v.Plausible(token[:i]+string(c)+token[i+1:], ring, now) {
		t.Fatal("a token whose signature needs checking is not plausible")
	}
	dot := strings.IndexByte(token, '.')
	for name, garbage := range map[string]string{
		"empty":              "",
		"one segment":        "abc",
		"three empty":        "..",
		"not base64url":      "a+b.c/d.e=",
		"four segments":      token + ".x",
		"short signature":    token[:len(token)-2],
		"header not JSON":    "YWJj" + token[dot:],
		"too large":          strings.Repeat("A", capability.MaxTokenBytes+1),
		"past its expiry":    token, // checked at a later time below
		"unknown key (ring)": token, // checked against another ring below
	} {
		switch name {
		case "past its expiry":
			if v.Plausible(garbage, ring, now.Add(24*time.Hour)) {
				t.Errorf("%s: plausible", name)
			}
		case "unknown key (ring)":
			if v.Plausible(garbage, newRing(t, t0), now) {
				t.Errorf("%s: plausible", name)
			}
		default:
			if v.Plausible(garbage, ring, now) {
				t.Errorf("%s: plausible", name)
			}
			if _, err := v.Verify(garbage, ring, now); err == nil {
				t.Errorf("%s: verifies", name)
			}
		}
	}
}

// BenchmarkPlausible is the check a gate's refused garbage costs once its
// refusals are spent, next to BenchmarkVerifyCold.
func BenchmarkPlausible(b *testing.B) {
	token, ring := benchToken(b)
	v := newVerifier(b)
	now := t0.Add(time.Minute)
	b.ReportAllocs()
	for b.Loop() {
		if !v.Plausible(token, ring, now) {
			b.Fatal("not plausible")
		}
	}
}
