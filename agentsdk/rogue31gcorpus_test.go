package agentsdk

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf16"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

var updateRogue31GCorpus = flag.Bool("rogue31g.update", false, "rewrite testdata/rogue31g_tokens.json")

// rogue31GCorpusPath is the crafted tokens the three SDKs' verifiers are
// held to the same verdicts on (agentsdk/typescript/test/rogue31g.test.ts,
// agentsdk/python/tests/test_rogue31g.py read it too).
var rogue31GCorpusPath = filepath.Join("testdata", "rogue31g_tokens.json")

// rogue31GCorpus is the file: a key set, the verifiers' clock and leeway,
// and each token with the verdict the control plane's check
// (capability.Verifier, which the Go verifier runs) gives it.
type rogue31GCorpus struct {
	Comment  string          `json:"comment"`
	JWKS     json.RawMessage `json:"jwks"`
	Issuer   string          `json:"issuer"`
	NowMs    int64           `json:"now_ms"`
	LeewayMs int64           `json:"leeway_ms"`
	Cases    []rogue31GCase  `json:"cases"`
}

type rogue31GCase struct {
	Name   string `json:"name"`
	Token  string `json:"token"`
	Accept bool   `json:"accept"`
	// For an accepted token: what every verifier must read from it.
	GrantID     string   `json:"grant_id,omitempty"`
	Chain       []string `json:"chain,omitempty"`
	Scopes      []string `json:"scopes,omitempty"`
	ExpiresAtMs int64    `json:"expires_at_ms,omitempty"`
}

