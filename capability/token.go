package capability

import (
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Token limits. MaxTokenTTL and MaxLeeway together bound how long a revoked
// grant can still be presented, and so how long its tombstone must be kept
// (see DropAfter). They are constants, not settings, so that a verifier and
// the control plane cannot disagree about them.
const (
	// MaxTokenBytes is the largest token Verify will parse. Anything larger
	// is refused before any decoding.
	MaxTokenBytes = 8 << 10
	// DefaultTokenTTL is the token lifetime when Mint is given ttl 0.
	DefaultTokenTTL = 5 * time.Minute
	// MaxTokenTTL is the longest token lifetime Mint issues and Verify
	// accepts (exp − iat).
	MaxTokenTTL = 15 * time.Minute
	// DefaultLeeway is the clock-skew allowance for exp, nbf and iat.
	DefaultLeeway = 5 * time.Second
	// MaxLeeway is the largest leeway a Verifier may be configured with.
	MaxLeeway = 30 * time.Second
)

// Algorithm is the only JWS algorithm Tether signs or accepts.
const Algorithm = "EdDSA"

// KeyLookup finds the public key for a kid. KeyRing implements it, and so
// does a ring parsed from JWKS (ParseJWKS). An unknown kid must be reported
// with an error wrapping ErrUnknownKey; any other error is passed through
// wrapped, so a verifier can fail closed on, say, a stale key cache.
type KeyLookup interface {
	Public(kid string) (ed25519.PublicKey, error)
}

// Claims are the verified contents of a capability token.
type Claims struct {
	// GrantID is the jti: the grant the token was minted from.
	GrantID string
	// HolderNodeID is the sub: the node the grant is held by.
	HolderNodeID string
	// Chain is the ancestor grant ids, root first, excluding GrantID.
	Chain     []string
	Scopes    []string
	IssuedAt  time.Time
	NotBefore time.Time
	ExpiresAt time.Time
	// Root is the root node of the holder's tree (the revocation feed's
	// lineage), the root claim: a verifier that follows one tree's
	// revocations refuses a token of another. Empty in a token minted
	// before the thirty-ninth pass, or by Mint without a tree.
	Root string
	// KeyID is the kid the token was signed with.
	KeyID string
}

// capabilityClaims is the wire form of Claims, as Mint writes it.
type capabilityClaims struct {
	jwt.RegisteredClaims
	Chain  []string `json:"chain"`
	Scopes []string `json:"scopes"`
	Root   string   `json:"root,omitempty"`
}

// Minter mints capability tokens. The zero value is unusable; use NewMinter.
type Minter struct {
	issuer   string
	audience string
}

// NewMinter returns a Minter whose tokens carry iss = issuer (e.g. "tether")
// and aud = [audience] (e.g. "tether-tools").
func NewMinter(issuer, audience string) (Minter, error) {
	if issuer == "" || audience == "" {
		return Minter{}, fmt.Errorf("%w: issuer and audience are required", ErrInvalidConfig)
	}
	return Minter{issuer: issuer, audience: audience}, nil
}

// Mint signs a token for g with the ring's signer at now. The token lives
// ttl (0 means DefaultTokenTTL; at most MaxTokenTTL) but never past the
// grant's expiry. Times are whole seconds, rounded down, so the returned exp
// is exactly the token's.
//
// Mint checks only g itself (active, not before, not expired). The caller
// must first establish that no ancestor is revoked or expired — CheckGrant
// over the stored chain and the tombstone set — because the stored state of
// descendants is marked asynchronously.
func (m Minter) Mint(ring KeyRing, g Grant, now time.Time, ttl time.Duration) (token string, expiresAt time.Time, err error) {
	return m.MintInTree(ring, g, "", now, ttl)
}

// MintInTree is Mint for a holder in the tree whose root node is root: the
// token carries it as its root claim (Claims.Root), so that a verifier
// following only one tree's revocations can refuse another tree's tokens.
// An empty root writes no claim.
func (m Minter) MintInTree(ring KeyRing, g Grant, root string, now time.Time, ttl time.Duration) (token string, expiresAt time.Time, err error) {
	if root != "" {
		if err := ValidateID("root", root); err != nil {
			return "", time.Time{}, err
		}
	}
	if m.issuer == "" || m.audience == "" {
		return "", time.Time{}, fmt.Errorf("%w: minter has no issuer or audience", ErrInvalidConfig)
	}
	if ttl == 0 {
		ttl = DefaultTokenTTL
	}
	if ttl < 0 || ttl > MaxTokenTTL {
		return "", time.Time{}, fmt.Errorf("%w: token ttl %s is out of range: want more than 0s and at most %s", ErrInvalidTTL, ttl, MaxTokenTTL)
	}
	if err := g.CheckActive(now); err != nil {
		return "", time.Time{}, err
	}
	if err := validateGrantShape(g); err != nil {
		return "", time.Time{}, err
	}
	issued := now.Truncate(time.Second)
	expires := now.Add(ttl)
	if g.ExpiresAt.Before(expires) {
		expires = g.ExpiresAt
	}
	expires = expires.Truncate(time.Second)
	if !expires.After(issued) {
		return "", time.Time{}, fmt.Errorf("%w: grant %s expires within the second", ErrGrantExpired, g.GrantID)
	}
	chain := g.Chain
	if chain == nil {
		chain = []string{}
	}
	claims := capabilityClaims{
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer:    m.issuer,
			Subject:   g.HolderNodeID,
			Audience:  jwt.ClaimStrings{m.audience},
			ExpiresAt: jwt.NewNumericDate(expires),
			NotBefore: jwt.NewNumericDate(issued),
			IssuedAt:  jwt.NewNumericDate(issued),
			ID:        g.GrantID,
		},
		Chain:  chain,
		Scopes: g.Scopes,
		Root:   root,
	}
	token, err = SignJWT(ring, claims, now)
	if err != nil {
		return "", time.Time{}, err
	}
	return token, expires, nil
}

