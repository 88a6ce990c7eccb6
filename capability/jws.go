package capability

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"unicode/utf8"
)

// SignEncodedJWT signs claims that are already a JSON object with key,
// EdDSA with a kid header, and returns the compact JWS: the bytes
// golang-jwt would produce for the same claims, without its reflection
// (JSON encoding of the header map and the claims was half the cost of
// minting a credential). The caller vouches that claims is one JSON
// object with exp, iss and aud; ParseJWT and the auth parser check them.
func SignEncodedJWT(key SigningKey, claims []byte) (string, error) {
	if len(key.Private) != ed25519.PrivateKeySize {
		return "", fmt.Errorf("capability: sign token with key %q: not an Ed25519 private key", key.ID)
	}
	header := AppendJSONString(append(make([]byte, 0, 64), `{"alg":"EdDSA","kid":`...), key.ID)
	header = append(header, `,"typ":"JWT"}`...)
	enc := base64.RawURLEncoding
	n := enc.EncodedLen(len(header)) + 1 + enc.EncodedLen(len(claims))
	out := make([]byte, 0, n+1+enc.EncodedLen(ed25519.SignatureSize))
	out = enc.AppendEncode(out, header)
	out = append(out, '.')
	out = enc.AppendEncode(out, claims)
	sig := ed25519.Sign(key.Private, out)
	out = append(out, '.')
	out = enc.AppendEncode(out, sig)
	if len(out) > MaxTokenBytes {
		return "", fmt.Errorf("%w: token of %d bytes exceeds %d; narrow the scopes or the chain", ErrTokenTooLarge, len(out), MaxTokenBytes)
	}
	return string(out), nil
}

// AppendJSONString appends s as a JSON string, as encoding/json writes
// it: plain printable ASCII is copied, anything else (quotes, backslashes,
// control characters, HTML-sensitive characters, non-ASCII, invalid
// UTF-8) goes through encoding/json.
func AppendJSONString(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= utf8.RuneSelf || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			b, _ := json.Marshal(s) // a string always marshals
			return append(dst, b...)
		}
	}
	dst = append(dst, '"')
	dst = append(dst, s...)
	return append(dst, '"')
}
