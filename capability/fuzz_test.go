package capability_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tetherhq/tether/capability"
)

// fuzzFixture is deterministic — a fixed key, grants and clock — so the
// tokens it mints are byte-identical on every run and the committed corpus
// under testdata/fuzz/FuzzVerify holds tokens that are valid at fuzzNow.
type fuzzFixture struct {
	ring     capability.KeyRing
	verifier capability.Verifier
	valid    map[string]bool
}

var fuzzNow = t0.Add(time.Minute)

func newFuzzFixture(t tb) fuzzFixture {
	t.Helper()
	key, err := capability.NewSigningKey(bytes.NewReader(bytes.Repeat([]byte{7}, 32)), t0, t0)
	if err != nil {
		t.Fatal(err)
	}
	ring := capability.KeyRing{Keys: []capability.SigningKey{key}}
	tr := newGrantTree(t)
	minter := newMinter(t)
	valid := map[string]bool{}
	for _, g := range []capability.Grant{tr.root, tr.a, tr.a1, tr.a1x, tr.b} {
		token, _, err := minter.Mint(ring, g, t0, 0)
		if err != nil {
			t.Fatal(err)
		}
		valid[token] = true
	}
	return fuzzFixture{ring: ring, verifier: newVerifier(t), valid: valid}
}

// FuzzVerify: no input panics, every refusal wraps exactly one sentinel and
// does not quote the token, and nothing is accepted except the fixture's
// own tokens — not even a re-encoding of one.
func FuzzVerify(f *testing.F) {
	fx := newFuzzFixture(f)
	for token := range fx.valid {
		f.Add(token)
		parts := strings.Split(token, ".")
		f.Add(parts[0] + "." + parts[1] + ".")
		f.Add(parts[0] + ".." + parts[2])
		f.Add(`eyJhbGciOiJub25lIn0.` + parts[1] + ".")
	}
	f.Add("")
	f.Add("..")
	f.Add("a.b.c")
	f.Fuzz(func(t *testing.T, token string) {
		claims, err := fx.verifier.Verify(token, fx.ring, fuzzNow)
		if err == nil {
			if !fx.valid[token] {
				t.Fatalf("accepted a token the fixture never minted: %q", token)
			}
			if claims.GrantID == "" || claims.HolderNodeID == "" || len(claims.Scopes) == 0 {
				t.Fatalf("accepted token with empty claims %+v", claims)
			}
			return
		}
		assertExactlyOneSentinel(t, err)
		if len(token) >= 16 && strings.Contains(err.Error(), token) {
			t.Fatalf("error quotes the token: %v", err)
		}
	})
}

// FuzzScope: ValidateScope and Covers never panic; Covers is reflexive on
// valid scopes, holds only between valid scopes, and agrees with the
// independent regexp matcher for concrete children and with Subset and
// Allows.
func FuzzScope(f *testing.F) {
	for _, seed := range [][2]string{
		{"tool:*", "tool:shell"},
		{"tool:shell", "tool:*"},
		{"*", "*"},
		{"s3:read:bucket/prefix*", "s3:read:bucket/prefix/a"},
		{"tool:*:x", "tool:a:x"},
		{"a::b", "a"},
		{"", "x"},
	} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, parent, child string) {
		parentErr := capability.ValidateScope(parent)
		childErr := capability.ValidateScope(child)
		covers := capability.Covers(parent, child)
		if parentErr == nil && !capability.Covers(parent, parent) {
			t.Fatalf("Covers(%q, itself) is false", parent)
		}
		if covers && (parentErr != nil || childErr != nil) {
			t.Fatalf("Covers(%q, %q) holds for an invalid scope", parent, child)
		}
		if parentErr == nil && childErr == nil && !capability.IsPattern(child) {
			if want := naiveMatch(parent, child); covers != want {
				t.Fatalf("Covers(%q, %q) = %v, regexp match = %v", parent, child, covers, want)
			}
		}
		if _, ok := capability.Subset([]string{parent}, []string{child}); ok != covers {
			t.Fatalf("Subset disagrees with Covers for (%q, %q)", parent, child)
		}
		if capability.Allows([]string{parent}, child) != covers {
			t.Fatalf("Allows disagrees with Covers for (%q, %q)", parent, child)
		}
	})
}

// TestFuzzCorpusStaysValid keeps the committed corpus meaningful: its
// valid_* entries must still be tokens the fixture accepts, so the fuzzer
// mutates real tokens rather than stale ones.
func TestFuzzCorpusStaysValid(t *testing.T) {
	fx := newFuzzFixture(t)
	paths, err := filepath.Glob(filepath.Join("testdata", "fuzz", "FuzzVerify", "valid_*"))
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
		if !fx.valid[token] {
			t.Fatalf("%s is no longer a token the fixture mints; regenerate the corpus", path)
		}
		if _, err := fx.verifier.Verify(token, fx.ring, fuzzNow); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
	}
}