// validateGrantShape checks what a token will carry, so Mint never issues a
// token that Verify would refuse as malformed.
func validateGrantShape(g Grant) error {
	if err := ValidateID("grant_id", g.GrantID); err != nil {
		return err
	}
	if err := ValidateID("holder_node_id", g.HolderNodeID); err != nil {
		return err
	}
	if err := validateChain(g.GrantID, g.Chain); err != nil {
		return fmt.Errorf("%w: grant %s: %v", ErrInvalidGrant, g.GrantID, err)
	}
	if _, err := validateScopeSet(g.Scopes); err != nil {
		return fmt.Errorf("grant %s: %w", g.GrantID, err)
	}
	return nil
}

// SignJWT signs claims with the ring's signer at now, EdDSA with a kid
// header. It is the one signing path for every Tether JWT: capability
// tokens, operator tokens and agent credentials, which differ by audience.
// It refuses claims without exp, iss or aud, which ParseJWT would refuse,
// and tokens over MaxTokenBytes.
func SignJWT(ring KeyRing, claims jwt.Claims, now time.Time) (string, error) {
	if exp, err := claims.GetExpirationTime(); err != nil || exp == nil {
		return "", fmt.Errorf("%w: refusing to sign without exp", ErrTokenClaims)
	}
	if iss, err := claims.GetIssuer(); err != nil || iss == "" {
		return "", fmt.Errorf("%w: refusing to sign without iss", ErrTokenClaims)
	}
	if aud, err := claims.GetAudience(); err != nil || len(aud) == 0 {
		return "", fmt.Errorf("%w: refusing to sign without aud", ErrTokenClaims)
	}
	key, err := ring.Signer(now)
	if err != nil {
		return "", err
	}
	payload, err := json.Marshal(claims)
	if err != nil {
		return "", fmt.Errorf("capability: encode claims: %w", err)
	}
	return SignEncodedJWT(key, payload)
}

// Verifier checks Tether JWTs offline: signature against a KeyLookup,
// algorithm, issuer, audience and times against an injected clock. The
// zero value refuses everything; use NewVerifier.
type Verifier struct {
	issuer   string
	audience string
	leeway   time.Duration
}

// NewVerifier returns a Verifier that accepts only tokens with iss = issuer
// and audience in aud, allowing leeway (0 to MaxLeeway) of clock skew.
func NewVerifier(issuer, audience string, leeway time.Duration) (Verifier, error) {
	if issuer == "" || audience == "" {
		return Verifier{}, fmt.Errorf("%w: issuer and audience are required", ErrInvalidConfig)
	}
	if leeway < 0 || leeway > MaxLeeway {
		return Verifier{}, fmt.Errorf("%w: leeway %s is outside [0, %s]", ErrInvalidConfig, leeway, MaxLeeway)
	}
	return Verifier{issuer: issuer, audience: audience, leeway: leeway}, nil
}

// Leeway is the clock-skew allowance the verifier applies.
func (v Verifier) Leeway() time.Duration { return v.leeway }

