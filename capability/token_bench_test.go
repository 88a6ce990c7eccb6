package capability_test

import (
	"crypto/ed25519"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tetherhq/tether/capability"
)

func benchToken(b *testing.B) (token string, ring capability.KeyRing) {
	b.Helper()
	tr := newGrantTree(b)
	ring = newRing(b, t0)
	token, _, err := newMinter(b).Mint(ring, tr.a1x, t0, 0)
	if err != nil {
		b.Fatal(err)
	}
	return token, ring
}

// BenchmarkVerifyCold is a full verification with nothing cached: size and
// alphabet checks, base64 and JSON decoding, key lookup, Ed25519, claims.
func BenchmarkVerifyCold(b *testing.B) {
	token, ring := benchToken(b)
	v := newVerifier(b)
	now := t0.Add(time.Minute)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := v.Verify(token, ring, now); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEd25519Verify is the signature check alone on the same token's
// signing input: the floor under BenchmarkVerifyCold.
func BenchmarkEd25519Verify(b *testing.B) {
	token, ring := benchToken(b)
	dot := strings.LastIndexByte(token, '.')
	input := []byte(token[:dot])
	sig, err := base64.RawURLEncoding.DecodeString(token[dot+1:])
	if err != nil {
		b.Fatal(err)
	}
	pub := ring.Keys[0].Public
	b.ReportAllocs()
	for b.Loop() {
		if !ed25519.Verify(pub, input, sig) {
			b.Fatal("signature does not verify")
		}
	}
}

func BenchmarkMint(b *testing.B) {
	tr := newGrantTree(b)
	ring := newRing(b, t0)
	m := newMinter(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := m.Mint(ring, tr.a1x, t0, 0); err != nil {
			b.Fatal(err)
		}
	}
}

// tombstoneBench is a set holding 10,000 live tombstones and a chain of
// depth 8, the shape of a busy verifier.
func tombstoneBench(b *testing.B) (*capability.TombstoneSet, []string) {
	b.Helper()
	set := &capability.TombstoneSet{}
	batch := make([]capability.Tombstone, 10_000)
	for i := range batch {
		batch[i] = tomb(uint64(i+1), fmt.Sprintf("g_revoked_%d", i), t0)
	}
	if err := set.Add(batch...); err != nil {
		b.Fatal(err)
	}
	chain := make([]string, 8)
	for i := range chain {
		chain[i] = fmt.Sprintf("g_chain_%d", i)
	}
	return set, chain
}

// BenchmarkTombstoneSetRevoked is the common case on the hot path: nothing
// in the chain is revoked, so every level is looked up.
func BenchmarkTombstoneSetRevoked(b *testing.B) {
	set, chain := tombstoneBench(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := set.Revoked("g_leaf", chain); ok {
			b.Fatal("unexpectedly revoked")
		}
	}
}

// BenchmarkTombstoneSetRevokedParallel shows reads do not contend: the
// per-op time should stay flat as GOMAXPROCS grows.
func BenchmarkTombstoneSetRevokedParallel(b *testing.B) {
	set, chain := tombstoneBench(b)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, ok := set.Revoked("g_leaf", chain); ok {
				b.Fatal("unexpectedly revoked")
			}
		}
	})
}

// BenchmarkTombstoneSetAdd is one feed batch of one tombstone into a set of
// 10,000: the copy-on-write cost writers pay so readers need no lock.
func BenchmarkTombstoneSetAdd(b *testing.B) {
	set, _ := tombstoneBench(b)
	seq := uint64(10_000)
	b.ReportAllocs()
	for b.Loop() {
		seq++
		if err := set.Add(tomb(seq, "g_new", t0)); err != nil {
			b.Fatal(err)
		}
	}
}
