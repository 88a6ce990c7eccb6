package capability

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// mintedClaims is the claims JSON of a token as Mint writes it.
func mintedClaims(t testing.TB, scopes ...string) []byte {
	t.Helper()
	now := time.Date(2026, 3, 14, 9, 0, 0, 0, time.UTC)
	raw, err := json.Marshal(capabilityClaims{
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer: "tether", Subject: "n_worker", Audience: jwt.ClaimStrings{"tether-tools"},
			ExpiresAt: jwt.NewNumericDate(now.Add(5 * time.Minute)), NotBefore: jwt.NewNumericDate(now), IssuedAt: jwt.NewNumericDate(now),
			ID: "g_leaf",
		},
		Chain: []string{"g_root", "g_planner", "g_worker"}, Scopes: scopes,
	})
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// The claims Mint writes take the fast path, and decode as encoding/json
// decodes them.
func TestMintedClaimsTakeThePlainPath(t *testing.T) {
	raw := mintedClaims(t, "tool:shell", "s3:read:logs/*")
	var fast receivedClaims
	if !fast.decodePlain(raw) {
		t.Fatalf("the claims Mint writes missed the fast path: %s", raw)
	}
	type reflected receivedClaims
	var want reflected
	if err := json.Unmarshal(raw, &want); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(fast, receivedClaims(want)) {
		t.Fatalf("fast path %+v\nencoding/json %+v", fast, want)
	}
	// encoding/json escapes & < > when it writes: such a scope takes the
	// slow path and still decodes.
	escaped := mintedClaims(t, "tool:a&b")
	if !strings.Contains(string(escaped), `\u0026`) {
		t.Fatalf("expected an escape in %s", escaped)
	}
	var got receivedClaims
	if got.decodePlain(escaped) {
		t.Fatal("an escaped string took the fast path")
	}
	if err := json.Unmarshal(escaped, &got); err != nil || got.Scopes[0] != "tool:a&b" {
		t.Fatalf("escaped scope decoded as %q (%v)", got.Scopes, err)
	}
}

// FuzzReceivedClaims checks that decoding claims through the fast path
// gives exactly what encoding/json gives — the same error-or-not, the same
// values — for any input whose known claim names are each exactly spelled
// once (checkClaimNames refuses the others, whichever path).
func FuzzReceivedClaims(f *testing.F) {
	minted := mintedClaims(f, "tool:shell")
	for _, seed := range []string{
		string(minted),
		string(mintedClaims(f, "tool:a&b")),
		`{}`, `null`, `[]`, `{"iss":"tether"`, ` { "iss" : "tether" , "aud" : "x" } `,
		`{"iss":"a","iss":"b"}`, `{"ISS":"a"}`, `{"iss":"a","ISS":"b"}`, `{"unknown":1,"iss":"a"}`,
		`{"aud":[]}`, `{"aud":null}`, `{"aud":["a",1]}`, `{"aud":"a"}`, `{"chain":null}`, `{"chain":[]}`, `{"scopes":["a","b"]}`,
		`{"exp":1.5}`, `{"exp":-0}`, `{"exp":1e400}`, `{"exp":"123"}`, `{"exp":null}`, `{"exp":01}`, `{"exp":1.}`, `{"exp":1e}`, `{"exp":-}`,
		`{"jti":"g\u0041"}`, `{"jti":"g` + "\x7f" + `"}`, `{"jti":"g` + "\xff" + `"}`, `{"sub":"a\"b"}`, "{\"iss\":\"a\"}\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var got receivedClaims
		errGot := json.Unmarshal(data, &got)
		type reflected receivedClaims
		var want reflected
		errWant := checkClaimNames(data)
		if errWant == nil {
			errWant = json.Unmarshal(data, &want)
		}
		if (errGot == nil) != (errWant == nil) {
			t.Fatalf("input %q: fast path error %v, encoding/json error %v", data, errGot, errWant)
		}
		if errGot == nil && !reflect.DeepEqual(got, receivedClaims(want)) {
			t.Fatalf("input %q:\nfast path     %+v\nencoding/json %+v", data, got, want)
		}
	})
}