// Verify checks a capability token and returns its claims. On failure the
// error wraps exactly one of ErrTokenTooLarge, ErrTokenMalformed,
// ErrTokenAlgorithm, ErrUnknownKey, ErrTokenSignature, ErrTokenIssuer,
// ErrTokenAudience, ErrTokenClaims, ErrTokenExpired, ErrTokenNotYetValid or
// ErrInvalidConfig — or a KeyLookup error that is not ErrUnknownKey. The
// message never contains the token.
//
// Beyond the standard claims, Verify requires jti, sub, iat and nbf; a
// chain of at most MaxChainDepth distinct well-formed grant ids not
// containing jti; 1 to MaxScopes well-formed scopes; and a lifetime
// exp − iat of at most MaxTokenTTL.
//
// Verify does not consult tombstones: the caller checks
// TombstoneSet.Revoked(claims.GrantID, claims.Chain) next (see Check).
func (v Verifier) Verify(token string, keys KeyLookup, now time.Time) (Claims, error) {
	var wire receivedClaims
	kid, err := v.parse(token, keys, now, &wire)
	if err != nil {
		return Claims{}, err
	}
	claims, err := capabilityFromWire(wire)
	if err != nil {
		return Claims{}, err
	}
	claims.KeyID = kid
	return claims, nil
}

// VerifyHolder is Verify for a token that may be past its expiry: a token
// whose only fault is its exp returns its claims with the error (wrapping
// ErrTokenExpired), every other check made as Verify makes it (the
// signature, issuer, audience, the capability claims), at a moment of the
// token's own lifetime. It names the holder of a dead credential still at
// work (a tool server's report that it served one); never authorize
// anything on its claims.
func (v Verifier) VerifyHolder(token string, keys KeyLookup, now time.Time) (Claims, error) {
	claims, err := v.Verify(token, keys, now)
	if !errors.Is(err, ErrTokenExpired) {
		return claims, err
	}
	_, rest, _ := strings.Cut(token, ".")
	payload, _, _ := strings.Cut(rest, ".")
	var c struct {
		Exp *float64 `json:"exp"`
	}
	if !decodeSegment(payload, &c) || c.Exp == nil {
		return Claims{}, err
	}
	// Its last moment: jwt takes a token as expired from exp itself.
	claims, verr := v.Verify(token, keys, numericDate(c.Exp).Time.Add(-time.Nanosecond))
	if verr != nil {
		return Claims{}, verr
	}
	return claims, err
}

// ParseJWT verifies any Tether JWT (an operator token, an agent credential)
// into claims, with exactly the parser options Verify uses: EdDSA only, exp
// required, iss and aud checked, iat not in the future, the verifier's
// leeway, the clock fixed at now, strict base64. claims must be a pointer.
// Errors are as for Verify; checks specific to the claim type are the
// caller's.
func (v Verifier) ParseJWT(token string, keys KeyLookup, now time.Time, claims jwt.Claims) error {
	_, err := v.parse(token, keys, now, claims)
	return err
}

func (v Verifier) parse(token string, keys KeyLookup, now time.Time, claims jwt.Claims) (kid string, err error) {
	if v.issuer == "" || v.audience == "" {
		// jwt.WithIssuer("") would silently skip the issuer check.
		return "", fmt.Errorf("%w: verifier has no issuer or audience", ErrInvalidConfig)
	}
	if keys == nil || claims == nil {
		return "", fmt.Errorf("%w: no key lookup or claims", ErrInvalidConfig)
	}
	if len(token) > MaxTokenBytes {
		return "", fmt.Errorf("%w: %d bytes exceeds %d", ErrTokenTooLarge, len(token), MaxTokenBytes)
	}
	if !CompactJWSAlphabet(token) {
		// Go's base64 decoders skip CR and LF even in strict mode; refusing
		// everything outside the base64url alphabet makes the encoding
		// canonical, so one token has exactly one accepted spelling.
		return "", fmt.Errorf("%w: not a compact JWS (only base64url and '.' are allowed)", ErrTokenMalformed)
	}
	var keyErr error
	parser := jwt.NewParser(
		jwt.WithValidMethods([]string{Algorithm}),
		jwt.WithExpirationRequired(),
		jwt.WithIssuer(v.issuer),
		jwt.WithAudience(v.audience),
		jwt.WithIssuedAt(),
		jwt.WithLeeway(v.leeway),
		jwt.WithTimeFunc(func() time.Time { return now }),
		jwt.WithStrictDecoding(),
	)
	parsed, err := parser.ParseWithClaims(token, claims, func(t *jwt.Token) (any, error) {
		kid, keyErr = headerKeyID(t.Header)
		if keyErr != nil {
			return nil, keyErr
		}
		pub, err := keys.Public(kid)
		switch {
		case errors.Is(err, ErrUnknownKey):
			keyErr = fmt.Errorf("%w: kid %q", ErrUnknownKey, kid)
		case err != nil:
			keyErr = fmt.Errorf("capability: look up kid %q: %w", kid, err)
		case len(pub) != ed25519.PublicKeySize:
			keyErr = fmt.Errorf("%w: kid %q has no usable Ed25519 public key", ErrUnknownKey, kid)
		}
		if keyErr != nil {
			return nil, keyErr
		}
		return pub, nil
	})
	if err == nil {
		return kid, nil
	}
	if keyErr != nil {
		return "", keyErr
	}
	return "", classifyParseError(err, parsed, claims, v.leeway)
}

