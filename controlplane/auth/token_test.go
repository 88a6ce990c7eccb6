package auth

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/tetherhq/tether/capability"
)

// Credentials are minted without golang-jwt's reflection (appendClaims and
// capability.SignEncodedJWT); they must be the very tokens golang-jwt
// would sign — Ed25519 is deterministic, so the comparison is
// byte for byte — for plain and hostile strings alike, and parse back to
// the principal they were minted for.
func TestMintedClaimsMatchGolangJWT(t *testing.T) {
	now := time.Date(2026, 12, 1, 17, 4, 5, 987654321, time.UTC)
	for _, kid := range []string{"k_1", `odd"kid<&>é`} {
		key, err := capability.NewSigningKey(bytes.NewReader(bytes.Repeat([]byte{7}, 32)), now, now)
		if err != nil {
			t.Fatal(err)
		}
		key.ID = kid
		ring := capability.KeyRing{Keys: []capability.SigningKey{key}}
		for _, tc := range []struct{ issuer, audience, subject, role string }{
			{"tether", AudienceAgent, "n_0123456789abcdef", ""},
			{"tether", AudienceOperator, "alice", "admin"},
			{"tether", AudienceToolServer, "gate-1", ""},
			{`iss "quoted" \ back`, AudienceOperator, "bob\n\t<script>&", "viewer"},
			{"tether", AudienceOperator, "ünïcødé \u2028 \x01", "admin"},
			{"tether", AudienceOperator, "bad utf8 \xff\xfe", "admin"},
		} {
			exp := now.Add(90 * time.Minute).Truncate(time.Second)
			got := appendClaims(nil, tc.issuer, tc.subject, tc.audience, tc.role, "tok_1", exp, now)
			c := claims{RegisteredClaims: jwt.RegisteredClaims{
				Issuer: tc.issuer, Subject: tc.subject, Audience: jwt.ClaimStrings{tc.audience},
				ExpiresAt: jwt.NewNumericDate(exp), NotBefore: jwt.NewNumericDate(now.Add(-time.Second)),
				IssuedAt: jwt.NewNumericDate(now), ID: "tok_1",
			}, Role: tc.role}
			want, err := json.Marshal(c)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("claims of %q:\n got %s\nwant %s", tc.subject, got, want)
			}
			tok := jwt.NewWithClaims(jwt.SigningMethodEdDSA, c)
			tok.Header["kid"] = kid
			wantToken, err := tok.SignedString(key.Private)
			if err != nil {
				t.Fatal(err)
			}
			gotToken, err := capability.SignEncodedJWT(key, got)
			if err != nil {
				t.Fatal(err)
			}
			if gotToken != wantToken {
				t.Errorf("token of %q (kid %q):\n got %s\nwant %s", tc.subject, kid, gotToken, wantToken)
			}
			if tc.issuer != "tether" {
				continue
			}
			iss := Issuer{Name: "tether", Ring: func() capability.KeyRing { return ring }}
			p, err := iss.Parse(gotToken, now)
			// encoding/json writes each invalid UTF-8 byte as U+FFFD, as
			// golang-jwt did.
			if want := strings.ReplaceAll(tc.subject, "\xff\xfe", "\ufffd\ufffd"); err != nil || p.Subject != want {
				t.Errorf("minted token of %q parses as %+v, %v", tc.subject, p, err)
			}
		}
	}
}

// BenchmarkMintAgent: the cost of the credential a spawn mints.
func BenchmarkMintAgent(b *testing.B) {
	now := time.Date(2026, 12, 1, 17, 4, 5, 0, time.UTC)
	key, err := capability.NewSigningKey(nil, now, now)
	if err != nil {
		b.Fatal(err)
	}
	iss := Issuer{Name: "tether", Ring: func() capability.KeyRing { return capability.KeyRing{Keys: []capability.SigningKey{key}} }}
	for b.Loop() {
		if _, _, err := iss.MintAgent("n_0123456789abcdef", now, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
}