// rogue31GKey is a fixed key, so that the corpus is the same every run
// (Ed25519 signatures are deterministic).
func rogue31GKey(t *testing.T) capability.SigningKey {
	t.Helper()
	key, err := capability.NewSigningKey(bytes.NewReader(bytes.Repeat([]byte{31}, ed25519.SeedSize)), t0, t0)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// signRaw signs header and payload bytes as they are: no encoder between
// the crafted JSON and the token.
func signRaw(key ed25519.PrivateKey, header, payload []byte) string {
	enc := base64.RawURLEncoding
	signing := enc.EncodeToString(header) + "." + enc.EncodeToString(payload)
	return signing + "." + enc.EncodeToString(ed25519.Sign(key, []byte(signing)))
}

// buildRogue31GCorpus crafts the tokens. T is the verifiers' second; their
// clock reads T + 0.5 s.
//
// The key set lists the corpus key, then a kid listed twice with two other
// keys (the thirty-second pass: Go read the first, TypeScript and Python
// the last; all now ignore such a kid). served is the ring the Go
// verifier's key server serves: the same keys.
func buildRogue31GCorpus(t *testing.T) (corpus rogue31GCorpus, served capability.KeyRing) {
	key := rogue31GKey(t)
	twice := func(seed byte) capability.SigningKey {
		k, err := capability.NewSigningKey(bytes.NewReader(bytes.Repeat([]byte{seed}, ed25519.SeedSize)), t0, t0)
		if err != nil {
			t.Fatal(err)
		}
		k.ID = "listed-twice"
		return k
	}
	first, last := twice(32), twice(33)
	served = capability.KeyRing{Keys: []capability.SigningKey{key, first, last}}
	var set struct {
		Keys []json.RawMessage `json:"keys"`
	}
	for _, k := range served.Keys {
		one, err := capability.KeyRing{Keys: []capability.SigningKey{k}}.JWKS()
		if err != nil {
			t.Fatal(err)
		}
		var s struct {
			Keys []json.RawMessage `json:"keys"`
		}
		if err := json.Unmarshal(one, &s); err != nil {
			t.Fatal(err)
		}
		set.Keys = append(set.Keys, s.Keys...)
	}
	jwks, err := json.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	T := t0.Unix()
	header := fmt.Sprintf(`{"alg":"EdDSA","kid":%q,"typ":"JWT"}`, key.ID)
	// claims returns the claims Mint writes with some replaced (a value
	// of "" drops the claim): each value is raw JSON.
	claims := func(replace ...string) string {
		fields := []string{
			"iss", `"tether"`, "sub", `"n_child"`, "aud", `["tether-tools"]`,
			"exp", fmt.Sprint(T + 300), "nbf", fmt.Sprint(T), "iat", fmt.Sprint(T),
			"jti", `"g_child"`, "chain", `["g_root"]`, "scopes", `["tool:shell"]`,
		}
		for i := 0; i < len(replace); i += 2 {
			found := false
			for j := 0; j < len(fields); j += 2 {
				if fields[j] == replace[i] {
					fields[j+1], found = replace[i+1], true
				}
			}
			if !found {
				fields = append(fields, replace[i], replace[i+1])
			}
		}
		var b strings.Builder
		b.WriteByte('{')
		for j := 0; j < len(fields); j += 2 {
			if fields[j+1] == "" {
				continue
			}
			if b.Len() > 1 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "%q:%s", fields[j], fields[j+1])
		}
		b.WriteByte('}')
		return b.String()
	}
	sec := func(offset float64) string { return fmt.Sprint(float64(T) + offset) }
	bom := "\xef\xbb\xbf"
	utf16le := func(s string) string {
		var b []byte
		for _, u := range utf16.Encode([]rune(s)) {
			b = append(b, byte(u), byte(u>>8))
		}
		return string(b)
	}
	// malleated adds the group order to a signature's S: the same
	// signature to a lax verifier, another spelling of the token.
	malleated := func(token string) string {
		dot := strings.LastIndexByte(token, '.')
		sig, err := base64.RawURLEncoding.DecodeString(token[dot+1:])
		if err != nil {
			t.Fatal(err)
		}
		s := new(big.Int).SetBytes(reverse(sig[32:]))
		l, _ := new(big.Int).SetString("7237005577332262213973186563042994240857116359379907606001950938285454250989", 10)
		s.Add(s, l)
		sb := s.FillBytes(make([]byte, 32))
		return token[:dot+1] + base64.RawURLEncoding.EncodeToString(append(slices.Clone(sig[:32]), reverse(sb)...))
	}
	// nested is a value of depth n: arrays in arrays, an object inside.
	nested := func(n int) string {
		return strings.Repeat("[", n-1) + `{"y":1}` + strings.Repeat("]", n-1)
	}
	type craft struct {
		name, header, payload string
		accept                bool
	}
	crafts := []craft{
		{"as minted", header, claims(), true},
		{"aud as one string", header, claims("aud", `"tether-tools"`), true},
		{"aud naming another audience too", header, claims("aud", `["tether-agent","tether-tools"]`), true},
		{"claims the verifier ignores", header, claims("role", `"admin"`, "x", `{"y":[1,2.5,null,true]}`, "big", "1e400"), true},
		{"kid named twice, the last one good", fmt.Sprintf(`{"alg":"EdDSA","kid":"made-up","kid":%q}`, key.ID), claims(), true},
		{"an embedded jwk header is ignored", fmt.Sprintf(`{"alg":"EdDSA","kid":%q,"jwk":{"kty":"OKP","crv":"Ed25519","x":"AAAA"}}`, key.ID), claims(), true},
		{"typ other than JWT", fmt.Sprintf(`{"alg":"EdDSA","kid":%q,"typ":"at+jwt"}`, key.ID), claims(), true},
		{"chain null", header, claims("chain", "null"), true},
		{"chain empty", header, claims("chain", "[]"), true},
		{"times in exponent form", header, claims("exp", fmt.Sprintf("%de0", T+300), "iat", fmt.Sprintf("%d.0E0", T)), true},
		{"whitespace between tokens", header, " \n" + strings.ReplaceAll(claims(), ",", " ,\t") + "\r\n", true},
		{"escaped strings", header, claims("jti", `"g_\u0063hild"`, "scopes", `["tool:\u0073hell"]`), true},
		{"exp passed within the leeway", header, claims("exp", fmt.Sprint(T-4), "nbf", fmt.Sprint(T-100), "iat", fmt.Sprint(T-100)), true},
		{"nbf ahead within the leeway", header, claims("nbf", fmt.Sprint(T+5)), true},
		{"fractional nbf ahead within the leeway once truncated", header, claims("nbf", sec(5.9)), true},
		{"fractional iat ahead within the leeway once truncated", header, claims("iat", sec(5.9)), true},
		{"lifetime of exactly the maximum", header, claims("exp", fmt.Sprint(T+900)), true},
		{"fractional lifetime of the maximum once truncated", header, claims("exp", sec(900.9)), true},
		{"duplicate scopes", header, claims("scopes", `["tool:shell","tool:shell"]`), true},
		{"nbf before any second of an int64", header, claims("nbf", "-1e300"), true},

		{"exp passed beyond the leeway", header, claims("exp", fmt.Sprint(T-5), "nbf", fmt.Sprint(T-100), "iat", fmt.Sprint(T-100)), false},
		{"fractional exp passed beyond the leeway once truncated", header, claims("exp", sec(-4.1), "nbf", fmt.Sprint(T-100), "iat", fmt.Sprint(T-100)), false},
		{"nbf ahead beyond the leeway", header, claims("nbf", fmt.Sprint(T+6)), false},
		{"iat ahead beyond the leeway", header, claims("iat", fmt.Sprint(T+6)), false},
		{"nbf the float just below 2^63 seconds", header, claims("nbf", "9223372036854774784"), false},
		{"iat before any second of an int64", header, claims("iat", "-1e300"), false},
		{"exp the float just below 2^63 seconds", header, claims("exp", "9223372036854774784"), false},
		{"exp before any second of an int64", header, claims("exp", "-1e300"), false},
		{"lifetime over the maximum", header, claims("exp", fmt.Sprint(T+901)), false},
		{"aud with a number beside the audience", header, claims("aud", `["tether-tools",7]`), false},
		{"aud with null beside the audience", header, claims("aud", `["tether-tools",null]`), false},
		{"aud another audience", header, claims("aud", `["tether-agent"]`), false},
		{"aud missing", header, claims("aud", ""), false},
		{"iss another issuer", header, claims("iss", `"tether2"`), false},
		{"iss missing", header, claims("iss", ""), false},
		{"exp missing", header, claims("exp", ""), false},
		{"exp null", header, claims("exp", "null"), false},
		{"exp a string", header, claims("exp", fmt.Sprintf(`"%d"`, T+300)), false},
		{"exp true", header, claims("exp", "true"), false},
		{"exp an integer past any float", header, claims("exp", "1"+strings.Repeat("0", 400)), false},
		{"exp a float overflowing", header, claims("exp", "1e400"), false},
		{"exp NaN", header, claims("exp", "NaN"), false},
		{"an ignored claim Infinity", header, claims("x", "Infinity"), false},
		{"iat missing", header, claims("iat", ""), false},
		{"nbf missing", header, claims("nbf", ""), false},
		{"sub missing", header, claims("sub", ""), false},
		{"jti a number", header, claims("jti", "7"), false},
		{"jti non-ASCII", header, claims("jti", `"g_chïld"`), false},
		{"jti an escaped non-ASCII", header, claims("jti", `"g_ch\u00efld"`), false},
		{"chain holding the grant", header, claims("chain", `["g_root","g_child"]`), false},
		{"chain repeating a grant", header, claims("chain", `["g_root","g_root"]`), false},
		{"chain a string", header, claims("chain", `"g_root"`), false},
		{"scopes empty", header, claims("scopes", "[]"), false},
		{"scopes missing", header, claims("scopes", ""), false},
		{"scope with an inner wildcard", header, claims("scopes", `["tool:*:x"]`), false},
		{"scope with a space", header, claims("scopes", `["tool: shell"]`), false},
		{"scope non-ASCII escaped", header, claims("scopes", `["tool:sh\u00e9ll"]`), false},
		{"scope a number", header, claims("scopes", `["tool:shell",1]`), false},
		{"claims with trailing data", header, claims() + "x", false},
		{"claims twice", header, claims() + claims(), false},
		{"claims an array", header, "[" + claims() + "]", false},
		{"claims after a byte-order mark", header, bom + claims(), false},
		{"claims in UTF-16", header, utf16le(claims()), false},
		{"header after a byte-order mark", bom + header, claims(), false},
		{"header in UTF-16", utf16le(header), claims(), false},
		{"header with crit", fmt.Sprintf(`{"alg":"EdDSA","kid":%q,"crit":[]}`, key.ID), claims(), false},
		{"header with Infinity", fmt.Sprintf(`{"alg":"EdDSA","kid":%q,"x":Infinity}`, key.ID), claims(), false},
		{"alg none", fmt.Sprintf(`{"alg":"none","kid":%q}`, key.ID), claims(), false},
		{"alg lower case", fmt.Sprintf(`{"alg":"eddsa","kid":%q}`, key.ID), claims(), false},
		{"alg named twice, the last one bad", fmt.Sprintf(`{"alg":"EdDSA","alg":"HS256","kid":%q}`, key.ID), claims(), false},
		// The thirty-second pass: a known claim named twice or in another
		// case read differently per SDK (encoding/json matches names
		// case-insensitively, keeping the last); all refuse it now.
		{"sub named twice", header, claims("sub", `"n_child","sub":"n_other"`), false},
		{"sub and SUB", header, claims("SUB", `"n_other"`), false},
		{"SUB alone", header, strings.Replace(claims(), `"sub"`, `"SUB"`, 1), false},
		{"sub with a long s", header, strings.Replace(claims(), `"sub"`, `"\u017fub"`, 1), false},
		{"scopes named twice, the last wider", header, claims("scopes", `["tool:shell"],"scopes":["tool:*"]`), false},
		{"Scopes beside scopes", header, claims("Scopes", `["tool:*"]`), false},
		{"exp in upper case beside exp", header, claims("EXP", fmt.Sprint(T+800)), false},
		{"jti escaped beside jti", header, claims("jti", `"g_child","j\u0074i":"g_other"`), false},
		{"scopes with a long s beside scopes", header, claims("scopes", `["tool:shell"],"ſcopes":["tool:*"]`), false},
		{"an ignored claim named twice", header, claims("x", `1,"x":2`), true},
		{"an ignored claim in two cases", header, claims("role", `"a","ROLE":"b"`), true},
		{"a known name nested in an ignored claim twice", header, claims("x", `{"sub":"a","SUB":"b","sub":"c"}`), true},
		// The thirty-second pass: Python refused claims nested past its
		// recursion limit, Go and TypeScript accepted them; all bound the
		// nesting of header and claims at capability.MaxJSONDepth.
		{"claims nested to the bound", header, claims("x", nested(capability.MaxJSONDepth-1)), true},
		{"claims nested past the bound", header, claims("x", nested(capability.MaxJSONDepth)), false},
		{"claims nested past Python's recursion", header, claims("x", nested(1500)), false},
		{"brackets in a string do not nest", header, claims("x", `"`+strings.Repeat("[{", 100)+`"`), true},
		{"header nested to the bound", fmt.Sprintf(`{"alg":"EdDSA","kid":%q,"x":%s}`, key.ID, nested(capability.MaxJSONDepth-1)), claims(), true},
		{"header nested past the bound", fmt.Sprintf(`{"alg":"EdDSA","kid":%q,"x":%s}`, key.ID, nested(capability.MaxJSONDepth)), claims(), false},
		{"header nested past Python's recursion", fmt.Sprintf(`{"alg":"EdDSA","kid":%q,"x":%s}`, key.ID, nested(1500)), claims(), false},
		{"kid unknown", `{"alg":"EdDSA","kid":"made-up"}`, claims(), false},
		{"kid a number", `{"alg":"EdDSA","kid":7}`, claims(), false},
	}
	corpus = rogue31GCorpus{
		Comment: "Generated by go test ./agentsdk -run TestRogue31GTheVerifiersAgreeOnCraftedTokens -rogue31g.update: " +
			"crafted tokens signed by the key of jwks, and the verdict of the control plane's check at now_ms with leeway_ms.",
		JWKS: jwks, Issuer: "tether", NowMs: t0.Add(500 * time.Millisecond).UnixMilli(), LeewayMs: capability.DefaultLeeway.Milliseconds(),
	}
	for _, c := range crafts {
		corpus.Cases = append(corpus.Cases, rogue31GCase{Name: c.name, Token: signRaw(key.Private, []byte(c.header), []byte(c.payload)), Accept: c.accept})
	}
	minted := corpus.Cases[0].Token
	twiceHeader := `{"alg":"EdDSA","kid":"listed-twice","typ":"JWT"}`
	corpus.Cases = append(corpus.Cases,
		rogue31GCase{Name: "signature with S + L", Token: malleated(minted)},
		rogue31GCase{Name: "signature of another token", Token: minted[:strings.LastIndexByte(minted, '.')+1] + corpus.Cases[1].Token[strings.LastIndexByte(corpus.Cases[1].Token, '.')+1:]},
		rogue31GCase{Name: "kid listed twice in the key set, signed by its first key", Token: signRaw(first.Private, []byte(twiceHeader), []byte(claims()))},
		rogue31GCase{Name: "kid listed twice in the key set, signed by its last key", Token: signRaw(last.Private, []byte(twiceHeader), []byte(claims()))},
	)
	return corpus, served
}