// headerKeyID returns a well-formed kid and refuses a crit header: no
// extension is understood, so RFC 7515 §4.1.11 requires rejection.
func headerKeyID(header map[string]any) (string, error) {
	if valueDepth(map[string]any(header)) > MaxJSONDepth {
		return "", fmt.Errorf("%w: header nested deeper than %d", ErrTokenMalformed, MaxJSONDepth)
	}
	if _, ok := header["crit"]; ok {
		return "", fmt.Errorf("%w: crit header is not supported", ErrTokenMalformed)
	}
	kid, ok := header["kid"].(string)
	if !ok || kid == "" {
		return "", fmt.Errorf("%w: kid header is missing", ErrTokenMalformed)
	}
	if len(kid) > MaxIDBytes || !printableASCII(kid) {
		return "", fmt.Errorf("%w: kid header is malformed", ErrTokenMalformed)
	}
	return kid, nil
}

// classifyParseError maps golang-jwt's errors to this package's sentinels,
// with fixed messages: golang-jwt's own may quote decoded token bytes.
func classifyParseError(err error, parsed *jwt.Token, claims jwt.Claims, leeway time.Duration) error {
	switch {
	case errors.Is(err, jwt.ErrTokenMalformed):
		return fmt.Errorf("%w: not a well-formed JWT", ErrTokenMalformed)
	case errors.Is(err, jwt.ErrTokenSignatureInvalid), errors.Is(err, jwt.ErrTokenUnverifiable):
		if parsed == nil || parsed.Method == nil || parsed.Method.Alg() != Algorithm {
			return fmt.Errorf("%w: alg %s; only %s is accepted", ErrTokenAlgorithm, describeAlg(parsed), Algorithm)
		}
		return fmt.Errorf("%w: signature does not verify", ErrTokenSignature)
	case errors.Is(err, jwt.ErrTokenInvalidClaims):
		return classifyClaimsError(err, claims, leeway)
	default:
		return fmt.Errorf("%w: unrecognised parse failure", ErrTokenMalformed)
	}
}

// classifyClaimsError picks one sentinel when several claims fail, in a
// fixed order: a missing or foreign issuer, then audience (the token was
// never meant for this verifier), then a missing exp, then time.
func classifyClaimsError(err error, claims jwt.Claims, leeway time.Duration) error {
	missing := errors.Is(err, jwt.ErrTokenRequiredClaimMissing)
	iss, _ := claims.GetIssuer()
	aud, _ := claims.GetAudience()
	exp, _ := claims.GetExpirationTime()
	switch {
	case errors.Is(err, jwt.ErrTokenInvalidIssuer):
		return fmt.Errorf("%w: iss is not the expected issuer", ErrTokenIssuer)
	case missing && iss == "":
		return fmt.Errorf("%w: iss is missing", ErrTokenIssuer)
	case errors.Is(err, jwt.ErrTokenInvalidAudience):
		return fmt.Errorf("%w: aud does not include the expected audience", ErrTokenAudience)
	case missing && (len(aud) == 0 || len(aud) == 1 && aud[0] == ""):
		return fmt.Errorf("%w: aud is missing", ErrTokenAudience)
	case missing && exp == nil:
		return fmt.Errorf("%w: exp is required", ErrTokenClaims)
	case errors.Is(err, jwt.ErrTokenExpired) && exp != nil:
		return fmt.Errorf("%w: expired at %s (leeway %s)", ErrTokenExpired, formatTime(exp.Time), leeway)
	case errors.Is(err, jwt.ErrTokenNotValidYet):
		if nbf, _ := claims.GetNotBefore(); nbf != nil {
			return fmt.Errorf("%w: not before %s (leeway %s)", ErrTokenNotYetValid, formatTime(nbf.Time), leeway)
		}
		return fmt.Errorf("%w: not yet valid", ErrTokenNotYetValid)
	case errors.Is(err, jwt.ErrTokenUsedBeforeIssued):
		return fmt.Errorf("%w: issued in the future (leeway %s)", ErrTokenNotYetValid, leeway)
	default:
		return fmt.Errorf("%w: a registered claim has the wrong type or is missing", ErrTokenClaims)
	}
}

