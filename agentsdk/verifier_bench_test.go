package agentsdk

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// benchVerifier is a synced Verifier on the wall clock and a token it
// accepts, with the public key that signed it.
func benchVerifier(b *testing.B, cacheSize int) (*Verifier, string, ed25519.PublicKey) {
	b.Helper()
	ring := newRing(b)
	keys := newKeyServer(b, ring)
	v, err := NewVerifier(VerifierConfig{Conn: Dial(keys.url, "", WithHTTPClient(keys.client)), CacheSize: cacheSize})
	if err != nil {
		b.Fatal(err)
	}
	if err := v.jwks.refresh(context.Background()); err != nil {
		b.Fatal(err)
	}
	if err := v.apply(&tetherv1.WatchRevocationsResponse{}); err != nil {
		b.Fatal(err)
	}
	_, child := grantLine(b, "g_root", "g_child")
	child.ExpiresAt = time.Now().Add(time.Hour) // grantLine issues at t0
	return v, mint(b, ring, child, time.Now().UTC()), ring.Keys[0].Public
}

// BenchmarkVerifierCold verifies with the cache off: every call checks
// the signature and the claims. Compare with BenchmarkRawEd25519.
func BenchmarkVerifierCold(b *testing.B) {
	v, token, _ := benchVerifier(b, -1)
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := v.Verify(ctx, token); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkVerifierCached verifies a token already in the cache: the
// freshness and tombstone checks alone.
func BenchmarkVerifierCached(b *testing.B) {
	v, token, _ := benchVerifier(b, 0)
	ctx := context.Background()
	if _, err := v.Verify(ctx, token); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := v.Verify(ctx, token); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkRawEd25519 is the signature check alone on the same token: the
// floor under BenchmarkVerifierCold.
func BenchmarkRawEd25519(b *testing.B) {
	_, token, pub := benchVerifier(b, -1)
	dot := strings.LastIndexByte(token, '.')
	input := []byte(token[:dot])
	sig, err := base64.RawURLEncoding.DecodeString(token[dot+1:])
	if err != nil {
		b.Fatal(err)
	}
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if !ed25519.Verify(pub, input, sig) {
				b.Fatal("signature does not verify")
			}
		}
	})
}
