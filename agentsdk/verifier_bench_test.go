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

func benchVerifier(b *testing.B, cacheSize int) (*Verifier, string, ed25519.PublicKey) {
	t := &testing.T{}
	ring := newRing(t)
	keys := newKeyServer(t, ring)
	v, err := NewVerifier(VerifierConfig{Conn: Dial(keys.url, "", keys.client), CacheSize: cacheSize})
	if err != nil {
		b.Fatal(err)
	}
	if err := v.jwks.refresh(context.Background()); err != nil {
		b.Fatal(err)
	}
	if err := v.apply(&tetherv1.WatchRevocationsResponse{}); err != nil {
		b.Fatal(err)
	}
	_, child := grantLine(t, "g_root", "g_child")
	child.ExpiresAt = time.Now().Add(time.Hour) // grantLine issues at t0
	return v, mint(t, ring, child, time.Now().UTC()), ring.Keys[0].Public
}

func BenchmarkVerifierCold(b *testing.B) {
	v, token, _ := benchVerifier(b, -1)
	ctx := context.Background()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := v.Verify(ctx, token); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkRawEd25519(b *testing.B) {
	_, token, pub := benchVerifier(b, -1)
	dot := strings.LastIndexByte(token, '.')
	input := []byte(token[:dot])
	sig, _ := base64.RawURLEncoding.DecodeString(token[dot+1:])
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if !ed25519.Verify(pub, input, sig) {
				b.Fatal("bad")
			}
		}
	})
}
