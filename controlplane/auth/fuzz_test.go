package auth

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/tetherhq/tether/capability"
)

var fuzzT0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// fuzzFixture is deterministic — one fixed Ed25519 key, fixed claims, and
// Ed25519 signatures are deterministic — so its tokens are byte-identical
// on every run and the corpus under testdata/fuzz/FuzzParse holds tokens
// that are valid at fuzzNow.
type fuzzFixture struct {
	issuer Issuer
	// valid: the fixture's tokens that Parse must accept at fuzzNow, with
	// the principal each names.
	valid map[string]Principal
	// other: well-signed tokens Parse must refuse (expired, wrong issuer,
	// wrong audience, unknown role).
	other []string
}

var fuzzNow = fuzzT0.Add(time.Minute)

func newFuzzFixture(t testing.TB) fuzzFixture {
	t.Helper()
	key, err := capability.NewSigningKey(bytes.NewReader(bytes.Repeat([]byte{9}, 32)), fuzzT0, fuzzT0)
	if err != nil {
		t.Fatal(err)
	}
	ring := capability.KeyRing{Keys: []capability.SigningKey{key}}
	fx := fuzzFixture{issuer: Issuer{Name: "tether", Ring: func() capability.KeyRing { return ring }}, valid: map[string]Principal{}}
	sign := func(iss, aud, sub, role, id string, exp time.Time) string {
		c := claims{RegisteredClaims: jwt.RegisteredClaims{
			Issuer: iss, Subject: sub, Audience: jwt.ClaimStrings{aud}, ID: id,
			ExpiresAt: jwt.NewNumericDate(exp), NotBefore: jwt.NewNumericDate(fuzzT0.Add(-time.Second)), IssuedAt: jwt.NewNumericDate(fuzzT0),
		}, Role: role}
		tok := jwt.NewWithClaims(jwt.SigningMethodEdDSA, c)
		tok.Header["kid"] = key.ID
		s, err := tok.SignedString(key.Private)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	hour := fuzzT0.Add(time.Hour)
	fx.valid[sign("tether", AudienceOperator, "admin", "admin", "tok-admin", hour)] = Principal{Kind: KindOperator, Subject: "admin", Role: RoleAdmin, TokenID: "tok-admin", ExpiresAt: hour}
	fx.valid[sign("tether", AudienceOperator, "ops", "viewer", "tok-viewer", hour)] = Principal{Kind: KindOperator, Subject: "ops", Role: RoleViewer, TokenID: "tok-viewer", ExpiresAt: hour}
	fx.valid[sign("tether", AudienceAgent, "n_00000000000000000001", "", "tok-agent", hour)] = Principal{Kind: KindAgent, Subject: "n_00000000000000000001", TokenID: "tok-agent", ExpiresAt: hour}
	fx.other = []string{
		sign("tether", AudienceOperator, "admin", "admin", "tok-expired", fuzzT0.Add(30*time.Second)),
		sign("elsewhere", AudienceOperator, "admin", "admin", "tok-issuer", hour),
		sign("tether", "tether-capability", "n_00000000000000000001", "", "tok-audience", hour),
		sign("tether", AudienceOperator, "admin", "root", "tok-role", hour),
	}
	return fx
}

// FuzzParse: no input panics; every refusal wraps ErrBadCredential or
// ErrNoCredential and never quotes the token; and nothing is accepted but
// the fixture's own valid tokens, byte for byte, each as the principal it
// names — a mutated, re-encoded, re-signed or algorithm-swapped token never
// authenticates anyone.
func FuzzParse(f *testing.F) {
	fx := newFuzzFixture(f)
	for token := range fx.valid {
		f.Add(token)
		parts := strings.Split(token, ".")
		f.Add(parts[0] + "." + parts[1] + ".")
		f.Add(`eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.` + parts[1] + ".")
		f.Add(`eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.` + parts[1] + "." + parts[2])
	}
	for _, token := range fx.other {
		f.Add(token)
	}
	f.Add("")
	f.Add("..")
	f.Add(strings.Repeat("a", MaxTokenBytes+1))
	f.Fuzz(func(t *testing.T, token string) {
		p, err := fx.issuer.Parse(token, fuzzNow)
		if err == nil {
			want, ok := fx.valid[token]
			if !ok {
				t.Fatalf("accepted a token the fixture never signed: %q as %+v", token, p)
			}
			if !samePrincipal(p, want) {
				t.Fatalf("token parsed as %+v, want %+v", p, want)
			}
			return
		}
		if !errors.Is(err, ErrBadCredential) && !errors.Is(err, ErrNoCredential) {
			t.Fatalf("refusal %v wraps neither ErrBadCredential nor ErrNoCredential", err)
		}
		if len(token) >= 16 && strings.Contains(err.Error(), token) {
			t.Fatalf("the error quotes the token: %v", err)
		}
		if _, ok := fx.valid[token]; ok {
			t.Fatalf("refused a valid fixture token: %v", err)
		}
	})
}

func samePrincipal(a, b Principal) bool {
	return a.Kind == b.Kind && a.Subject == b.Subject && a.Role == b.Role && a.TokenID == b.TokenID && a.ExpiresAt.Equal(b.ExpiresAt)
}

// TestParseRefusesForgeries spells out the forgeries FuzzParse starts
// from, so each is checked on every run, not only when fuzzing.
func TestParseRefusesForgeries(t *testing.T) {
	fx := newFuzzFixture(t)
	var admin string
	for token, p := range fx.valid {
		if p.Role == RoleAdmin {
			admin = token
		}
		if got, err := fx.issuer.Parse(token, fuzzNow); err != nil || !samePrincipal(got, p) {
			t.Fatalf("valid token: %+v, %v", got, err)
		}
	}
	parts := strings.Split(admin, ".")
	payload, _ := base64.RawURLEncoding.DecodeString(parts[1])
	escalated := base64.RawURLEncoding.EncodeToString(bytes.Replace(payload, []byte(`"sub":"admin"`), []byte(`"sub":"root!"`), 1))
	hs256 := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"iss": "tether", "sub": "admin", "aud": AudienceOperator, "role": "admin", "exp": fuzzNow.Add(time.Hour).Unix()})
	pub := fx.issuer.Ring().Keys[0].Public
	hs, err := hs256.SignedString([]byte(ed25519.PublicKey(pub)))
	if err != nil {
		t.Fatal(err)
	}
	for name, token := range map[string]string{
		"alg none":                              `eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.` + parts[1] + ".",
		"HS256 keyed with the public key":       hs,
		"a payload changed under the signature": parts[0] + "." + escalated + "." + parts[2],
		"no signature":                          parts[0] + "." + parts[1] + ".",
		"a non-canonical base64 signature":      parts[0] + "." + parts[1] + "." + parts[2][:len(parts[2])-1] + flipLastBits(parts[2]),
		"expired":                               fx.other[0],
		"another issuer":                        fx.other[1],
		"a capability token's audience":         fx.other[2],
		"an unknown role":                       fx.other[3],
		"oversized":                             strings.Repeat("a", MaxTokenBytes+1),
	} {
		if p, err := fx.issuer.Parse(token, fuzzNow); err == nil || !errors.Is(err, ErrBadCredential) {
			t.Errorf("%s: accepted as %+v (%v), want ErrBadCredential", name, p, err)
		}
	}
}

// flipLastBits changes the unused low bits of a base64url string's last
// character: the same bytes, a different string.
func flipLastBits(s string) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	i := strings.IndexByte(alphabet, s[len(s)-1])
	return string(alphabet[i^1])
}

// TestFuzzParseCorpusStaysValid keeps the committed corpus meaningful: its
// valid_* entries are tokens the fixture accepts, so the fuzzer mutates
// real tokens rather than stale ones.
func TestFuzzParseCorpusStaysValid(t *testing.T) {
	fx := newFuzzFixture(t)
	paths, err := filepath.Glob(filepath.Join("testdata", "fuzz", "FuzzParse", "valid_*"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no valid seeds in the corpus: %v", err)
	}
	for _, path := range paths {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		if len(lines) != 2 || lines[0] != "go test fuzz v1" {
			t.Fatalf("%s: not a fuzz corpus file", path)
		}
		token, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(lines[1], "string("), ")"))
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if _, ok := fx.valid[token]; !ok {
			t.Fatalf("%s is no longer a token the fixture signs; regenerate the corpus", path)
		}
	}
}
