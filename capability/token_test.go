package capability_test

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/tetherhq/tether/capability"
)

const (
	testIssuer   = "tether"
	testAudience = "tether-tools"
)

func newRing(t tb, now time.Time) capability.KeyRing {
	t.Helper()
	key, err := capability.NewSigningKey(nil, now, now)
	if err != nil {
		t.Fatal(err)
	}
	return capability.KeyRing{Keys: []capability.SigningKey{key}}
}

func newMinter(t tb) capability.Minter {
	t.Helper()
	m, err := capability.NewMinter(testIssuer, testAudience)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func newVerifier(t tb) capability.Verifier {
	t.Helper()
	v, err := capability.NewVerifier(testIssuer, testAudience, capability.DefaultLeeway)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func signer(t tb, ring capability.KeyRing, now time.Time) capability.SigningKey {
	t.Helper()
	k, err := ring.Signer(now)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func b64(data []byte) string { return base64.RawURLEncoding.EncodeToString(data) }

func b64JSON(t tb, v any) string {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b64(data)
}

// signRaw builds a compact JWS by hand, so tests can sign what the package
// would never produce.
func signRaw(t tb, key ed25519.PrivateKey, header, claims any) string {
	t.Helper()
	input := b64JSON(t, header) + "." + b64JSON(t, claims)
	return input + "." + b64(ed25519.Sign(key, []byte(input)))
}

// goodClaims is the payload Mint would produce for grant g_leaf at t0.
func goodClaims() map[string]any {
	return map[string]any{
		"iss":    testIssuer,
		"aud":    []string{testAudience},
		"sub":    "n_leaf",
		"jti":    "g_leaf",
		"chain":  []string{"g_root", "g_mid"},
		"scopes": []string{"tool:shell"},
		"iat":    t0.Unix(),
		"nbf":    t0.Unix(),
		"exp":    t0.Add(5 * time.Minute).Unix(),
	}
}

func edHeader(kid string) map[string]any {
	return map[string]any{"alg": "EdDSA", "typ": "JWT", "kid": kid}
}

func TestMintVerifyRoundTrip(t *testing.T) {
	tr := newGrantTree(t)
	ring := newRing(t, t0)
	now := t0.Add(90*time.Second + 700*time.Millisecond)

	token, exp, err := newMinter(t).Mint(ring, tr.a1x, now, 0)
	if err != nil {
		t.Fatal(err)
	}
	wantExp := now.Add(capability.DefaultTokenTTL).Truncate(time.Second)
	if !exp.Equal(wantExp) {
		t.Fatalf("exp = %v, want %v (default TTL, whole seconds)", exp, wantExp)
	}
	claims, err := newVerifier(t).Verify(token, ring, now)
	if err != nil {
		t.Fatal(err)
	}
	want := capability.Claims{
		GrantID:      "g_a1x",
		HolderNodeID: "n_a1x",
		Chain:        []string{"g_root", "g_a", "g_a1"},
		Scopes:       []string{"tool:shell"},
		IssuedAt:     now.Truncate(time.Second),
		NotBefore:    now.Truncate(time.Second),
		ExpiresAt:    wantExp,
		KeyID:        signer(t, ring, now).ID,
	}
	if !claimsEqual(claims, want) {
		t.Fatalf("claims =\n%+v\nwant\n%+v", claims, want)
	}

	// The same token verifies against the published JWKS alone.
	jwks, err := ring.JWKS()
	if err != nil {
		t.Fatal(err)
	}
	public, err := capability.ParseJWKS(jwks)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newVerifier(t).Verify(token, public, now); err != nil {
		t.Fatalf("verify against JWKS: %v", err)
	}
	if strings.Contains(string(jwks), b64(ring.Keys[0].Private)) {
		t.Fatal("JWKS leaks the private key")
	}
}

func claimsEqual(a, b capability.Claims) bool {
	return a.GrantID == b.GrantID && a.HolderNodeID == b.HolderNodeID && a.KeyID == b.KeyID && a.Root == b.Root &&
		slices.Equal(a.Chain, b.Chain) && slices.Equal(a.Scopes, b.Scopes) &&
		a.IssuedAt.Equal(b.IssuedAt) && a.NotBefore.Equal(b.NotBefore) && a.ExpiresAt.Equal(b.ExpiresAt)
}

func TestMintRootTokenHasEmptyChain(t *testing.T) {
	tr := newGrantTree(t)
	ring := newRing(t, t0)
	token, _, err := newMinter(t).Mint(ring, tr.root, t0, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	claims, err := newVerifier(t).Verify(token, ring, t0)
	if err != nil {
		t.Fatal(err)
	}
	if len(claims.Chain) != 0 || claims.GrantID != "g_root" {
		t.Fatalf("root claims = %+v", claims)
	}
}

func TestMintNeverOutlivesTheGrant(t *testing.T) {
	tr := newGrantTree(t)
	ring := newRing(t, t0)
	now := tr.a1x.ExpiresAt.Add(-2 * time.Minute)
	_, exp, err := newMinter(t).Mint(ring, tr.a1x, now, capability.MaxTokenTTL)
	if err != nil {
		t.Fatal(err)
	}
	if !exp.Equal(tr.a1x.ExpiresAt) {
		t.Fatalf("exp = %v, want the grant's expiry %v", exp, tr.a1x.ExpiresAt)
	}
}

func TestMintRefuses(t *testing.T) {
	tr := newGrantTree(t)
	ring := newRing(t, t0)
	m := newMinter(t)
	revoked, err := capability.Revoke(tr.a1, "operator:alice", nil, "", t0)
	if err != nil {
		t.Fatal(err)
	}
	huge := tr.root
	huge.Scopes = nil
	for i := range capability.MaxScopes {
		huge.Scopes = append(huge.Scopes, fmt.Sprintf("s3:read:%03d%s", i, strings.Repeat("x", capability.MaxScopeBytes-11)))
	}
	for i := range capability.MaxChainDepth {
		huge.Chain = append(huge.Chain, fmt.Sprintf("g_%03d%s", i, strings.Repeat("x", capability.MaxIDBytes-5)))
	}
	subSecond := tr.a1x
	subSecond.ExpiresAt = t0.Add(1500 * time.Millisecond)
	badChain := tr.a1
	badChain.Chain = []string{"g_root", "g_root"}

	tests := []struct {
		name  string
		m     capability.Minter
		ring  capability.KeyRing
		grant capability.Grant
		now   time.Time
		ttl   time.Duration
		want  error
	}{
		{"revoked grant", m, ring, revoked, t0, 0, capability.ErrGrantRevoked},
		{"expired grant", m, ring, tr.a1, tr.a1.ExpiresAt, 0, capability.ErrGrantExpired},
		{"grant ends within the second", m, ring, subSecond, t0.Add(1100 * time.Millisecond), 0, capability.ErrGrantExpired},
		{"ttl above the ceiling", m, ring, tr.a1, t0, capability.MaxTokenTTL + time.Second, capability.ErrInvalidTTL},
		{"negative ttl", m, ring, tr.a1, t0, -time.Second, capability.ErrInvalidTTL},
		{"zero minter", capability.Minter{}, ring, tr.a1, t0, 0, capability.ErrInvalidConfig},
		{"no signing key", m, capability.KeyRing{}, tr.a1, t0, 0, capability.ErrUnknownKey},
		{"malformed chain", m, ring, badChain, t0, 0, capability.ErrInvalidGrant},
		{"token over the size limit", m, ring, huge, t0, 0, capability.ErrTokenTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			token, exp, err := tt.m.Mint(tt.ring, tt.grant, tt.now, tt.ttl)
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			if token != "" || !exp.IsZero() {
				t.Fatal("a refused mint returned a token")
			}
		})
	}
}

// TestVerifyRefuses is the catalogue of hostile and broken tokens. Each must
// be refused with its own sentinel, and no error may quote the token.
func TestVerifyRefuses(t *testing.T) {
	ring := newRing(t, t0)
	key := signer(t, ring, t0)
	other, err := capability.NewSigningKey(nil, t0, t0)
	if err != nil {
		t.Fatal(err)
	}
	now := t0.Add(time.Minute)

	valid := signRaw(t, key.Private, edHeader(key.ID), goodClaims())
	if _, err := newVerifier(t).Verify(valid, ring, now); err != nil {
		t.Fatalf("the hand-built baseline token must verify: %v", err)
	}
	parts := strings.Split(valid, ".")

	with := func(change func(map[string]any)) string {
		c := goodClaims()
		change(c)
		return signRaw(t, key.Private, edHeader(key.ID), c)
	}
	withHeader := func(header map[string]any) string {
		return signRaw(t, key.Private, header, goodClaims())
	}
	hs256 := func() string {
		// Algorithm confusion: an HMAC keyed with the public key's bytes.
		input := b64JSON(t, map[string]any{"alg": "HS256", "typ": "JWT", "kid": key.ID}) + "." + parts[1]
		mac := hmac.New(sha256.New, key.Public)
		mac.Write([]byte(input))
		return input + "." + b64(mac.Sum(nil))
	}
	tamperedChain := func() string {
		c := goodClaims()
		c["chain"] = []string{} // drop the ancestors, so a revoked ancestor would not match
		return parts[0] + "." + b64JSON(t, c) + "." + parts[2]
	}
	flipSignature := func() string {
		sig, _ := base64.RawURLEncoding.DecodeString(parts[2])
		sig[10] ^= 0x01
		return parts[0] + "." + parts[1] + "." + b64(sig)
	}
	signedByOtherUnderOurKid := signRaw(t, other.Private, edHeader(key.ID), goodClaims())
	signedByUnknownKid := signRaw(t, other.Private, edHeader(other.ID), goodClaims())

	tests := []struct {
		name  string
		token string
		at    time.Time
		want  error
	}{
		{"empty", "", now, capability.ErrTokenMalformed},
		{"one segment", "abc", now, capability.ErrTokenMalformed},
		{"four segments", valid + ".x", now, capability.ErrTokenMalformed},
		{"not base64url", parts[0] + "." + parts[1] + "+/" + "." + parts[2], now, capability.ErrTokenMalformed},
		{"padding", valid + "==", now, capability.ErrTokenMalformed},
		{"newline inside", valid[:20] + "\n" + valid[20:], now, capability.ErrTokenMalformed},
		{"header not JSON", b64([]byte("{not json")) + "." + parts[1] + "." + parts[2], now, capability.ErrTokenMalformed},
		{"claims not JSON", parts[0] + "." + b64([]byte("[1,2")) + "." + parts[2], now, capability.ErrTokenMalformed},
		{"claim of the wrong type", with(func(c map[string]any) { c["chain"] = "g_root" }), now, capability.ErrTokenMalformed},
		{"oversized", strings.Repeat("a", capability.MaxTokenBytes+1), now, capability.ErrTokenTooLarge},
		{"alg none", b64JSON(t, map[string]any{"alg": "none", "typ": "JWT", "kid": key.ID}) + "." + parts[1] + ".", now, capability.ErrTokenAlgorithm},
		{"alg missing", withHeader(map[string]any{"typ": "JWT", "kid": key.ID}), now, capability.ErrTokenAlgorithm},
		{"alg unknown", withHeader(map[string]any{"alg": "Ed448", "kid": key.ID}), now, capability.ErrTokenAlgorithm},
		{"HS256 keyed with the public key", hs256(), now, capability.ErrTokenAlgorithm},
		{"unknown kid", signedByUnknownKid, now, capability.ErrUnknownKey},
		{"kid missing", withHeader(map[string]any{"alg": "EdDSA"}), now, capability.ErrTokenMalformed},
		{"kid not a string", withHeader(map[string]any{"alg": "EdDSA", "kid": 7}), now, capability.ErrTokenMalformed},
		{"crit header", withHeader(map[string]any{"alg": "EdDSA", "kid": key.ID, "crit": []string{"exp"}}), now, capability.ErrTokenMalformed},
		{"tampered chain claim", tamperedChain(), now, capability.ErrTokenSignature},
		{"flipped signature bit", flipSignature(), now, capability.ErrTokenSignature},
		{"signed by another key under our kid", signedByOtherUnderOurKid, now, capability.ErrTokenSignature},
		{"other issuer", with(func(c map[string]any) { c["iss"] = "mallory" }), now, capability.ErrTokenIssuer},
		{"issuer missing", with(func(c map[string]any) { delete(c, "iss") }), now, capability.ErrTokenIssuer},
		{"wrong audience", with(func(c map[string]any) { c["aud"] = []string{"tether-control"} }), now, capability.ErrTokenAudience},
		{"audience missing", with(func(c map[string]any) { delete(c, "aud") }), now, capability.ErrTokenAudience},
		{"other issuer wins over expiry", with(func(c map[string]any) { c["iss"] = "mallory" }), t0.Add(time.Hour), capability.ErrTokenIssuer},
		{"other issuer wins over missing exp", with(func(c map[string]any) { c["iss"] = "mallory"; delete(c, "exp") }), now, capability.ErrTokenIssuer},
		{"wrong audience wins over expiry", with(func(c map[string]any) { c["aud"] = "tether-control" }), t0.Add(time.Hour), capability.ErrTokenAudience},
		{"expired beyond leeway", valid, t0.Add(5*time.Minute + capability.DefaultLeeway), capability.ErrTokenExpired},
		{"nbf in the future", valid, t0.Add(-capability.DefaultLeeway - time.Second), capability.ErrTokenNotYetValid},
		{"iat in the future", with(func(c map[string]any) { c["iat"] = t0.Add(2 * time.Minute).Unix() }), now, capability.ErrTokenNotYetValid},
		{"exp missing", with(func(c map[string]any) { delete(c, "exp") }), now, capability.ErrTokenClaims},
		{"iat missing", with(func(c map[string]any) { delete(c, "iat") }), now, capability.ErrTokenClaims},
		{"nbf missing", with(func(c map[string]any) { delete(c, "nbf") }), now, capability.ErrTokenClaims},
		{"jti missing", with(func(c map[string]any) { delete(c, "jti") }), now, capability.ErrTokenClaims},
		{"sub missing", with(func(c map[string]any) { delete(c, "sub") }), now, capability.ErrTokenClaims},
		{"chain contains jti", with(func(c map[string]any) { c["chain"] = []string{"g_root", "g_leaf"} }), now, capability.ErrTokenClaims},
		{"chain repeats", with(func(c map[string]any) { c["chain"] = []string{"g_root", "g_root"} }), now, capability.ErrTokenClaims},
		{"chain entry empty", with(func(c map[string]any) { c["chain"] = []string{""} }), now, capability.ErrTokenClaims},
		{"chain too deep", with(func(c map[string]any) {
			var chain []string
			for i := range capability.MaxChainDepth + 1 {
				chain = append(chain, fmt.Sprintf("g_%d", i))
			}
			c["chain"] = chain
		}), now, capability.ErrTokenClaims},
		{"no scopes", with(func(c map[string]any) { delete(c, "scopes") }), now, capability.ErrTokenClaims},
		{"invalid scope", with(func(c map[string]any) { c["scopes"] = []string{"tool:*:x"} }), now, capability.ErrTokenClaims},
		{"lifetime over the ceiling", with(func(c map[string]any) {
			c["exp"] = t0.Add(capability.MaxTokenTTL + time.Second).Unix()
		}), now, capability.ErrTokenClaims},
		{"exp before iat", with(func(c map[string]any) {
			c["iat"], c["nbf"], c["exp"] = now.Unix(), now.Unix(), now.Add(-time.Second).Unix()
		}), now.Add(-capability.DefaultLeeway), capability.ErrTokenClaims},
	}
	v := newVerifier(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			claims, err := v.Verify(tt.token, ring, tt.at)
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			if !reflect.DeepEqual(claims, capability.Claims{}) {
				t.Fatalf("refused token returned claims %+v", claims)
			}
			assertExactlyOneSentinel(t, err)
			assertNoTokenText(t, err, tt.token)
		})
	}
}

var tokenSentinels = []error{
	capability.ErrTokenTooLarge, capability.ErrTokenMalformed, capability.ErrTokenAlgorithm,
	capability.ErrUnknownKey, capability.ErrTokenSignature, capability.ErrTokenIssuer,
	capability.ErrTokenAudience, capability.ErrTokenClaims, capability.ErrTokenExpired,
	capability.ErrTokenNotYetValid, capability.ErrInvalidConfig,
}

func assertExactlyOneSentinel(t tb, err error) {
	t.Helper()
	n := 0
	for _, s := range tokenSentinels {
		if errors.Is(err, s) {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("error %q wraps %d token sentinels, want exactly 1", err, n)
	}
}

func assertNoTokenText(t tb, err error, token string) {
	t.Helper()
	msg := err.Error()
	for _, segment := range strings.Split(token, ".") {
		if len(segment) >= 12 && strings.Contains(msg, segment[:12]) {
			t.Fatalf("error %q quotes the token", msg)
		}
	}
}

func TestVerifyLeewayBoundaries(t *testing.T) {
	ring := newRing(t, t0)
	key := signer(t, ring, t0)
	token := signRaw(t, key.Private, edHeader(key.ID), goodClaims())
	v := newVerifier(t)
	exp := t0.Add(5 * time.Minute)
	for _, tt := range []struct {
		at   time.Time
		want error
	}{
		{t0.Add(-capability.DefaultLeeway), nil},
		{t0.Add(-capability.DefaultLeeway - time.Nanosecond), capability.ErrTokenNotYetValid},
		{exp, nil},
		{exp.Add(capability.DefaultLeeway - time.Nanosecond), nil},
		{exp.Add(capability.DefaultLeeway), capability.ErrTokenExpired},
	} {
		if _, err := v.Verify(token, ring, tt.at); !errors.Is(err, tt.want) {
			t.Errorf("at %v: err = %v, want %v", tt.at.Sub(t0), err, tt.want)
		}
	}
}

func TestVerifierConfiguration(t *testing.T) {
	for _, tt := range []struct {
		issuer, audience string
		leeway           time.Duration
	}{
		{"", testAudience, 0},
		{testIssuer, "", 0},
		{testIssuer, testAudience, -time.Second},
		{testIssuer, testAudience, capability.MaxLeeway + time.Nanosecond},
	} {
		if _, err := capability.NewVerifier(tt.issuer, tt.audience, tt.leeway); !errors.Is(err, capability.ErrInvalidConfig) {
			t.Errorf("NewVerifier(%q, %q, %v) err = %v, want ErrInvalidConfig", tt.issuer, tt.audience, tt.leeway, err)
		}
	}
	if _, err := capability.NewMinter("", testAudience); !errors.Is(err, capability.ErrInvalidConfig) {
		t.Errorf("NewMinter without issuer: %v", err)
	}
	ring := newRing(t, t0)
	key := signer(t, ring, t0)
	token := signRaw(t, key.Private, edHeader(key.ID), goodClaims())
	// The zero Verifier would otherwise skip the issuer check.
	if _, err := (capability.Verifier{}).Verify(token, ring, t0); !errors.Is(err, capability.ErrInvalidConfig) {
		t.Fatalf("zero verifier: err = %v, want ErrInvalidConfig", err)
	}
	if _, err := newVerifier(t).Verify(token, nil, t0); !errors.Is(err, capability.ErrInvalidConfig) {
		t.Fatalf("nil key lookup: err = %v, want ErrInvalidConfig", err)
	}
	v, err := capability.NewVerifier(testIssuer, testAudience, 0)
	if err != nil || v.Leeway() != 0 {
		t.Fatalf("zero leeway verifier = %v, %v", v.Leeway(), err)
	}
	if _, err := v.Verify(token, ring, t0.Add(5*time.Minute)); !errors.Is(err, capability.ErrTokenExpired) {
		t.Fatalf("without leeway the token is expired at exp: %v", err)
	}
}

// lookupFunc adapts a function to KeyLookup.
type lookupFunc func(kid string) (ed25519.PublicKey, error)

func (f lookupFunc) Public(kid string) (ed25519.PublicKey, error) { return f(kid) }

func TestVerifyPassesKeyLookupFailuresThrough(t *testing.T) {
	ring := newRing(t, t0)
	key := signer(t, ring, t0)
	token := signRaw(t, key.Private, edHeader(key.ID), goodClaims())
	stale := errors.New("jwks cache stale")
	_, err := newVerifier(t).Verify(token, lookupFunc(func(string) (ed25519.PublicKey, error) { return nil, stale }), t0)
	if !errors.Is(err, stale) || errors.Is(err, capability.ErrUnknownKey) {
		t.Fatalf("err = %v, want the lookup's own error", err)
	}
	_, err = newVerifier(t).Verify(token, lookupFunc(func(string) (ed25519.PublicKey, error) { return make([]byte, 7), nil }), t0)
	if !errors.Is(err, capability.ErrUnknownKey) {
		t.Fatalf("short public key: err = %v, want ErrUnknownKey", err)
	}
}

// operatorClaims is how the control plane would shape an operator token.
type operatorClaims struct {
	jwt.RegisteredClaims
	Roles []string `json:"roles"`
}

func TestSignAndParseJWTForOtherAudiences(t *testing.T) {
	ring := newRing(t, t0)
	operatorToken, err := capability.SignJWT(ring, operatorClaims{
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer: testIssuer, Subject: "alice", Audience: jwt.ClaimStrings{"tether-control"},
			IssuedAt: jwt.NewNumericDate(t0), ExpiresAt: jwt.NewNumericDate(t0.Add(8 * time.Hour)),
		},
		Roles: []string{capability.RoleSecurity},
	}, t0)
	if err != nil {
		t.Fatal(err)
	}
	control, err := capability.NewVerifier(testIssuer, "tether-control", capability.DefaultLeeway)
	if err != nil {
		t.Fatal(err)
	}
	var got operatorClaims
	if err := control.ParseJWT(operatorToken, ring, t0.Add(time.Hour), &got); err != nil {
		t.Fatal(err)
	}
	if got.Subject != "alice" || !slices.Equal(got.Roles, []string{capability.RoleSecurity}) {
		t.Fatalf("operator claims = %+v", got)
	}

	// Audiences keep token kinds apart in both directions.
	if _, err := newVerifier(t).Verify(operatorToken, ring, t0.Add(time.Hour)); !errors.Is(err, capability.ErrTokenAudience) {
		t.Fatalf("operator token as a capability token: err = %v, want ErrTokenAudience", err)
	}
	tr := newGrantTree(t)
	capToken, _, err := newMinter(t).Mint(ring, tr.a1, t0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := control.ParseJWT(capToken, ring, t0, &operatorClaims{}); !errors.Is(err, capability.ErrTokenAudience) {
		t.Fatalf("capability token as an operator token: err = %v, want ErrTokenAudience", err)
	}

	// The same pinned options apply: an expired operator token is refused.
	if err := control.ParseJWT(operatorToken, ring, t0.Add(9*time.Hour), &operatorClaims{}); !errors.Is(err, capability.ErrTokenExpired) {
		t.Fatalf("expired operator token: err = %v, want ErrTokenExpired", err)
	}
	if err := control.ParseJWT(operatorToken, ring, t0, nil); !errors.Is(err, capability.ErrInvalidConfig) {
		t.Fatalf("nil claims: err = %v, want ErrInvalidConfig", err)
	}
}

func TestSignJWTRefusesUnverifiableClaims(t *testing.T) {
	ring := newRing(t, t0)
	full := jwt.RegisteredClaims{
		Issuer: testIssuer, Audience: jwt.ClaimStrings{testAudience}, ExpiresAt: jwt.NewNumericDate(t0.Add(time.Minute)),
	}
	for name, change := range map[string]func(*jwt.RegisteredClaims){
		"no exp": func(c *jwt.RegisteredClaims) { c.ExpiresAt = nil },
		"no iss": func(c *jwt.RegisteredClaims) { c.Issuer = "" },
		"no aud": func(c *jwt.RegisteredClaims) { c.Audience = nil },
	} {
		c := full
		change(&c)
		if _, err := capability.SignJWT(ring, c, t0); !errors.Is(err, capability.ErrTokenClaims) {
			t.Errorf("%s: err = %v, want ErrTokenClaims", name, err)
		}
	}
	if _, err := capability.SignJWT(ring, full, t0); err != nil {
		t.Fatalf("complete claims: %v", err)
	}
}
