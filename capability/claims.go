package capability

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// receivedClaims is what Verify decodes a token's claims into: the JSON
// names of capabilityClaims, with the times as plain JSON numbers. It
// implements jwt.Claims, so golang-jwt's validator makes every standard
// check (exp, nbf, iat, iss, aud) through its methods as for
// jwt.RegisteredClaims.
//
// Decoding claims is the largest cost of a cold verification after the
// signature, so UnmarshalJSON takes a fast path, without reflection, for
// the claims Mint writes — one object of the ten known names, plain
// printable-ASCII strings, numbers — and hands everything else to
// encoding/json. Either way the result is exactly what encoding/json
// decodes into the same struct, once checkClaimNames has refused a known
// claim named twice or in another case (FuzzReceivedClaims compares them); a time
// written as a JSON string, which jwt.NumericDate would accept, is refused
// as a type error, and Mint never writes one.
type receivedClaims struct {
	Issuer    string           `json:"iss"`
	Subject   string           `json:"sub"`
	Audience  jwt.ClaimStrings `json:"aud"`
	ExpiresAt *float64         `json:"exp"`
	NotBefore *float64         `json:"nbf"`
	IssuedAt  *float64         `json:"iat"`
	ID        string           `json:"jti"`
	Chain     []string         `json:"chain"`
	Scopes    []string         `json:"scopes"`
	Root      string           `json:"root"`
}

// maxNumericDateSeconds bounds the seconds of a time claim (2^53, past
// which a float64 no longer counts every second): a time beyond it is read
// as the bound. time.Unix of seconds near 2^63 overflows the time's
// internal count, and an nbf of the float just below 2^63 seconds read as
// the distant past: a token not valid before the year 292 billion was
// accepted, where the TypeScript and Python verifiers refuse it.
const maxNumericDateSeconds = 1 << 53

// numericDate converts JSON seconds as jwt.NumericDate.UnmarshalJSON
// does: whole and fractional seconds, truncated to jwt.TimePrecision,
// within ±maxNumericDateSeconds.
func numericDate(seconds *float64) *jwt.NumericDate {
	if seconds == nil {
		return nil
	}
	whole, frac := math.Modf(min(max(*seconds, -maxNumericDateSeconds), maxNumericDateSeconds))
	return jwt.NewNumericDate(time.Unix(int64(whole), int64(frac*1e9)))
}

func (c *receivedClaims) GetExpirationTime() (*jwt.NumericDate, error) {
	return numericDate(c.ExpiresAt), nil
}
func (c *receivedClaims) GetIssuedAt() (*jwt.NumericDate, error) { return numericDate(c.IssuedAt), nil }
func (c *receivedClaims) GetNotBefore() (*jwt.NumericDate, error) {
	return numericDate(c.NotBefore), nil
}
func (c *receivedClaims) GetIssuer() (string, error)             { return c.Issuer, nil }
func (c *receivedClaims) GetSubject() (string, error)            { return c.Subject, nil }
func (c *receivedClaims) GetAudience() (jwt.ClaimStrings, error) { return c.Audience, nil }

// UnmarshalJSON decodes claims, on the fast path when it can (see
// receivedClaims), else with encoding/json.
func (c *receivedClaims) UnmarshalJSON(data []byte) error {
	var fast receivedClaims
	if fast.decodePlain(data) {
		*c = fast
		return nil
	}
	if jsonDepth(data) > MaxJSONDepth {
		return fmt.Errorf("%w: claims nested deeper than %d", ErrTokenMalformed, MaxJSONDepth)
	}
	if err := checkClaimNames(data); err != nil {
		return err
	}
	type reflected receivedClaims // the same fields, without this method
	return json.Unmarshal(data, (*reflected)(c))
}

// decodePlain decodes data if it is an object whose keys are distinct
// known names, exactly spelled, and whose values have the expected JSON
// types with strings of printable ASCII and no escapes. It reports false,
// leaving the caller to use encoding/json, for anything else — including
// everything encoding/json treats specially: escapes, other bytes in
// strings, case-insensitive or repeated keys, unknown keys, nulls.
func (c *receivedClaims) decodePlain(data []byte) bool {
	s := plainScanner{b: data}
	if !s.consume('{') {
		return false
	}
	if s.consume('}') {
		return s.atEnd()
	}
	var seen uint16
	for {
		key, ok := s.str()
		if !ok || !s.consume(':') {
			return false
		}
		var bit uint16
		switch key {
		case "iss":
			bit = 1 << 0
			c.Issuer, ok = s.str()
		case "sub":
			bit = 1 << 1
			c.Subject, ok = s.str()
		case "aud":
			bit = 1 << 2
			c.Audience, ok = s.audience()
		case "exp":
			bit = 1 << 3
			c.ExpiresAt, ok = s.number()
		case "nbf":
			bit = 1 << 4
			c.NotBefore, ok = s.number()
		case "iat":
			bit = 1 << 5
			c.IssuedAt, ok = s.number()
		case "jti":
			bit = 1 << 6
			c.ID, ok = s.str()
		case "chain":
			bit = 1 << 7
			c.Chain, ok = s.strings()
		case "scopes":
			bit = 1 << 8
			c.Scopes, ok = s.strings()
		case "root":
			bit = 1 << 9
			c.Root, ok = s.str()
		default:
			return false
		}
		if !ok || seen&bit != 0 {
			return false
		}
		seen |= bit
		if s.consume('}') {
			return s.atEnd()
		}
		if !s.consume(',') {
			return false
		}
	}
}