func describeAlg(parsed *jwt.Token) string {
	if parsed == nil {
		return "missing"
	}
	alg, ok := parsed.Header["alg"].(string)
	switch {
	case !ok:
		return "missing"
	case len(alg) > 16 || !printableASCII(alg):
		return "malformed"
	default:
		return fmt.Sprintf("%q", alg)
	}
}

// capabilityFromWire applies the capability-specific claim checks.
func capabilityFromWire(w receivedClaims) (Claims, error) {
	if err := idProblem("jti", w.ID); err != nil {
		return Claims{}, fmt.Errorf("%w: %v", ErrTokenClaims, err)
	}
	if err := idProblem("sub", w.Subject); err != nil {
		return Claims{}, fmt.Errorf("%w: %v", ErrTokenClaims, err)
	}
	if err := validateChain(w.ID, w.Chain); err != nil {
		return Claims{}, fmt.Errorf("%w: %v", ErrTokenClaims, err)
	}
	if w.Root != "" {
		if err := idProblem("root", w.Root); err != nil {
			return Claims{}, fmt.Errorf("%w: %v", ErrTokenClaims, err)
		}
	}
	if len(w.Scopes) == 0 || len(w.Scopes) > MaxScopes {
		return Claims{}, fmt.Errorf("%w: %d scopes is outside [1, %d]", ErrTokenClaims, len(w.Scopes), MaxScopes)
	}
	for _, s := range w.Scopes {
		if err := scopeProblem(s); err != nil {
			return Claims{}, fmt.Errorf("%w: %v", ErrTokenClaims, err)
		}
	}
	if w.IssuedAt == nil || w.NotBefore == nil || w.ExpiresAt == nil {
		return Claims{}, fmt.Errorf("%w: iat, nbf and exp are required", ErrTokenClaims)
	}
	iat, nbf, exp := numericDate(w.IssuedAt).Time, numericDate(w.NotBefore).Time, numericDate(w.ExpiresAt).Time
	if !exp.After(iat) || !exp.After(nbf) || exp.Sub(iat) > MaxTokenTTL {
		return Claims{}, fmt.Errorf("%w: lifetime from iat to exp must be within (0, %s]", ErrTokenClaims, MaxTokenTTL)
	}
	return Claims{
		GrantID:      w.ID,
		HolderNodeID: w.Subject,
		Chain:        slices.Clip(w.Chain),
		Scopes:       slices.Clip(w.Scopes),
		Root:         w.Root,
		IssuedAt:     iat,
		NotBefore:    nbf,
		ExpiresAt:    exp,
	}, nil
}

// validateChain checks a chain of ancestor grant ids for grantID.
func validateChain(grantID string, chain []string) error {
	if len(chain) > MaxChainDepth {
		return fmt.Errorf("chain of %d ancestors exceeds %d", len(chain), MaxChainDepth)
	}
	for i, id := range chain {
		if err := idProblem("chain entry", id); err != nil {
			return err
		}
		if id == grantID {
			return fmt.Errorf("chain contains the grant itself")
		}
		if slices.Contains(chain[:i], id) {
			return fmt.Errorf("chain repeats a grant id")
		}
	}
	return nil
}

// CompactJWSAlphabet reports whether s uses only base64url characters and
// dots.
func CompactJWSAlphabet(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_', c == '.':
		default:
			return false
		}
	}
	return true
}

// CompactJWS reports whether s has a compact JWS's shape within
// MaxTokenBytes (the control plane's own parsers' bound, its credentials'
// as its capability tokens'): three segments of base64url characters, no
// signature checked. A token of any other shape is one no verifier of
// Tether's takes; one of this shape may still fail verification.
func CompactJWS(s string) bool {
	return s != "" && len(s) <= MaxTokenBytes && strings.Count(s, ".") == 2 && CompactJWSAlphabet(s)
}
