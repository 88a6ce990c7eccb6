package auth

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/internal/fault"
)

// Audiences keep the kinds of token apart: a capability token (for tools)
// is never accepted as an operator, agent or tool-server credential, and no
// credential of one kind is accepted as another.
const (
	AudienceOperator   = "tether-operator"
	AudienceAgent      = "tether-agent"
	AudienceToolServer = "tether-tool-server"
	// Leeway is the clock skew tolerated on exp/nbf/iat.
	Leeway = 5 * time.Second
	// MaxTokenBytes bounds what the parser will look at.
	MaxTokenBytes = 8 << 10
)

// Sentinel errors; messages never contain the token.
var (
	ErrNoCredential  = fault.New(fault.Unauthenticated, "auth: no bearer credential")
	ErrBadCredential = fault.New(fault.Unauthenticated, "auth: credential is not valid")
	ErrRevoked       = fault.New(fault.Unauthenticated, "auth: credential revoked")
	ErrDenied        = fault.New(fault.Denied, "auth: permission denied")
	// ErrTooManyConnections refuses a request whose caller holds every
	// connection it may (Interceptor.Bind); the Gate closes the
	// connection it came on.
	ErrTooManyConnections = fault.New(fault.Exhausted, "auth: too many connections")
)

type claims struct {
	jwt.RegisteredClaims
	Role string `json:"role,omitempty"`
}

// Issuer mints and parses operator tokens and agent credentials.
type Issuer struct {
	// Name is the `iss` claim.
	Name string
	// Ring returns the current key ring.
	Ring func() capability.KeyRing
}

// MintOperator mints an operator token.
func (i Issuer) MintOperator(subject string, role Role, now time.Time, ttl time.Duration) (token, id string, exp time.Time, err error) {
	return i.mint(AudienceOperator, subject, role.String(), now, ttl)
}

// MintToolServer mints a tool server's token; name is its gate id.
func (i Issuer) MintToolServer(name string, now time.Time, ttl time.Duration) (token, id string, exp time.Time, err error) {
	return i.mint(AudienceToolServer, name, "", now, ttl)
}

// MintAgent mints an agent credential for node.
func (i Issuer) MintAgent(nodeID string, now time.Time, ttl time.Duration) (token string, exp time.Time, err error) {
	token, _, exp, err = i.mint(AudienceAgent, nodeID, "", now, ttl)
	return token, exp, err
}

func (i Issuer) mint(audience, subject, role string, now time.Time, ttl time.Duration) (string, string, time.Time, error) {
	s, m, err := i.minted(audience, subject, role, now, ttl)
	return s, m.principal.TokenID, m.exp, err
}

// mintedToken is what minting a token proved about it: the principal a
// verification of it would find, and the key that signed it.
type mintedToken struct {
	principal Principal
	by        verifiedBy
	exp       time.Time
}

// minted mints a token and says what a verification of it would prove
// (Interceptor.MintAgent remembers it as verified).
func (i Issuer) minted(audience, subject, role string, now time.Time, ttl time.Duration) (string, mintedToken, error) {
	return i.mintedAs(newTokenID(), audience, subject, role, now, ttl)
}

// mintedAs is minted with the token id (jti) id: an agent's refreshed
// credential keeps the id of the one it replaces (Interceptor.RefreshAgent).
func (i Issuer) mintedAs(id, audience, subject, role string, now time.Time, ttl time.Duration) (string, mintedToken, error) {
	key, err := i.Ring().Signer(now)
	if err != nil {
		return "", mintedToken{}, err
	}
	exp := now.Add(ttl).Truncate(time.Second)
	s, err := capability.SignEncodedJWT(key, appendClaims(make([]byte, 0, 256), i.Name, subject, audience, role, id, exp, now))
	if err != nil {
		return "", mintedToken{}, fmt.Errorf("auth: sign: %w", err)
	}
	p := Principal{Subject: subject, TokenID: id, ExpiresAt: time.Unix(exp.Unix(), 0)}
	switch audience {
	case AudienceOperator:
		p.Kind = KindOperator
		if p.Role, err = ParseRole(role); err != nil {
			return "", mintedToken{}, fmt.Errorf("%w: unknown role", ErrBadCredential)
		}
	case AudienceAgent:
		p.Kind = KindAgent
	case AudienceToolServer:
		p.Kind = KindToolServer
	}
	return s, mintedToken{principal: p, by: verifiedBy{kid: key.ID, key: key.Public}, exp: exp}, nil
}

// appendClaims encodes the claims of a credential as golang-jwt encodes
// claims{RegisteredClaims, Role} (same fields, order and number format:
// whole seconds), without its reflection: minting is on every spawn's
// path. TestMintedClaimsMatchGolangJWT holds the two encodings equal.
func appendClaims(b []byte, issuer, subject, audience, role, id string, exp, now time.Time) []byte {
	b = append(b, '{')
	sep := func() {
		if len(b) > 1 {
			b = append(b, ',')
		}
	}
	str := func(name, v string) {
		if v != "" {
			sep()
			b = capability.AppendJSONString(append(append(b, '"'), name+`":`...), v)
		}
	}
	date := func(name string, t time.Time) {
		sep()
		b = strconv.AppendInt(append(append(b, '"'), name+`":`...), t.Truncate(time.Second).Unix(), 10)
	}
	str("iss", issuer)
	str("sub", subject)
	if audience != "" {
		sep()
		b = append(capability.AppendJSONString(append(b, `"aud":[`...), audience), ']')
	}
	date("exp", exp)
	date("nbf", now.Add(-time.Second))
	date("iat", now)
	str("jti", id)
	str("role", role)
	return append(b, '}')
}