func reverse(b []byte) []byte {
	out := slices.Clone(b)
	slices.Reverse(out)
	return out
}

// The same crafted tokens through the Go verifier give the control
// plane's verdicts (capability.Verifier, which it runs, is the control
// plane's check), and the file the TypeScript and Python verifiers are
// held to is these tokens with these verdicts.
func TestRogue31GTheVerifiersAgreeOnCraftedTokens(t *testing.T) {
	corpus, served := buildRogue31GCorpus(t)
	keys := newKeyServer(t, served)
	now := time.UnixMilli(corpus.NowMs).UTC()
	v := newTestVerifier(t, keys, clock.NewManual(now))
	if err := v.jwks.refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	apply(t, v, &tetherv1.WatchRevocationsResponse{})
	for i := range corpus.Cases {
		c := &corpus.Cases[i]
		claims, err := v.Verify(context.Background(), c.Token)
		if (err == nil) != c.Accept {
			t.Errorf("%s: Go verifier: %v, want accepted %v", c.Name, err, c.Accept)
			continue
		}
		if err == nil {
			c.GrantID, c.Chain, c.Scopes, c.ExpiresAtMs = claims.GrantID, claims.Chain, claims.Scopes, claims.ExpiresAt.UnixMilli()
		}
	}
	out, err := json.MarshalIndent(corpus, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	out = append(out, '\n')
	if *updateRogue31GCorpus {
		if err := os.WriteFile(rogue31GCorpusPath, out, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	stored, err := os.ReadFile(rogue31GCorpusPath)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(stored, out) {
		t.Fatalf("%s is not what the Go verifier says of these tokens: run with -rogue31g.update if the change is meant", rogue31GCorpusPath)
	}
}