// plainScanner reads the subset of JSON decodePlain accepts.
type plainScanner struct {
	b []byte
	i int
}

func (s *plainScanner) skipSpace() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *plainScanner) consume(c byte) bool {
	s.skipSpace()
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

func (s *plainScanner) atEnd() bool {
	s.skipSpace()
	return s.i == len(s.b)
}

// str reads a string of printable ASCII without escapes.
func (s *plainScanner) str() (string, bool) {
	if !s.consume('"') {
		return "", false
	}
	for j := s.i; j < len(s.b); j++ {
		switch c := s.b[j]; {
		case c == '"':
			v := string(s.b[s.i:j])
			s.i = j + 1
			return v, true
		case c < 0x20 || c > 0x7e || c == '\\':
			return "", false
		}
	}
	return "", false
}

// strings reads an array of plain strings; [] is an empty, non-nil slice,
// as encoding/json makes it.
func (s *plainScanner) strings() ([]string, bool) {
	if !s.consume('[') {
		return nil, false
	}
	out := []string{}
	if s.consume(']') {
		return out, true
	}
	for {
		v, ok := s.str()
		if !ok {
			return nil, false
		}
		out = append(out, v)
		if s.consume(']') {
			return out, true
		}
		if !s.consume(',') {
			return nil, false
		}
	}
}

// audience reads aud as jwt.ClaimStrings.UnmarshalJSON does: one string,
// or an array of strings, an empty array leaving it nil.
func (s *plainScanner) audience() (jwt.ClaimStrings, bool) {
	s.skipSpace()
	if s.i < len(s.b) && s.b[s.i] == '"' {
		v, ok := s.str()
		return jwt.ClaimStrings{v}, ok
	}
	values, ok := s.strings()
	if !ok || len(values) == 0 {
		return nil, ok
	}
	return jwt.ClaimStrings(values), true
}

// number reads a JSON number as encoding/json decodes it into a float64.
func (s *plainScanner) number() (*float64, bool) {
	s.skipSpace()
	start := s.i
	if s.i < len(s.b) && s.b[s.i] == '-' {
		s.i++
	}
	switch {
	case s.i < len(s.b) && s.b[s.i] == '0':
		s.i++
	case s.i < len(s.b) && s.b[s.i] >= '1' && s.b[s.i] <= '9':
		s.digits()
	default:
		return nil, false
	}
	if s.i < len(s.b) && s.b[s.i] == '.' {
		s.i++
		if !s.digits() {
			return nil, false
		}
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		s.i++
		if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
			s.i++
		}
		if !s.digits() {
			return nil, false
		}
	}
	f, err := strconv.ParseFloat(string(s.b[start:s.i]), 64)
	if err != nil {
		return nil, false
	}
	return &f, true
}

// digits skips one or more decimal digits.
func (s *plainScanner) digits() bool {
	start := s.i
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
	}
	return s.i > start
}

// knownClaimNames are the claim names a capability token is read by.
var knownClaimNames = [...]string{"iss", "sub", "aud", "exp", "nbf", "iat", "jti", "chain", "scopes", "root"}

// checkClaimNames refuses a claims segment whose top-level object names a
// known claim twice, or names one in another case ("SUB", "ſub" with
// U+017F): encoding/json matches names case-insensitively and keeps the
// last, where the TypeScript and Python verifiers read the exact name. A
// token with "sub" and "SUB" read as two holders, one per SDK. A segment
// that is not a JSON object is left to encoding/json.
func checkClaimNames(payload []byte) error {
	dec := json.NewDecoder(bytes.NewReader(payload))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil
	}
	var seen [len(knownClaimNames)]bool
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil
		}
		name, _ := tok.(string)
		for i, known := range knownClaimNames {
			if !strings.EqualFold(name, known) {
				continue
			}
			if name != known || seen[i] {
				return fmt.Errorf("%w: claim %q is named twice or in another case", ErrTokenMalformed, known)
			}
			seen[i] = true
		}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil
		}
	}
	return nil
}

// MaxJSONDepth bounds the nesting of a token's header and claims (the
// top-level object is depth 1). Python's json refused claims nested past
// its recursion limit (about a thousand levels), which Go and JavaScript
// accepted: the control plane and the three verifiers now refuse the same
// tokens, and the bound sits far below any recursion limit.
const MaxJSONDepth = 64

// jsonDepth is the deepest nesting of arrays and objects in data, read as
// JSON (brackets inside strings do not count); for invalid JSON a number
// the parser's own refusal makes moot.
func jsonDepth(data []byte) int {
	depth, deepest := 0, 0
	for i := 0; i < len(data); i++ {
		switch data[i] {
		case '"':
			for i++; i < len(data) && data[i] != '"'; i++ {
				if data[i] == '\\' {
					i++
				}
			}
		case '[', '{':
			depth++
			deepest = max(deepest, depth)
		case ']', '}':
			depth--
		}
	}
	return deepest
}

// valueDepth is jsonDepth of a decoded value.
func valueDepth(v any) int {
	deepest := 0
	switch v := v.(type) {
	case map[string]any:
		for _, e := range v {
			deepest = max(deepest, valueDepth(e))
		}
	case []any:
		for _, e := range v {
			deepest = max(deepest, valueDepth(e))
		}
	default:
		return 0
	}
	return deepest + 1
}