// Parse verifies a bearer token against the ring and returns its principal.
// It accepts operator tokens, agent credentials and tool-server tokens;
// nothing else.
func (i Issuer) Parse(token string, now time.Time) (Principal, error) {
	p, _, err := i.parse(token, now)
	return p, err
}

// verifiedBy names the key that verified a token.
type verifiedBy struct {
	kid string
	key ed25519.PublicKey
}

// parse is Parse that also returns the key that verified the token.
func (i Issuer) parse(token string, now time.Time) (Principal, verifiedBy, error) {
	if token == "" {
		return Principal{}, verifiedBy{}, ErrNoCredential
	}
	if len(token) > MaxTokenBytes {
		return Principal{}, verifiedBy{}, fmt.Errorf("%w: credential longer than %d bytes", ErrBadCredential, MaxTokenBytes)
	}
	if !capability.CompactJWSAlphabet(token) {
		// Go's base64 decoders skip CR and LF even in strict mode: without
		// this, a token with a line break inserted would verify as the
		// same credential under another spelling.
		return Principal{}, verifiedBy{}, fmt.Errorf("%w: malformed token", ErrBadCredential)
	}
	ring := i.Ring()
	parser := jwt.NewParser(
		jwt.WithValidMethods([]string{"EdDSA"}),
		jwt.WithExpirationRequired(),
		jwt.WithIssuer(i.Name),
		jwt.WithLeeway(Leeway),
		jwt.WithIssuedAt(),
		jwt.WithTimeFunc(func() time.Time { return now }),
		// One encoding per token: a re-encoded signature (different
		// unused base64 bits, same bytes) is not the same credential.
		jwt.WithStrictDecoding(),
	)
	var c claims
	var by verifiedBy
	_, err := parser.ParseWithClaims(token, &c, func(t *jwt.Token) (any, error) {
		kid, _ := t.Header["kid"].(string)
		key, err := ring.Public(kid)
		by = verifiedBy{kid: kid, key: key}
		return key, err
	})
	if err != nil {
		return Principal{}, verifiedBy{}, fmt.Errorf("%w: %s", ErrBadCredential, describe(err))
	}
	if c.Subject == "" || len(c.Audience) != 1 {
		return Principal{}, verifiedBy{}, fmt.Errorf("%w: missing subject or audience", ErrBadCredential)
	}
	p := Principal{Subject: c.Subject, TokenID: c.ID}
	if c.ExpiresAt != nil {
		p.ExpiresAt = c.ExpiresAt.Time
	}
	switch c.Audience[0] {
	case AudienceOperator:
		role, err := ParseRole(c.Role)
		if err != nil {
			return Principal{}, verifiedBy{}, fmt.Errorf("%w: unknown role", ErrBadCredential)
		}
		p.Kind, p.Role = KindOperator, role
	case AudienceAgent:
		p.Kind = KindAgent
	case AudienceToolServer:
		p.Kind = KindToolServer
	default:
		return Principal{}, verifiedBy{}, fmt.Errorf("%w: token is not an operator, agent or tool-server credential", ErrBadCredential)
	}
	return p, by, nil
}

// describe turns a golang-jwt error into a short reason without any part of
// the token.
func describe(err error) string {
	switch {
	case errors.Is(err, capability.ErrUnknownKey):
		return "signed by an unknown key"
	case errors.Is(err, jwt.ErrTokenMalformed):
		return "malformed token"
	case errors.Is(err, jwt.ErrTokenSignatureInvalid), errors.Is(err, jwt.ErrTokenUnverifiable):
		return "bad signature or algorithm"
	case errors.Is(err, jwt.ErrTokenExpired):
		return "expired"
	case errors.Is(err, jwt.ErrTokenNotValidYet), errors.Is(err, jwt.ErrTokenUsedBeforeIssued):
		return "not valid yet"
	case errors.Is(err, jwt.ErrTokenInvalidIssuer):
		return "issued by another issuer"
	case errors.Is(err, jwt.ErrTokenRequiredClaimMissing):
		return "required claim missing"
	default:
		return "invalid token"
	}
}

func newTokenID() string {
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// ParseAnyTime verifies a token as Parse does, but at any time of its life:
// it accepts a token that has expired since, as long as its signature
// verifies with a key of the ring and it was valid at its own expiry. It is
// for revoking an old token by value (tether token rotate-admin), never for
// authenticating a call.
func (i Issuer) ParseAnyTime(token string) (Principal, error) {
	if token == "" || len(token) > MaxTokenBytes || !capability.CompactJWSAlphabet(token) {
		return i.Parse(token, time.Time{}) // the parser's own error
	}
	var c claims
	if _, _, err := jwt.NewParser().ParseUnverified(token, &c); err != nil || c.ExpiresAt == nil {
		return Principal{}, fmt.Errorf("%w: malformed token", ErrBadCredential)
	}
	return i.Parse(token, c.ExpiresAt.Time.Add(-time.Second))
}
