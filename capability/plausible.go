package capability

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"time"
)

// Plausible reports, without the signature's work, whether token could
// verify at now: its size and alphabet, three segments, a signature of an
// Ed25519 signature's length, a header naming EdDSA and a key keys knows,
// and an expiry not yet past (with the verifier's leeway). A token it
// refuses would fail Verify; one it accepts may still fail it. It costs
// two small base64 decodes and JSON reads, where Verify's signature check
// costs an Ed25519 verification: a server refuses a flood of garbage
// with it once the flood's budget is spent, and still verifies every
// token that might be real.
func (v Verifier) Plausible(token string, keys KeyLookup, now time.Time) bool {
	if keys == nil || len(token) > MaxTokenBytes || !CompactJWSAlphabet(token) {
		return false
	}
	header, rest, ok := strings.Cut(token, ".")
	if !ok {
		return false
	}
	payload, sig, ok := strings.Cut(rest, ".")
	if !ok || strings.Contains(sig, ".") {
		return false
	}
	if base64.RawURLEncoding.DecodedLen(len(sig)) != 64 {
		return false
	}
	var h struct {
		Alg string `json:"alg"`
		Kid string `json:"kid"`
	}
	if !decodeSegment(header, &h) || h.Alg != Algorithm || h.Kid == "" || len(h.Kid) > MaxIDBytes {
		return false
	}
	if pub, err := keys.Public(h.Kid); err != nil || len(pub) == 0 {
		return false
	}
	var c struct {
		Exp *float64 `json:"exp"`
	}
	if !decodeSegment(payload, &c) || c.Exp == nil {
		return false
	}
	return !now.Add(-v.leeway).After(time.Unix(int64(*c.Exp), 0))
}

func decodeSegment(seg string, into any) bool {
	b, err := base64.RawURLEncoding.Strict().DecodeString(seg)
	if err != nil {
		return false
	}
	return json.Unmarshal(b, into) == nil
}
